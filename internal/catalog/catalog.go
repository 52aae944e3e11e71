// Package catalog administers SKUs: creating one or setting its stock and
// per-user limit, adjusting its stock (restock, shrinkage, correction), and
// reading it with what Redis has. Each change is the arbiter's, in the
// database first, then brought into Redis, fenced by the SKU's seq.
package catalog

import (
	"context"
	"errors"
	"log/slog"
	"strings"

	"gorm.io/gorm"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/stock"
)

// SKUView is a SKU as operators see it: the database's quantity states and
// what Redis has. Version names its stock settings (see SKU.version).
type SKUView struct {
	SKU            string `json:"sku"`
	OnHand         int64  `json:"on_hand"`
	Reserved       int64  `json:"reserved"`
	Available      int64  `json:"available"`
	RedisAvailable int64  `json:"redis_available"`
	Unlimited      bool   `json:"unlimited"`
	PerUserLimit   int64  `json:"per_user_limit"`
	// LowStockThreshold is the available level at or below which the SKU
	// is announced low (sku.low_stock); 0 (left out of the answer): never.
	LowStockThreshold int64  `json:"low_stock_threshold,omitempty"`
	Version           string `json:"-"`
}

// Catalog administers SKUs. A change is written to the database first, under
// a condition that keeps reserved <= on_hand (the CHECK constraint backs it),
// and then brought into Redis, fenced by the SKU's seq.
type Catalog struct {
	db    *gorm.DB
	stock *stock.Store
	log   *slog.Logger
}

func New(db *gorm.DB, st *stock.Store, log *slog.Logger) *Catalog {
	if log == nil {
		log = slog.Default()
	}
	return &Catalog{db: db, stock: st, log: log}
}

// Put creates sku or sets its on_hand (Unlimited allowed) and per-user limit,
// with no low-stock threshold (PutSettings).
func (c *Catalog) Put(ctx context.Context, sku string, onHand, perUserLimit int64, ifMatch ...string) (*SKUView, error) {
	return c.PutSettings(ctx, sku, arbiter.Settings{OnHand: onHand, PerUserLimit: perUserLimit}, ifMatch...)
}

// PutSettings creates sku or sets its on_hand (Unlimited allowed), per-user
// limit and low-stock threshold (0: none). Setting on_hand below what is
// reserved is a conflict. With ifMatch, the SKU must exist with one of
// those versions (ErrPrecondition otherwise).
func (c *Catalog) PutSettings(ctx context.Context, sku string, s arbiter.Settings, ifMatch ...string) (*SKUView, error) {
	onHand, perUserLimit := s.OnHand, s.PerUserLimit
	if err := inventory.ValidateSKU(sku); err != nil {
		return nil, err
	}
	if onHand < inventory.Unlimited || onHand > arbiter.MaxStock {
		return nil, inventory.Invalidf("stock must be -1 (unlimited) or between 0 and %d", int64(arbiter.MaxStock))
	}
	if perUserLimit < 0 || perUserLimit > inventory.DefaultMaxQty {
		return nil, inventory.Invalidf("per_user_limit must be between 0 (none) and %d", inventory.DefaultMaxQty)
	}
	if s.LowStockThreshold < 0 || s.LowStockThreshold > arbiter.MaxStock {
		return nil, inventory.Invalidf("low_stock_threshold must be between 0 (none) and %d", int64(arbiter.MaxStock))
	}
	err := arbiter.Transact(ctx, c.db, func(tx *gorm.DB) error {
		return arbiter.In(tx).Set(sku, s, ifMatch)
	})
	if err != nil {
		return nil, err
	}
	c.log.Info("sku set", "sku", sku, "stock", onHand, "per_user_limit", perUserLimit, "low_stock_threshold", s.LowStockThreshold)
	// Set outright (perhaps between limited and unlimited): Redis takes the
	// database's value.
	if err := c.stock.Realign(context.WithoutCancel(ctx), sku); err != nil {
		c.log.Error("sku changed but Redis could not be realigned; the periodic realign retries", "sku", sku, "err", err)
	}
	return c.committedView(ctx, sku)
}

// Adjust adds delta to a limited SKU's on_hand (restock, shrinkage,
// correction); on_hand may not go below what is reserved. With a reference,
// it applies once per SKU: a retry (the same delta) is answered with the
// SKU as it stands and changes nothing, another delta under the same
// reference is a conflict. With ifMatch, the SKU must have one of those
// versions (ErrPrecondition otherwise; a retry under an applied reference
// is answered whatever the version, which its first application changed).
func (c *Catalog) Adjust(ctx context.Context, sku string, delta int64, reason, reference string, ifMatch ...string) (*SKUView, error) {
	if err := inventory.ValidateSKU(sku); err != nil {
		return nil, err
	}
	if delta == 0 || delta > arbiter.MaxStock || delta < -arbiter.MaxStock {
		return nil, inventory.Invalidf("delta must be non-zero and within ±%d", int64(arbiter.MaxStock))
	}
	reason = strings.TrimSpace(reason)
	if reason == "" || len(reason) > 200 {
		return nil, inventory.Invalidf("reason must be 1-200 characters")
	}
	if len(reference) > 128 {
		return nil, inventory.Invalidf("reference must be at most 128 characters")
	}
	var m map[string]arbiter.Fence
	replay := false
	err := arbiter.Transact(ctx, c.db, func(tx *gorm.DB) error {
		var err error
		m, replay, err = arbiter.In(tx).Restock(sku, delta, reason, reference, ifMatch)
		return err
	})
	if err != nil {
		return nil, err
	}
	if replay {
		c.log.Info("sku adjust replayed: its reference was applied before", "sku", sku, "delta", delta, "reference", reference)
		return c.committedView(ctx, sku)
	}
	c.log.Info("sku adjusted", "sku", sku, "delta", delta, "reason", reason, "reference", reference)
	if err := c.stock.Apply(context.WithoutCancel(ctx), inventory.Change{SKU: sku, Delta: delta, Seq: m[sku].Seq}); err != nil {
		c.log.Error("sku adjusted but Redis could not follow; the periodic realign repairs it", "sku", sku, "err", err)
	}
	return c.committedView(ctx, sku)
}

// committedView answers a change the database committed. Get initialises
// Redis if it lost the SKU, which can fail (another node's init holds the
// lock, Redis is down); returning that error would tell the caller the change
// failed, and a retried Adjust would apply it twice. So a Redis failure here
// is logged and the view shows the database's numbers, with redis_available
// the value Redis converges to.
func (c *Catalog) committedView(ctx context.Context, sku string) (*SKUView, error) {
	v, err := c.Get(ctx, sku)
	if err == nil {
		return v, nil
	}
	c.log.Error("sku changed but Redis could not be read; the next init or realign catches up", "sku", sku, "err", err)
	rec, rerr := c.record(ctx, sku)
	if rerr != nil {
		return nil, rerr
	}
	return viewOf(rec, rec.Available()), nil
}

// viewOf is rec as operators see it, with what Redis has.
func viewOf(s arbiter.SKU, redisAvailable int64) *SKUView {
	return &SKUView{SKU: s.SKU, OnHand: s.OnHand, Reserved: s.Reserved, Available: s.Available(),
		RedisAvailable: redisAvailable, Unlimited: s.OnHand == inventory.Unlimited, PerUserLimit: s.PerUserLimit,
		LowStockThreshold: s.LowStockThreshold, Version: s.Version()}
}

func (c *Catalog) record(ctx context.Context, sku string) (arbiter.SKU, error) {
	var rec arbiter.SKU
	if err := c.db.WithContext(ctx).Take(&rec, "sku = ?", sku).Error; err != nil {
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return rec, inventory.UnknownSKU(sku)
		}
		return rec, err
	}
	return rec, nil
}

// Get returns sku's quantity states and Redis's available units
// (initialising Redis if it does not have the SKU).
func (c *Catalog) Get(ctx context.Context, sku string) (*SKUView, error) {
	if err := inventory.ValidateSKU(sku); err != nil {
		return nil, err
	}
	rec, err := c.record(ctx, sku)
	if err != nil {
		return nil, err
	}
	if err := c.stock.EnsureInit(ctx, sku); err != nil {
		return nil, err
	}
	lv, err := c.stock.Levels(ctx, sku)
	if err != nil {
		return nil, err
	}
	return viewOf(rec, lv.Available), nil
}
