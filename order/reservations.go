package order

import (
	"context"
	"errors"
	"slices"
	"time"

	"gorm.io/gorm"

	"github.com/acme/inventory/stock"
)

// ResState is a reservation's state. A reservation resolves at most once:
//
//	HELD -> COMMITTED -> SOLD   (paid; the ordered MQ deducted on_hand)
//	SOLD -> RESTORED            (refunded; the ordered MQ gave the units back)
//	HELD -> RELEASED            (cancel, timeout, release)
//
// The state is never pruned: it is what says whether a deduction or a
// restore was applied, however late a duplicate arrives.
//
// HELD and COMMITTED rows are live: skus.reserved is the sum of their qty.
type ResState string

const (
	Held      ResState = "HELD"
	Committed ResState = "COMMITTED"
	Sold      ResState = "SOLD"
	Restored  ResState = "RESTORED"
	Released  ResState = "RELEASED"
)

// Reservation is one arbitrated reservation: an order line, or a raw
// reservation of the token API (Token "t." + the client's token, OrderID nil).
type Reservation struct {
	Token   string  `gorm:"primaryKey"`
	SKU     string  `gorm:"primaryKey;column:sku"`
	OrderID *string `gorm:"column:order_id"`
	// Buyer is the user this reservation counts against in buyer_quotas
	// (nil: it does not count).
	Buyer     *string  `gorm:"column:buyer"`
	Qty       int64    `gorm:"column:qty"`
	State     ResState `gorm:"column:state"`
	Result    int64    `gorm:"column:result"`
	ExpiresAt time.Time
	CreatedAt time.Time
	UpdatedAt time.Time
}

func (Reservation) TableName() string { return "stock_reservations" }

// errRefused: the database cannot cover a reservation of sku (Redis admitted
// it wrongly). Callers turn it into stock.ErrInsufficientStock.
type errRefused struct{ sku string }

func (e errRefused) Error() string { return "order: the database refused a reservation of " + e.sku }

// mark is where a SKU's change of available units landed: its seq, and the
// Redis epoch the database knew then.
type mark struct {
	seq, epoch int64
}

func readMarks(tx *gorm.DB, skus []string) (map[string]mark, error) {
	var rows []struct {
		SKU        string `gorm:"column:sku"`
		Seq        int64
		RedisEpoch int64
	}
	if err := tx.Raw(`SELECT sku, seq, redis_epoch FROM skus WHERE sku IN ?`, skus).Scan(&rows).Error; err != nil {
		return nil, err
	}
	out := make(map[string]mark, len(rows))
	for _, r := range rows {
		out[r.SKU] = mark{seq: r.Seq, epoch: r.RedisEpoch}
	}
	return out, nil
}

func skuExists(tx *gorm.DB, sku string) (bool, error) {
	var n int64
	err := tx.Table("skus").Where("sku = ?", sku).Count(&n).Error
	return n == 1, err
}

func sortedKeys(m map[string]int64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// release is what a release gave back: the changes for Redis, the units per
// SKU, and the units given back to buyers' per-user limits.
type release struct {
	changes []stock.Change
	units   map[string]int64
	quotas  []buyerUnits
}

// changes turns per-SKU quantities and their marks into Redis changes of
// sign * qty.
func changes(qty map[string]int64, marks map[string]mark, sign int64) []stock.Change {
	out := make([]stock.Change, 0, len(qty))
	for _, sku := range sortedKeys(qty) {
		out = append(out, stock.Change{SKU: sku, Delta: sign * qty[sku], Seq: marks[sku].seq})
	}
	return out
}

// apply brings committed changes into Redis. A failure leaves Redis wrong in
// the safe direction or for the realign to fix, so it is logged, not returned.
// ApplyChanges brings changes the database committed into Redis (the
// Applier's OnApplied for restores).
func (s *Service) ApplyChanges(ctx context.Context, chs []stock.Change) {
	for _, c := range chs {
		if err := s.stock.Apply(context.WithoutCancel(ctx), c); err != nil {
			s.cfg.Logger.Warn("order: bringing a committed change into Redis failed; the realign repairs it",
				"sku", c.SKU, "delta", c.Delta, "err", err)
		}
	}
}

// InitFunc is the stock.InitFunc over db: the arbiter numbers a new Redis
// epoch for sku and reads on_hand - reserved and the seq, and Redis is
// written while the row is locked. Its cost is one row, whatever the SKU's
// history. The epoch is committed even when the Redis write fails, so an
// epoch is never used twice.
func InitFunc(db *gorm.DB) stock.InitFunc {
	return func(ctx context.Context, sku string, write func(stock.Level) error) error {
		var werr error
		err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			lv, err := arbiterIn(tx).newEpoch(sku)
			if err != nil {
				return err
			}
			werr = write(lv)
			return nil
		})
		return errors.Join(err, werr)
	}
}
