package maintenance

import (
	"context"
	"log/slog"
	"math"
	"time"

	"gorm.io/gorm"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/job"
	"github.com/acme/inventory/internal/lock"
	"github.com/acme/inventory/internal/webhooks"
)

// The retention's defaults.
const (
	DefaultRetentionHorizon  = 30 * 24 * time.Hour // how long finished history is kept
	DefaultRetentionInterval = 10 * time.Minute    // how often retention prunes
	// DefaultEventHorizon is how long stock events stay in the replay
	// feed: a receiver down for a week can still catch up.
	DefaultEventHorizon = 7 * 24 * time.Hour
	// DefaultHoldHorizon is how long an order's hold record (the lean
	// sale's row of holds) stays after its deadline once projected.
	DefaultHoldHorizon = time.Hour
)

// RetentionConfig tunes the pruning of finished history. Zero values take
// the defaults.
type RetentionConfig struct {
	// Horizon is how long finished rows are kept. Exactly once does not
	// depend on it: whether an operation was applied is read from the
	// reservation's state, which is never pruned (see Retention).
	// Default 30 days.
	Horizon time.Duration
	// EventHorizon is how long stock events are kept (the replay feed's
	// horizon). Default 7 days.
	EventHorizon time.Duration
	// HoldHorizon is how long an order's hold record stays past its
	// deadline once its projection is written. Default 1h.
	HoldHorizon time.Duration
	// Interval is how often one node prunes. Default 10m.
	Interval time.Duration
	// Batch bounds the rows one statement deletes. Default 1000.
	Batch int
	Now   func() time.Time
	// Logger receives warnings. Default slog.Default().
	Logger *slog.Logger
}

func (c *RetentionConfig) defaults() {
	if c.Horizon <= 0 {
		c.Horizon = DefaultRetentionHorizon
	}
	if c.EventHorizon <= 0 {
		c.EventHorizon = DefaultEventHorizon
	}
	if c.HoldHorizon <= 0 {
		c.HoldHorizon = DefaultHoldHorizon
	}
	if c.Interval <= 0 {
		c.Interval = DefaultRetentionInterval
	}
	if c.Batch <= 0 {
		c.Batch = 1000
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Retention prunes finished history older than the horizon, in bounded
// batches, on one node at a time (a distributed lock per interval):
//
//   - outbox rows that were applied (applied_at, stamped in the consumer's
//     transaction);
//   - ledger rows. Exactly once does not rest on them: a DEDUCT applies to
//     a COMMITTED reservation (SOLD after it) and a RESTORE to a SOLD one
//     (RESTORED after it), so a duplicate or a refund that arrives after the
//     ledger row was pruned is still answered by the reservation's state.
//     Outbox rows go first, so a sent row never outlives the record that it
//     was applied;
//   - stock movements, compacted per SKU: the pruned movements are replaced
//     by one "opening balance" movement (kind SET, their summed deltas) that
//     takes the id of the last one, so a SKU's deltas still sum to on_hand
//     and reserved and its history still reads in order;
//   - stock events older than their own horizon (EventHorizon, 7 days by
//     default), numbered ones only, and none a webhook subscription has
//     not been delivered yet (above the lowest cursor: webhooks.Floor);
//   - order lines' shipping records (stock_shipping) sold and shipped, or
//     given back, before the horizon: a stock count reaches back less than
//     the horizon (arbiter.CountHorizon), and to it such a line's units
//     were on the shelf and in on_hand alike. The movements it rebases
//     through are younger than the horizon too;
//   - the lean sale's record of an order's hold (its rows of holds), once
//     the order is projected and its deadline is HoldHorizon past: the
//     projection is the record then (arbiter.PruneHolds). A token's stays.
//
// Reservations, orders and anomalies are kept: they are the record.
type Retention struct {
	db     *gorm.DB
	locker *lock.Locker
	cfg    RetentionConfig
	run    job.Runner
}

func NewRetention(db *gorm.DB, locker *lock.Locker, cfg RetentionConfig) *Retention {
	cfg.defaults()
	return &Retention{db: db, locker: locker, cfg: cfg}
}

// Pruned counts what one run removed.
type Pruned struct {
	Outbox, Ledger, Movements, Events, Shipping, Holds int64
}

// Start runs the job until Stop; a second Start is a no-op.
func (r *Retention) Start(ctx context.Context) { r.run.Start(ctx, r.loop) }

// Stop ends the job and waits for it; safe before Start and twice.
func (r *Retention) Stop() { r.run.Stop() }

func (r *Retention) loop(ctx context.Context) {
	lock := job.Lock{Locker: r.locker, Key: lock.RetentionKey, TTL: r.cfg.Interval, Log: r.cfg.Logger}
	job.Periodic(ctx, lock, r.cfg.Interval, 0, func(rctx context.Context) {
		p, err := r.PruneOnce(rctx)
		switch {
		case err != nil && ctx.Err() == nil:
			r.cfg.Logger.Warn("retention: run failed; the next one continues", "err", err)
		case p != Pruned{}:
			r.cfg.Logger.Info("retention: pruned finished history", "outbox", p.Outbox, "ledger", p.Ledger, "movements", p.Movements, "events", p.Events, "shipping", p.Shipping, "holds", p.Holds)
		}
	})
}

// PruneOnce prunes everything older than the horizon, batch by batch.
func (r *Retention) PruneOnce(ctx context.Context) (Pruned, error) {
	var p Pruned
	cutoff := r.cfg.Now().UTC().Add(-r.cfg.Horizon)
	db := r.db.WithContext(ctx)
	var err error
	if p.Outbox, err = r.batches(ctx, func() (int64, error) {
		return arbiter.OutboxOf(db).PruneApplied(cutoff, r.cfg.Batch)
	}); err != nil {
		return p, err
	}
	if p.Ledger, err = r.batches(ctx, func() (int64, error) {
		return arbiter.PruneLedger(db, cutoff, r.cfg.Batch)
	}); err != nil {
		return p, err
	}
	eventCutoff := r.cfg.Now().UTC().Add(-r.cfg.EventHorizon)
	// An event a webhook subscription has not been delivered yet stays,
	// however old: a failing receiver keeps its backlog.
	floor, subscribed, err := webhooks.Floor(ctx, db)
	if err != nil {
		return p, err
	}
	if !subscribed {
		floor = math.MaxInt64
	}
	if p.Events, err = r.batches(ctx, func() (int64, error) {
		return arbiter.EventsOf(db).PruneBefore(eventCutoff, floor, r.cfg.Batch)
	}); err != nil {
		return p, err
	}
	if p.Shipping, err = r.batches(ctx, func() (int64, error) {
		return arbiter.PruneShipping(db, cutoff, r.cfg.Batch)
	}); err != nil {
		return p, err
	}
	if p.Holds, err = r.pruneHolds(ctx, r.cfg.Now().UTC().Add(-r.cfg.HoldHorizon)); err != nil {
		return p, err
	}
	p.Movements, err = r.batches(ctx, func() (int64, error) {
		var folded int64
		err := db.Transaction(func(tx *gorm.DB) error {
			var err error
			folded, err = arbiter.In(tx).FoldMovements(cutoff, r.cfg.Batch)
			return err
		})
		return folded, err
	})
	return p, err
}

// pruneHolds runs arbiter.PruneHolds from the first hold to the last, a
// batch at a time: one pass over the holds a run keeps (the live ones
// and the tokens'), not one per batch.
func (r *Retention) pruneHolds(ctx context.Context, t time.Time) (int64, error) {
	var total int64
	var after []byte
	for ctx.Err() == nil {
		type batch struct {
			n    int64
			next []byte
		}
		b, err := arbiter.RetryDeadlock(ctx, func() (batch, error) {
			n, next, err := arbiter.PruneHolds(r.db.WithContext(ctx), t, after, r.cfg.Batch)
			return batch{n, next}, err
		})
		total += b.n
		if err != nil || b.next == nil {
			return total, err
		}
		after = b.next
	}
	return total, ctx.Err()
}

// batches runs one until it deletes less than a batch; a batch the
// database rolled back as a deadlock victim runs again.
func (r *Retention) batches(ctx context.Context, one func() (int64, error)) (int64, error) {
	var total int64
	for ctx.Err() == nil {
		n, err := arbiter.RetryDeadlock(ctx, one)
		total += n
		if err != nil || n < int64(r.cfg.Batch) {
			return total, err
		}
	}
	return total, ctx.Err()
}
