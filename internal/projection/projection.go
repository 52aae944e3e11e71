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
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/job"
	"github.com/acme/inventory/internal/lock"
)

// Config tunes the projector.
type Config struct {
	// Interval is the pause between rounds that found nothing to do
	// (default 50 ms): the projection's lag when the sale is quiet.
	Interval time.Duration
	// SKUs and PerSKU bound one round's transaction: up to PerSKU holds of
	// each of up to SKUs SKUs (defaults 100 and 1000).
	SKUs, PerSKU int
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

	projected atomic.Int64
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
	if cfg.PerSKU <= 0 {
		cfg.PerSKU = 1000
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
	return &Job{db: db, locker: locker, cfg: cfg}
}

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
		n, err := j.Round(ctx)
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, context.Canceled) {
				j.cfg.Logger.Warn("projection: round failed", "err", err)
			}
			job.Sleep(ctx, backoff.Next(), nil)
			continue
		}
		backoff.Reset()
		if n == 0 {
			job.Sleep(ctx, j.cfg.Interval, nil)
		}
	}
}

// Round projects one round's holds in one transaction and returns how
// many it read (0: nothing was left).
func (j *Job) Round(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, j.cfg.RoundTimeout)
	defer cancel()
	var n int
	err := arbiter.Transact(ctx, j.db, func(tx *gorm.DB) (err error) {
		n, err = arbiter.In(tx).ProjectBacklog(j.cfg.SKUs, j.cfg.PerSKU)
		return err
	})
	if err == nil {
		j.projected.Add(int64(n))
	}
	return n, err
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
