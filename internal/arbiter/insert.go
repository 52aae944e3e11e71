package arbiter

import (
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"
)

// InsertRows writes rows of table in one multi-row INSERT whose SQL is
// written here, not reflected by GORM field by field, which costs several
// times more per commit (BenchmarkOrdersInsert; docs/benchmarks.md has the
// figures). cols names the
// columns; args holds len(cols) values per row, in that order. It goes
// through tx.Exec, so GORM's callbacks, logging and error translation see it
// as any statement (Direct.InsertRows sends it past GORM).
func InsertRows(tx *gorm.DB, table string, cols []string, args []any) error {
	return In(tx).insertRows(table, cols, args)
}

func (a Arbiter) insertRows(table string, cols []string, args []any) error {
	if len(args) == 0 {
		return nil
	}
	one := "(" + strings.Repeat("?, ", len(cols)-1) + "?)"
	n := len(args) / len(cols)
	var b strings.Builder
	b.Grow(len(table) + 32 + 12*len(cols) + n*(len(one)+2))
	b.WriteString("INSERT INTO ")
	b.WriteString(table)
	b.WriteString(" (")
	b.WriteString(strings.Join(cols, ", "))
	b.WriteString(") VALUES ")
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(one)
	}
	_, err := a.exec(b.String(), args...)
	return err
}

// stamp is t, or now when t is zero: what GORM's Create put in a
// created_at or updated_at left unset.
func stamp(t, now time.Time) time.Time {
	if t.IsZero() {
		return now
	}
	return t
}

var reservationColumns = []string{"token", "sku", "order_id", "buyer", "qty", "state", "result", "expires_at", "created_at", "updated_at"}

// campaignReservationColumns are reservationColumns and campaign_id: a
// batch with no campaign sale keeps the statement it always had.
var campaignReservationColumns = append(slices.Clip(reservationColumns), "campaign_id")

// insertReservations writes rows in one multi-row INSERT.
func (a Arbiter) insertReservations(rows []Reservation) error {
	now := time.Now()
	cols := reservationColumns
	if slices.ContainsFunc(rows, func(r Reservation) bool { return r.CampaignID != nil }) {
		cols = campaignReservationColumns
	}
	args := make([]any, 0, len(rows)*len(cols))
	for _, r := range rows {
		args = append(args, r.Token, r.SKU, r.OrderID, r.Buyer, r.Qty, r.State, r.Result, r.ExpiresAt,
			stamp(r.CreatedAt, now), stamp(r.UpdatedAt, now))
		if len(cols) > len(reservationColumns) {
			args = append(args, r.CampaignID)
		}
	}
	return a.insertRows("stock_reservations", cols, args)
}

var movementColumns = []string{"sku", "position", "kind", "on_hand_delta", "reserved_delta", "reason", "reference", "created_at"}
