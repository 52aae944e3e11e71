package order

import (
	"context"
	"errors"
	"math/rand/v2"
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

// reserveTx takes qty of every SKU in want from available, conditionally: one
// UPDATE per SKU, refused with errRefused when on_hand - reserved cannot
// cover it (stock.ErrUnknownSKU when there is no such SKU). SKUs are locked in
// sorted order, so concurrent writers never deadlock.
func reserveTx(tx *gorm.DB, want map[string]int64) (map[string]mark, error) {
	skus := sortedKeys(want)
	for _, sku := range skus {
		res := tx.Exec(`UPDATE skus SET reserved = reserved + ?, seq = seq + 1
			WHERE sku = ? AND (on_hand = -1 OR on_hand - reserved >= ?)`, want[sku], sku, want[sku])
		if res.Error != nil {
			return nil, res.Error
		}
		if res.RowsAffected == 0 {
			if ok, err := skuExists(tx, sku); err != nil || !ok {
				return nil, errors.Join(err, unknownSKU(sku))
			}
			return nil, errRefused{sku}
		}
	}
	return readMarks(tx, skus)
}

// unreserveTx gives back qty of every SKU in give (a release): reserved goes
// down, available up.
func unreserveTx(tx *gorm.DB, give map[string]int64) (map[string]mark, error) {
	skus := sortedKeys(give)
	for _, sku := range skus {
		if err := tx.Exec(`UPDATE skus SET reserved = reserved - ?, seq = seq + 1 WHERE sku = ?`,
			give[sku], sku).Error; err != nil {
			return nil, err
		}
	}
	return readMarks(tx, skus)
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

// releaseTx releases token's HELD reservations (all its SKUs, or only sku)
// and gives their units back in the database, with what they counted
// against their buyers' limits. A reservation that is not HELD is left
// alone, so two releases racing give back once.
func releaseTx(tx *gorm.DB, token, sku string) (release, error) {
	q := tx.Model(&Reservation{}).Where("token = ?", token) // by primary key; the state is checked below
	if sku != "" {
		q = q.Where("sku = ?", sku)
	}
	var rows []Reservation
	if err := q.Order("sku").Find(&rows).Error; err != nil {
		return release{}, err
	}
	give := map[string]int64{}
	var released []Reservation
	for _, r := range rows {
		if r.State != Held {
			continue
		}
		res := tx.Model(&Reservation{}).Where("token = ? AND sku = ? AND state = ?", r.Token, r.SKU, Held).
			Update("state", Released)
		if res.Error != nil {
			return release{}, res.Error
		}
		if res.RowsAffected == 1 && r.Qty > 0 {
			give[r.SKU] += r.Qty
			released = append(released, r)
		}
	}
	if len(give) == 0 {
		return release{units: give}, nil
	}
	marks, err := unreserveTx(tx, give)
	if err != nil {
		return release{}, err
	}
	if err := insertMovements(tx, reservationMovements(released, MoveRelease, -1)); err != nil {
		return release{}, err
	}
	quotas, err := giveQuotaTx(tx, released)
	if err != nil {
		return release{}, err
	}
	return release{changes: changes(give, marks, 1), units: give, quotas: quotas}, nil
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

// InitFunc is the stock.InitFunc over db: it numbers a new Redis epoch for
// sku, reads on_hand - reserved and the seq, and lets Redis be written while
// the row is locked. Its cost is one row, whatever the SKU's history. The
// epoch is committed even when the Redis write fails, so an epoch is never
// used twice.
func InitFunc(db *gorm.DB) stock.InitFunc {
	return func(ctx context.Context, sku string, write func(stock.Level) error) error {
		var werr error
		err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			epoch := 1 + rand.Int64N(1<<52) // exact in a Lua number
			res := tx.Exec(`UPDATE skus SET redis_epoch = ? WHERE sku = ?`, epoch, sku)
			if res.Error != nil {
				return res.Error
			}
			var rows []struct {
				OnHand, Reserved, Seq int64
			}
			if err := tx.Raw(`SELECT on_hand, reserved, seq FROM skus WHERE sku = ?`, sku).Scan(&rows).Error; err != nil {
				return err
			}
			if len(rows) == 0 {
				return stock.ErrUnknownSKU
			}
			lv := stock.Level{Available: rows[0].OnHand - rows[0].Reserved, Epoch: epoch, Seq: rows[0].Seq}
			if rows[0].OnHand == stock.Unlimited {
				lv.Available = stock.Unlimited
			}
			werr = write(lv)
			return nil
		})
		return errors.Join(err, werr)
	}
}
