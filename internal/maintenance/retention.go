package maintenance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"gorm.io/gorm"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/job"
	"github.com/acme/inventory/internal/lock"
)

// OpeningReason marks the movement that stands for a SKU's pruned history:
// kind SET, deltas = the sum of the movements it replaced.
const OpeningReason = "opening balance"

// The retention's defaults.
const (
	DefaultRetentionHorizon  = 30 * 24 * time.Hour // how long finished history is kept
	DefaultRetentionInterval = 10 * time.Minute    // how often retention prunes
)

// RetentionConfig tunes the pruning of finished history. Zero values take
// the defaults.
type RetentionConfig struct {
	// Horizon is how long finished rows are kept. Exactly once does not
	// depend on it: whether an operation was applied is read from the
	// reservation's state, which is never pruned (see Retention).
	// Default 30 days.
	Horizon time.Duration
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
//     and reserved and its history still reads in order.
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

// errConcurrentFold: another node compacted the same movements first (two
// runs overlapped when a lock expired); this batch rolls back.
var errConcurrentFold = errors.New("retention: movements folded concurrently")

// Pruned counts what one run removed.
type Pruned struct {
	Outbox, Ledger, Movements int64
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
			r.cfg.Logger.Info("retention: pruned finished history", "outbox", p.Outbox, "ledger", p.Ledger, "movements", p.Movements)
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
		// Applied implies delivered, even if the relay stopped before it
		// marked the row sent (it would only have sent it again).
		return r.deleteIDs(db, "stock_outbox", `SELECT id FROM stock_outbox
			WHERE applied_at < ? ORDER BY id LIMIT ?`, cutoff)
	}); err != nil {
		return p, err
	}
	if p.Ledger, err = r.batches(ctx, func() (int64, error) {
		return r.deleteIDs(db, "stock_ledger", `SELECT id FROM stock_ledger WHERE applied_at < ? ORDER BY id LIMIT ?`, cutoff)
	}); err != nil {
		return p, err
	}
	p.Movements, err = r.batches(ctx, func() (int64, error) { return r.compactMovements(db, cutoff) })
	return p, err
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

// deleteIDs deletes the rows of table that query (cutoff, limit) selects.
// Ids are read first: MariaDB has no LIMIT in an IN subquery, and SQLite no
// DELETE ... LIMIT.
func (r *Retention) deleteIDs(db *gorm.DB, table, query string, cutoff time.Time) (int64, error) {
	var ids []int64
	if err := db.Raw(query, cutoff, r.cfg.Batch).Scan(&ids).Error; err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	res := db.Exec(fmt.Sprintf("DELETE FROM %s WHERE id IN ?", table), ids)
	return res.RowsAffected, res.Error
}

// compactMovements folds up to one batch of movements older than cutoff
// (opening balances aside) into one opening balance per SKU, in one
// transaction, and returns how many it folded.
func (r *Retention) compactMovements(db *gorm.DB, cutoff time.Time) (int64, error) {
	var folded int64
	err := db.Transaction(func(tx *gorm.DB) error {
		var old []arbiter.Movement
		if err := tx.Where("created_at < ? AND NOT (kind = ? AND reason = ?)", cutoff, arbiter.MoveSet, OpeningReason).
			Order("id").Limit(r.cfg.Batch).Find(&old).Error; err != nil {
			return err
		}
		bySKU := map[string][]arbiter.Movement{}
		var skus []string
		for _, m := range old {
			if _, ok := bySKU[m.SKU]; !ok {
				skus = append(skus, m.SKU)
			}
			bySKU[m.SKU] = append(bySKU[m.SKU], m)
		}
		for _, sku := range skus {
			ms := bySKU[sku]
			last := ms[len(ms)-1]
			// The SKU's earlier opening balance folds in too.
			var opening []arbiter.Movement
			if err := tx.Where("sku = ? AND id < ? AND kind = ? AND reason = ?", sku, last.ID, arbiter.MoveSet, OpeningReason).
				Find(&opening).Error; err != nil {
				return err
			}
			sum := arbiter.Movement{ID: last.ID, SKU: sku, Kind: arbiter.MoveSet, Reason: OpeningReason, CreatedAt: last.CreatedAt}
			ids := make([]int64, 0, len(ms)+len(opening))
			for _, m := range append(opening, ms...) {
				sum.OnHandDelta += m.OnHandDelta
				sum.ReservedDelta += m.ReservedDelta
				ids = append(ids, m.ID)
			}
			res := tx.Exec(`DELETE FROM stock_movements WHERE id IN ?`, ids)
			if res.Error != nil {
				return res.Error
			}
			if res.RowsAffected != int64(len(ids)) {
				// Another run folded some of them first: summing them again
				// would count them twice.
				return errConcurrentFold
			}
			if err := tx.Create(&sum).Error; err != nil {
				return err
			}
		}
		folded = int64(len(old))
		return nil
	})
	return folded, err
}
