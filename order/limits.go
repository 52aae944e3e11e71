package order

import (
	"context"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/breaker"
)

// limitTTL is how long a SKU's per-user limit read for seckills is used
// before it is read again.
const limitTTL = 5 * time.Second

// limits are the SKUs' per-user limits a seckill admits under, cached for
// limitTTL so the hot path does not read the database per request: the
// database counts the limit again as it records the sale, so a stale
// limit only loosens or tightens Redis's pre-filter for a few seconds
// (and Forget makes this node's change of a limit take at once).
type limits struct {
	db  *gorm.DB
	now func() time.Time
	m   *sync.Map // sku -> cachedLimit
}

type cachedLimit struct {
	limit int64
	until time.Time
}

// of is sku's per-user limit (0: none); inventory.ErrUnknownSKU when it
// does not exist.
func (l limits) of(ctx context.Context, sku string) (int64, error) {
	now := l.now()
	if v, ok := l.m.Load(sku); ok && now.Before(v.(cachedLimit).until) {
		return v.(cachedLimit).limit, nil
	}
	var rows []int64
	err := l.db.WithContext(ctx).Model(&arbiter.SKU{}).Where("sku = ?", sku).Pluck("per_user_limit", &rows).Error
	if v, ok := l.m.Load(sku); ok && breaker.Unreachable(err) {
		// The database is out of reach: the last limit read stands, so a
		// sold-out SKU is still answered 409 by Redis (and nothing can be
		// recorded meanwhile anyway).
		return v.(cachedLimit).limit, nil
	}
	if err != nil {
		return 0, err
	}
	if len(rows) == 0 {
		return 0, inventory.UnknownSKU(sku)
	}
	l.m.Store(sku, cachedLimit{limit: rows[0], until: now.Add(limitTTL)})
	return rows[0], nil
}

// LimitChanged drops sku's cached per-user limit: this node changed it,
// and its next seckill reads the new one.
func (s *Service) LimitChanged(sku string) { s.limits.m.Delete(sku) }
