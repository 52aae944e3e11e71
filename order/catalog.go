package order

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"gorm.io/gorm"

	"github.com/acme/inventory/stock"
)

// MaxStock bounds a SKU's stock (and a single adjustment).
const MaxStock = 1_000_000_000_000

// SKU is a SKU's durable settings.
type SKU struct {
	SKU          string `json:"sku" gorm:"primaryKey;column:sku"`
	Stock        int64  `json:"stock"`
	PerUserLimit int64  `json:"per_user_limit"`
}

func (SKU) TableName() string { return "skus" }

// SKUView is a SKU as operators see it: the database record and Redis.
type SKUView struct {
	SKU          string `json:"sku"`
	DBStock      int64  `json:"db_stock"`
	Available    int64  `json:"available"`
	Reserved     int64  `json:"reserved"`
	Unlimited    bool   `json:"unlimited"`
	PerUserLimit int64  `json:"per_user_limit"`
}

// Catalog administers SKUs. A change is written to the database first (under
// the SKU's row lock, checked against what is held and owed), then Redis
// forgets the SKU's value, so the next use re-initialises it from the
// database with the held reservations counted: no path adds units in Redis
// that the database does not have.
type Catalog struct {
	db    *gorm.DB
	stock *stock.Store
	log   *slog.Logger
}

func NewCatalog(db *gorm.DB, st *stock.Store, log *slog.Logger) *Catalog {
	if log == nil {
		log = slog.Default()
	}
	return &Catalog{db: db, stock: st, log: log}
}

// Put creates sku or sets its stock (Unlimited allowed) and per-user limit.
// Setting the stock below what unpaid orders hold plus what is paid but not
// yet applied is a conflict.
func (c *Catalog) Put(ctx context.Context, sku string, stockN, perUserLimit int64) (*SKUView, error) {
	if err := stock.ValidateSKU(sku); err != nil {
		return nil, err
	}
	if stockN < stock.Unlimited || stockN > MaxStock {
		return nil, invalid("stock must be -1 (unlimited) or between 0 and %d", int64(MaxStock))
	}
	if perUserLimit < 0 || perUserLimit > stock.DefaultMaxQty {
		return nil, invalid("per_user_limit must be between 0 (none) and %d", stock.DefaultMaxQty)
	}
	err := c.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		snap, err := readSnapshot(tx, sku, true)
		if errors.Is(err, stock.ErrUnknownSKU) {
			return tx.Create(&SKU{SKU: sku, Stock: stockN, PerUserLimit: perUserLimit}).Error
		}
		if err != nil {
			return err
		}
		if stockN != stock.Unlimited {
			if err := covers(snap, stockN); err != nil {
				return err
			}
		}
		return tx.Model(&SKU{}).Where("sku = ?", sku).
			Updates(map[string]any{"stock": stockN, "per_user_limit": perUserLimit}).Error
	})
	if err != nil {
		return nil, err
	}
	c.log.Info("sku set", "sku", sku, "stock", stockN, "per_user_limit", perUserLimit)
	return c.reset(ctx, sku)
}

// Adjust adds delta to a limited SKU's stock (restock, shrinkage, correction).
func (c *Catalog) Adjust(ctx context.Context, sku string, delta int64, reason string) (*SKUView, error) {
	if err := stock.ValidateSKU(sku); err != nil {
		return nil, err
	}
	if delta == 0 || delta > MaxStock || delta < -MaxStock {
		return nil, invalid("delta must be non-zero and within ±%d", int64(MaxStock))
	}
	reason = strings.TrimSpace(reason)
	if reason == "" || len(reason) > 200 {
		return nil, invalid("reason must be 1-200 characters")
	}
	err := c.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		snap, err := readSnapshot(tx, sku, true)
		if err != nil {
			return err
		}
		if snap.Stock == stock.Unlimited {
			return fmt.Errorf("%w: %s has unlimited stock; set a stock first", ErrConflict, sku)
		}
		next := snap.Stock + delta
		if next > MaxStock {
			return invalid("stock would exceed %d", int64(MaxStock))
		}
		if err := covers(snap, next); err != nil {
			return err
		}
		return tx.Exec(`UPDATE skus SET stock = stock + ? WHERE sku = ?`, delta, sku).Error
	})
	if err != nil {
		return nil, err
	}
	c.log.Info("sku adjusted", "sku", sku, "delta", delta, "reason", reason)
	return c.reset(ctx, sku)
}

// covers refuses a database stock below what is committed already.
func covers(snap stock.Snapshot, next int64) error {
	var held int64
	for _, h := range snap.Holds {
		held += h.Qty
	}
	if committed := held + snap.Pending; next < committed {
		return fmt.Errorf("%w: %d units are held or paid and not yet applied; stock cannot go to %d", ErrConflict, committed, next)
	}
	return nil
}

func (c *Catalog) reset(ctx context.Context, sku string) (*SKUView, error) {
	if err := c.stock.Forget(ctx, sku); err != nil {
		// The database changed; Redis still has the old value. Reconcile repairs it.
		c.log.Error("sku changed but Redis could not be reset; run reconcile --repair", "sku", sku, "err", err)
	}
	return c.Get(ctx, sku)
}

// Get returns sku's database record and Redis levels (initialising Redis if
// it does not have the SKU).
func (c *Catalog) Get(ctx context.Context, sku string) (*SKUView, error) {
	if err := stock.ValidateSKU(sku); err != nil {
		return nil, err
	}
	var rec SKU
	if err := c.db.WithContext(ctx).Take(&rec, "sku = ?", sku).Error; err != nil {
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return nil, fmt.Errorf("%w: sku %s", ErrNotFound, sku)
		}
		return nil, err
	}
	if err := c.stock.EnsureInit(ctx, sku); err != nil {
		return nil, err
	}
	lv, err := c.stock.Levels(ctx, sku)
	if err != nil {
		return nil, err
	}
	return &SKUView{SKU: sku, DBStock: rec.Stock, Available: lv.Available, Reserved: lv.Held,
		Unlimited: rec.Stock == stock.Unlimited, PerUserLimit: rec.PerUserLimit}, nil
}

// Limit returns sku's per-user limit (0: none).
func (c *Catalog) Limit(ctx context.Context, sku string) (int64, error) {
	var limits []int64
	if err := c.db.WithContext(ctx).Model(&SKU{}).Where("sku = ?", sku).Pluck("per_user_limit", &limits).Error; err != nil {
		return 0, err
	}
	if len(limits) == 0 {
		return 0, fmt.Errorf("%w: sku %s", ErrNotFound, sku)
	}
	return limits[0], nil
}

// Report is one SKU whose invariant does not hold.
type Report struct {
	SKU       string `json:"sku"`
	DBStock   int64  `json:"db_stock"`
	Available int64  `json:"available"`
	Held      int64  `json:"held"`
	Pending   int64  `json:"pending"`
	Diff      int64  `json:"diff"` // db_stock - (available + held + pending)
	Repaired  bool   `json:"repaired"`
}

// Reconcile checks, for every limited SKU Redis has, that
// database stock = available + held + paid-but-unapplied, and reports every
// SKU where it does not hold; with repair it resets those SKUs so Redis is
// re-initialised from the database. Run it at a quiet point: in-flight
// checkouts move the numbers.
func (c *Catalog) Reconcile(ctx context.Context, repair bool) ([]Report, error) {
	var skus []string
	if err := c.db.WithContext(ctx).Model(&SKU{}).Where("stock <> ?", stock.Unlimited).Order("sku").Pluck("sku", &skus).Error; err != nil {
		return nil, err
	}
	var out []Report
	for _, sku := range skus {
		lv, err := c.stock.Levels(ctx, sku)
		if err != nil {
			return out, err
		}
		if !lv.Initialised {
			continue // the next use initialises it from the database
		}
		snap, err := snapshot(ctx, c.db, sku)
		if err != nil {
			return out, err
		}
		diff := snap.Stock - (lv.Available + lv.Held + snap.Pending)
		if diff == 0 {
			continue
		}
		r := Report{SKU: sku, DBStock: snap.Stock, Available: lv.Available, Held: lv.Held, Pending: snap.Pending, Diff: diff}
		if repair {
			if err := c.stock.Forget(ctx, sku); err != nil {
				return out, err
			}
			if err := c.stock.EnsureInit(ctx, sku); err != nil {
				return out, err
			}
			r.Repaired = true
		}
		out = append(out, r)
	}
	return out, nil
}
