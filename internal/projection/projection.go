// Package projection is the lean sale's projector (docs/design.md "The
// lean sale"): one node at a time, it writes what the sale's commit no
// longer writes (each hold's order row, reservation and RESERVE
// movement) from the holds the commit recorded, SKU by SKU in commit
// order, and moves each SKU's cursor. Writing a hold's projection twice
// is harmless, so a projector that dies mid-round, or a transition that
// projected a hold first, loses and doubles nothing. Listings, movements
// and events read the projection, behind the sale by its lag; an order's
// own reads and transitions never wait for it.
package projection

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gorm.io/gorm"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/job"
	"github.com/acme/inventory/internal/lock"
	"github.com/acme/inventory/internal/rawtx"
)

// Config tunes the projector.
type Config struct {
	// Interval is the pause between rounds that found nothing to do
	// (default 50 ms): the projection's lag when the sale is quiet.
	Interval time.Duration
	// Gather is the pause after a round that found work but less than a
	// full round's (default 100 ms): the next round then carries what
	// the sales made meanwhile, so each SKU's row (the sale's hot row,
	// whose cursor a round moves) is written at most once a Gather, and
	// the statements of a round are spread over more holds. It adds up
	// to Gather to the projection's lag.
	Gather time.Duration
	// SKUs, PerSKU and Holds bound one round's transaction: up to PerSKU
	// holds of each of up to SKUs SKUs, up to Holds in all (defaults 100,
	// 500 and 1000).
	SKUs, PerSKU, Holds int
	// LockTTL is the leader lock's time to live (default 2 s).
	LockTTL time.Duration
	// RoundTimeout bounds one round's transaction (default 5 s).
	RoundTimeout time.Duration
	Logger       *slog.Logger
}

// Job runs the projector.
type Job struct {
	db     *gorm.DB
	locker *lock.Locker
	cfg    Config
	run    job.Runner

	projected     atomic.Int64
	lag           prometheus.Histogram
	mu            sync.Mutex // over after
	after         string     // where the next round starts (arbiter.Backlog)
	afterCampaign string     // and its campaigns' turns
	// Leading says whether this node leads the projector now.
	Leading atomic.Bool
}

// New is the projector of db's holds, led under locker's lock.
func New(db *gorm.DB, locker *lock.Locker, cfg Config) *Job {
	if cfg.Interval <= 0 {
		cfg.Interval = 50 * time.Millisecond
	}
	if cfg.SKUs <= 0 {
		cfg.SKUs = 100
	}
	if cfg.Gather <= 0 {
		cfg.Gather = 100 * time.Millisecond
	}
	if cfg.PerSKU <= 0 {
		cfg.PerSKU = 500
	}
	if cfg.Holds <= 0 {
		cfg.Holds = 1000
	}
	if cfg.LockTTL <= 0 {
		cfg.LockTTL = 2 * time.Second
	}
	if cfg.RoundTimeout <= 0 {
		cfg.RoundTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Job{db: db, locker: locker, cfg: cfg, lag: prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "inventory_projection_lag_seconds",
		Help:    "Time from a lean hold's commit to the commit of the projector's round that wrote its projection (listings see it then).",
		Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	})}
}

// Lag is the projection's lag histogram (inventory_projection_lag_seconds).
func (j *Job) Lag() prometheus.Histogram { return j.lag }

// Start runs the projector until Stop, on the node that holds its lock.
func (j *Job) Start(ctx context.Context) { j.run.Start(ctx, j.loop) }

// Stop ends it.
func (j *Job) Stop() { j.run.Stop() }

// Projected is how many holds this node's projector has read.
func (j *Job) Projected() int64 { return j.projected.Load() }

func (j *Job) loop(ctx context.Context) {
	job.Lead(ctx, job.Lock{Locker: j.locker, Key: lock.ProjectorKey, TTL: j.cfg.LockTTL, Log: j.cfg.Logger}, j.lead)
}

func (j *Job) lead(ctx context.Context) {
	j.Leading.Store(true)
	defer j.Leading.Store(false)
	backoff := job.Backoff{Min: j.cfg.Interval, Max: 5 * time.Second}
	for ctx.Err() == nil {
		n, more, err := j.round(ctx)
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, context.Canceled) {
				j.cfg.Logger.Warn("projection: round failed", "err", err)
			}
			job.Sleep(ctx, backoff.Next(), nil)
			continue
		}
		backoff.Reset()
		switch {
		case n == 0:
			job.Sleep(ctx, j.cfg.Interval, nil)
		case !more:
			job.Sleep(ctx, j.cfg.Gather, nil)
		}
	}
}

// Round projects one round's holds in one transaction and returns how
// many it read (0: nothing was left).
func (j *Job) Round(ctx context.Context) (int, error) {
	n, _, err := j.round(ctx)
	return n, err
}

// round is Round, and whether its bounds left holds for the next one.
// The round's holds are projected in one transaction; the SKUs' cursors
// are moved after it committed, each in a statement of its own
// (arbiter.ProjectBacklog says why).
func (j *Job) round(ctx context.Context) (n int, more bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, j.cfg.RoundTimeout)
	defer cancel()
	j.mu.Lock()
	defer j.mu.Unlock()
	var p arbiter.Projected
	var created []time.Time
	// Past GORM's statement builder (internal/rawtx), as the group commit:
	// a round's INSERTs carry thousands of arguments. Run again whole if
	// the database chose it as a deadlock's victim.
	_, err = arbiter.RetryDeadlock(ctx, func() (struct{}, error) {
		return struct{}{}, rawtx.Run(ctx, j.db, func(tx *rawtx.Tx) (err error) {
			created = created[:0] // a retried transaction reads again
			p, err = arbiter.OnConn(tx.Context(), tx, tx.Dialect()).ProjectBacklog(arbiter.Backlog{SKUs: j.cfg.SKUs, PerSKU: j.cfg.PerSKU,
				Holds: j.cfg.Holds, After: j.after, AfterCampaign: j.afterCampaign, Seen: func(c time.Time) { created = append(created, c) }})
			return err
		})
	})
	if err != nil {
		return 0, false, err
	}
	now := time.Now()
	for _, c := range created {
		j.lag.Observe(max(now.Sub(c).Seconds(), 0))
	}
	j.projected.Add(int64(p.N))
	if err := arbiter.In(j.db.WithContext(ctx)).MoveCursors(p.Cursors); err != nil {
		return p.N, false, err
	}
	j.after, j.afterCampaign = p.Next, p.NextCampaign
	return p.N, p.More, nil
}

// CatchUp runs rounds until nothing is left to project (tests, and what
// reads the whole projection at once).
func (j *Job) CatchUp(ctx context.Context) error {
	for {
		n, err := j.Round(ctx)
		if err != nil || n == 0 {
			return err
		}
	}
}
