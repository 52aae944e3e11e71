package arbiter

import (
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"
)

// What a stock count's rebase needs to know of an order line besides
// on_hand (stock_shipping, one row per sold or shipped order line): when
// its units left on_hand (sold_at: the consumer's SALE, stamped with the
// SALE movement's own created_at), when they left the warehouse
// (shipped_at: Ship, the order's ship route), and when a refund gave them
// back to on_hand (restored_at: the REFUND movement's created_at). At a
// count's counted_at T a line's units are on the shelf and missing from
// on_hand when sold before T and not shipped before T, and the other way
// round when shipped before T and sold after: unshipped(T) sums
// qty × ([sold_at < T] − [shipped_at < T]) over the rows not restored
// before T (ReadRebase). A line sold before this table existed has no row:
// it counts as shipped when sold, as a token-API sale does (the token API
// has no shipped signal).

// shippingChanges are the order lines one delivery of the consumer sold
// and gave back.
type shippingChanges struct{ sold, restored []Reservation }

// add notes reservation r's operation op, if r is an order's line.
func (s *shippingChanges) add(r Reservation, op Op) {
	if r.OrderID == nil {
		return // a token-API sale: no shipped signal
	}
	if op == OpDeduct {
		s.sold = append(s.sold, r)
	} else {
		s.restored = append(s.restored, r)
	}
}

// recordShipping stamps the lines a delivery sold with sold_at = at (a
// line shipped before its deduction has its row already) and the lines it
// gave back with restored_at = at: at is the delivery's SALE and REFUND
// movements' created_at, so a count compares both alike.
func (a Arbiter) recordShipping(s shippingChanges, at time.Time) error {
	if len(s.sold) > 0 {
		args := make([]any, 0, 4*len(s.sold))
		for _, r := range s.sold {
			args = append(args, r.Token, r.SKU, r.Qty, at)
		}
		if err := a.upsertShipping([]string{"token", "sku", "qty", "sold_at"}, args, "sold_at", false); err != nil {
			return err
		}
	}
	for _, r := range s.restored {
		if _, err := a.exec(`UPDATE stock_shipping SET restored_at = ? WHERE token = ? AND sku = ? AND restored_at IS NULL`,
			at, r.Token, r.SKU); err != nil {
			return err
		}
	}
	return nil
}

// upsertShipping inserts stock_shipping rows (cols, len(cols) args each),
// or sets set on the row that exists: always, or when keep only where it
// is NULL.
func (a Arbiter) upsertShipping(cols []string, args []any, set string, keep bool) error {
	one := "(" + placeholders(len(cols)) + ")"
	n := len(args) / len(cols)
	q := "INSERT INTO stock_shipping (" + joinCols(cols) + ") VALUES " + repeatJoin(one, n)
	switch {
	case a.dialect == "sqlite" && keep:
		q += fmt.Sprintf(" ON CONFLICT (token, sku) DO UPDATE SET %s = COALESCE(%s, excluded.%s)", set, set, set)
	case a.dialect == "sqlite":
		q += fmt.Sprintf(" ON CONFLICT (token, sku) DO UPDATE SET %s = excluded.%s", set, set)
	case keep:
		q += fmt.Sprintf(" ON DUPLICATE KEY UPDATE %s = COALESCE(%s, VALUES(%s))", set, set, set)
	default:
		q += fmt.Sprintf(" ON DUPLICATE KEY UPDATE %s = VALUES(%s)", set, set)
	}
	_, err := a.exec(q, args...)
	return err
}

// Ship records that the order lines reserved under token left the
// warehouse at at: those the consumer has not deducted yet (COMMITTED)
// get a row of their own, then every row of the token not shipped yet is
// stamped. In that order, a deduction committing meanwhile is never
// missed: a line still COMMITTED gets its row here (the consumer's upsert
// then waits for this transaction and keeps shipped_at), and one the
// consumer sold first has its row for the stamp. Shipping twice keeps the
// first time. The caller checks the order may be shipped (PAID), under its
// row lock.
func (a Arbiter) Ship(token string, at time.Time) error {
	insert := `INSERT INTO stock_shipping (token, sku, qty, shipped_at)
		SELECT token, sku, qty, ? FROM stock_reservations WHERE token = ? AND state = ?`
	if a.dialect == "sqlite" {
		insert = `INSERT OR IGNORE` + insert[len("INSERT"):]
	} else {
		insert = `INSERT IGNORE` + insert[len("INSERT"):]
	}
	if _, err := a.exec(insert, at, token, Committed); err != nil {
		return err
	}
	_, err := a.exec(`UPDATE stock_shipping SET shipped_at = ? WHERE token = ? AND shipped_at IS NULL`, at, token)
	return err
}

// PruneShipping deletes up to limit stock_shipping rows that no count the
// service accepts can read any more (sold and shipped before t, or given
// back before t: their units were on the shelf and in on_hand alike at
// every time since), and returns how many. Retention runs it with t its
// horizon, which is earlier than any count's counted_at
// (CountHorizon).
func PruneShipping(db *gorm.DB, t time.Time, limit int) (int64, error) {
	var keys []any
	for _, q := range []struct {
		text string
		args []any
	}{
		{`SELECT token, sku FROM stock_shipping WHERE shipped_at < ? AND sold_at < ? LIMIT ?`, []any{t, t, limit}},
		{`SELECT token, sku FROM stock_shipping WHERE restored_at < ? LIMIT ?`, []any{t, limit}},
	} {
		var rows []struct {
			Token string `gorm:"column:token"`
			SKU   string `gorm:"column:sku"`
		}
		if err := db.Raw(q.text, q.args...).Scan(&rows).Error; err != nil {
			return 0, err
		}
		for _, r := range rows {
			keys = append(keys, r.Token, r.SKU)
		}
	}
	if len(keys) == 0 {
		return 0, nil
	}
	// A row both queries found is deleted once.
	res := db.Exec(`DELETE FROM stock_shipping WHERE (token, sku) IN (`+repeatJoin("(?, ?)", len(keys)/2)+`)`, keys...)
	return res.RowsAffected, res.Error
}

// placeholders is n comma-separated "?".
func placeholders(n int) string { return repeatJoin("?", n) }

// repeatJoin is n copies of s, comma-separated.
func repeatJoin(s string, n int) string {
	if n <= 0 {
		return ""
	}
	return strings.Repeat(s+", ", n-1) + s
}

func joinCols(cols []string) string { return strings.Join(cols, ", ") }
