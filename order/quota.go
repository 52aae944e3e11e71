package order

import (
	"fmt"
	"slices"
	"strings"

	"gorm.io/gorm"
)

// The per-user limit is arbitrated like stock: buyer_quotas holds what each
// buyer holds or bought of each limited SKU, and a reservation counts there
// in the transaction that records it, under a conditional increment. Redis
// only pre-filters seckill buyers (stock.TakeQuota) and may forget; the
// database does not. A release (cancel, timeout) gives the units back.

// errOverLimit: the reservation would take a buyer past the SKU's per-user
// limit. It is a conflict.
type errOverLimit struct {
	sku, user string
	limit     int64
}

func (e errOverLimit) Error() string {
	return fmt.Sprintf("buyer %s reached the per-user limit of %d for %s", e.user, e.limit, e.sku)
}

func (e errOverLimit) Unwrap() error { return ErrConflict }

// buyerUnits is a quantity of sku counted against user's limit.
type buyerUnits struct {
	sku, user string
	qty       int64
}

// countBuyers marks the batch's order reservations of SKUs that have a
// per-user limit as counting against the order's buyer (Reservation.Buyer),
// and returns what each buyer takes of each SKU with its limit. One read of
// the batch's SKUs, only when the batch holds orders.
func countBuyers(tx *gorm.DB, batch []*writeReq) ([]buyerUnits, map[string]int64, error) {
	var skus []string
	for _, r := range batch {
		if r.order != nil {
			for i := range r.rows {
				r.rows[i].Buyer = nil // a batch written again request by request is marked again
				skus = append(skus, r.rows[i].SKU)
			}
		}
	}
	if len(skus) == 0 {
		return nil, nil, nil
	}
	slices.Sort(skus)
	var rows []struct {
		SKU          string `gorm:"column:sku"`
		PerUserLimit int64
	}
	if err := tx.Raw(`SELECT sku, per_user_limit FROM skus WHERE sku IN ? AND per_user_limit > 0`,
		slices.Compact(skus)).Scan(&rows).Error; err != nil {
		return nil, nil, err
	}
	if len(rows) == 0 {
		return nil, nil, nil
	}
	limits := make(map[string]int64, len(rows))
	for _, r := range rows {
		limits[r.SKU] = r.PerUserLimit
	}
	sum := map[buyerUnits]int64{}
	for _, r := range batch {
		if r.order == nil {
			continue
		}
		for i := range r.rows {
			row := &r.rows[i]
			if limits[row.SKU] > 0 {
				row.Buyer = &r.order.UserID
				sum[buyerUnits{sku: row.SKU, user: r.order.UserID}] += row.Qty
			}
		}
	}
	out := make([]buyerUnits, 0, len(sum))
	for k, q := range sum {
		k.qty = q
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b buyerUnits) int {
		return strings.Compare(a.sku+"\x00"+a.user, b.sku+"\x00"+b.user)
	})
	return out, limits, nil
}

// takeQuotaTx counts each buyer's units, conditionally: refused with
// errOverLimit when a buyer would pass the SKU's limit. One upsert per
// (SKU, buyer), in sorted order; the row is created at the first purchase.
func takeQuotaTx(tx *gorm.DB, take []buyerUnits, limits map[string]int64) error {
	upsert := `INSERT INTO buyer_quotas (sku, user_id, qty) VALUES (?, ?, ?)
		ON DUPLICATE KEY UPDATE qty = IF(qty + VALUES(qty) <= ?, qty + VALUES(qty), qty)`
	if tx.Dialector.Name() == "sqlite" {
		upsert = `INSERT INTO buyer_quotas (sku, user_id, qty) VALUES (?, ?, ?)
			ON CONFLICT (sku, user_id) DO UPDATE SET qty = qty + excluded.qty WHERE qty + excluded.qty <= ?`
	}
	for _, b := range take {
		limit := limits[b.sku]
		if b.qty > limit {
			return errOverLimit{b.sku, b.user, limit}
		}
		res := tx.Exec(upsert, b.sku, b.user, b.qty, limit)
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected == 0 { // the row exists and stayed as it was
			return errOverLimit{b.sku, b.user, limit}
		}
	}
	return nil
}

// giveQuotaTx gives back what released reservations counted against their
// buyers, and returns it (Redis's pre-filter is told after commit).
func giveQuotaTx(tx *gorm.DB, released []Reservation) ([]buyerUnits, error) {
	var out []buyerUnits
	for _, r := range released {
		if r.Buyer == nil || r.Qty == 0 {
			continue
		}
		if err := tx.Exec(`UPDATE buyer_quotas SET qty = qty - ? WHERE sku = ? AND user_id = ?`,
			r.Qty, r.SKU, *r.Buyer).Error; err != nil {
			return nil, err
		}
		out = append(out, buyerUnits{sku: r.SKU, user: *r.Buyer, qty: r.Qty})
	}
	return out, nil
}
