package order

import (
	"context"
	"errors"

	"gorm.io/gorm"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
)

// Every path that reads or changes one order goes through projected or
// readProjected, so an order is found the moment its sale committed,
// whether the projector has written it or not (docs/design.md "The lean
// sale").
//
// projected runs op on order id once id's projection exists: an order
// only the lean sale has recorded yet is projected first
// (arbiter.ProjectHold). Every change goes this way: the check is a plain
// read (a snapshot, no lock). A change whose first statement were a
// locking read of a missing order (pay, refund, ship lock the order) would
// lock the gap where the newest orders go in REPEATABLE READ, and every
// projection of a new order (UUIDv7 ids: they all go at the end of the
// index) would wait for it: payments right after their sale then queued
// behind each other for seconds. And a change that reads the order after
// its conditional UPDATE without a lock (cancel, expire), run first and
// again on ErrNotFound, could miss the order, read it projected meanwhile
// and answer a conflict it never had.
func projected(ctx context.Context, s *Service, id string, op func() (*Order, error)) (*Order, error) {
	var n int64
	if err := s.db.WithContext(ctx).Raw(`SELECT COUNT(*) FROM orders WHERE id = ?`, id).Scan(&n).Error; err != nil {
		return nil, err
	}
	if n == 0 {
		if err := s.projectOrder(ctx, id); err != nil {
			return nil, err
		}
	}
	return op()
}

// readProjected is projected for a read that takes no lock (get, and
// extend, which tells a miss after its UPDATE apart: errRaced): op first,
// and once more after projecting when it found no such order, which
// spares an order already projected the existence check. Once more
// whether projecting found a hold or not: between op's miss and it, the
// projector (or the sweep) may have projected the order and retention
// pruned its hold record (arbiter.PruneHolds), and the order is in the
// projection then.
func readProjected(ctx context.Context, s *Service, id string, op func() (*Order, error)) (*Order, error) {
	o, err := op()
	if !errors.Is(err, inventory.ErrNotFound) {
		return o, err
	}
	if err := s.projectOrder(ctx, id); err != nil {
		return nil, err
	}
	return op()
}

// projectOrder writes the projection of order id's lean hold, if it has
// one. It runs again when the database rolls it back as a deadlock's
// victim: it inserts the rows the projector and the sweep insert too.
func (s *Service) projectOrder(ctx context.Context, id string) error {
	return arbiter.Transact(ctx, s.db, func(tx *gorm.DB) error {
		_, err := arbiter.In(tx).ProjectHold(id, "", "")
		return err
	})
}
