package order

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
)

// Ship records that paid order id's lines left the warehouse (the shipped
// signal a stock count reads: units paid and not shipped are on the shelf
// but no longer in on_hand). Only a PAID order ships; shipping it again
// answers it as it is and changes nothing (its first shipped_at stays). It
// is decided under the order's row lock, as a refund is: a refunded order
// cannot be shipped, and a shipped one refunds as any paid order.
//
// shipped_at is this node's clock, as the stock movements' created_at
// (not Config.Now): a count compares the two.
func (s *Service) Ship(ctx context.Context, id string) (*Order, error) {
	return projected(ctx, s, id, func() (*Order, error) { return s.ship0(ctx, id) })
}

// ship0 is Ship on the projection as it stands.
func (s *Service) ship0(ctx context.Context, id string) (*Order, error) {
	if err := inventory.ValidateOrderID("order id", id); err != nil {
		return nil, err
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	return s.inTx(ctx, func(tx *gorm.DB) (*Order, error) {
		o, err := s.get(tx, id, true)
		if err != nil {
			return nil, err
		}
		switch {
		case o.Status == Refunded:
			return nil, fmt.Errorf("%w: order %s is REFUNDED: a refunded order cannot be shipped", inventory.ErrConflict, id)
		case o.Status != Paid:
			return nil, fmt.Errorf("%w: order %s is %s: only a PAID order ships", inventory.ErrConflict, id, o.Status)
		case o.ShippedAt != nil:
			return o, nil // shipped before: a replay
		}
		if err := tx.Model(&Order{}).Where("id = ? AND status = ? AND shipped_at IS NULL", id, Paid).
			Updates(map[string]any{"shipped_at": now, "updated_at": now}).Error; err != nil {
			return nil, err
		}
		if err := arbiter.In(tx).Ship(o.ReservationToken, now); err != nil {
			return nil, err
		}
		o.ShippedAt, o.UpdatedAt = &now, now
		return o, nil
	})
}
