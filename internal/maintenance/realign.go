// Package maintenance holds what keeps the stores true over time, on one
// node at a time: reconcile (Redis against the database, the database
// against itself), the periodic realign of Redis, and the retention that
// prunes finished history without touching what exactly-once rests on.
package maintenance

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/acme/inventory/internal/job"
	"github.com/acme/inventory/internal/lock"
)

// Realigner periodically realigns every SKU and campaign pool whose Redis
// value differs from the database's, on one node at a time (a distributed
// lock): a Redis that came back older, failed over to a lagging replica or
// kept units an admission took and never recorded (its process died) is
// put right within one interval and the settle, even if nobody buys the
// SKU; a pool only behind the database by admissions in flight is left
// alone (see Reconciler.Realign).
type Realigner struct {
	rec      *Reconciler
	locker   *lock.Locker
	interval time.Duration
	log      *slog.Logger
	run      job.Runner

	// Realigned counts the SKUs this node realigned.
	Realigned atomic.Int64
}

// DefaultRealignInterval is the realign's period when none is given.
const DefaultRealignInterval = 30 * time.Second

// NewRealigner runs rec.Realign every interval (default 30s).
func NewRealigner(rec *Reconciler, locker *lock.Locker, interval time.Duration, log *slog.Logger) *Realigner {
	if interval <= 0 {
		interval = DefaultRealignInterval
	}
	if log == nil {
		log = slog.Default()
	}
	return &Realigner{rec: rec, locker: locker, interval: interval, log: log}
}

// Start runs the job until Stop; a second Start is a no-op.
func (r *Realigner) Start(ctx context.Context) { r.run.Start(ctx, r.loop) }

// Stop ends the job and waits for it; safe before Start and twice.
func (r *Realigner) Stop() { r.run.Stop() }

func (r *Realigner) loop(ctx context.Context) {
	lock := job.Lock{Locker: r.locker, Key: lock.RealignKey, TTL: r.interval, Log: r.log}
	// A round may watch pools for the settle twice (SKUs, then campaigns).
	job.Periodic(ctx, lock, r.interval, r.interval+2*r.rec.Settle(), func(rctx context.Context) {
		skus, err := r.rec.Realign(rctx)
		camps, cerr := r.rec.RealignCampaigns(rctx)
		err = errors.Join(err, cerr)
		r.Realigned.Add(int64(len(skus) + len(camps)))
		switch {
		case err != nil && ctx.Err() == nil:
			r.log.Warn("realign: round failed", "err", err)
		case len(skus)+len(camps) > 0:
			r.log.Info("realign: Redis differed from the database", "skus", len(skus), "campaigns", len(camps))
		}
	})
}
