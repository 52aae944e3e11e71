// Package expiry releases unpaid orders at their deadline: a sharded Redis
// delay queue fires each order on time, and a database sweep, run by one
// node at a time, catches whatever the queue missed and releases expired
// token-API reservations. What expiring means is the order lifecycle's
// (Orders); expiry only decides when.
package expiry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/acme/inventory/internal/job"
	"github.com/acme/inventory/internal/lock"
	"github.com/acme/inventory/stock"
)

// DefaultSweepInterval is the sweep's period when TimeoutConfig does not say.
const DefaultSweepInterval = 30 * time.Second

// maxShards bounds TimeoutConfig.Shards (every poll claims from every shard).
const maxShards = 1024

// TimeoutConfig tunes the timeout release. Zero values take the defaults.
type TimeoutConfig struct {
	// Shards is how many shards the delay queue is split into. Default 16.
	// Every node must use the same value: an order waits in the shard its id
	// hashes to, and a node polls only the shards it knows, so after lowering
	// it the orders left in the higher shards are released by the sweep.
	Shards int
	// MaxPollWait bounds the poller's sleep when nothing is due soon (and so
	// sets how often an idle poller calls Redis). Default 1s.
	MaxPollWait time.Duration
	// ClaimBatch bounds the orders one poll takes, split evenly over the
	// shards (at least one from each). Default 100.
	ClaimBatch int
	// Lease is how long a claimed order is left to its poller before another
	// may take it. Default 30s.
	Lease time.Duration
	// SweepInterval is the period of the database sweep. Default 30s.
	SweepInterval time.Duration
	// SweepBatch bounds the rows one sweep query reads. Default 500.
	SweepBatch int
	// SweepLockTTL is the sweep lock's expiry, renewed while a sweep runs
	// (a node that dies mid-sweep is replaced after it). Default 15s.
	SweepLockTTL time.Duration
	// RunTimeout bounds one poll or sweep round. Default 1m.
	RunTimeout time.Duration
	// Locker takes the sweep's single-runner lock. Required.
	Locker *lock.Locker
	// Holds, if set, are swept too: their expired reservations released.
	Holds  Holds
	Now    func() time.Time
	Logger *slog.Logger
}

func (c *TimeoutConfig) validate() error {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.MaxPollWait, time.Second)
	def(&c.Lease, 30*time.Second)
	def(&c.SweepInterval, DefaultSweepInterval)
	def(&c.SweepLockTTL, 15*time.Second)
	def(&c.RunTimeout, time.Minute)
	if c.Shards == 0 {
		c.Shards = 16
	}
	if c.ClaimBatch == 0 {
		c.ClaimBatch = 100
	}
	if c.SweepBatch == 0 {
		c.SweepBatch = 500
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MaxPollWait < time.Millisecond || c.Lease < time.Second || c.SweepInterval < 10*time.Millisecond ||
		c.SweepLockTTL < 300*time.Millisecond || c.RunTimeout <= 0 || c.ClaimBatch < 1 || c.SweepBatch < 1 || c.Shards < 1 || c.Shards > maxShards || c.Locker == nil {
		return fmt.Errorf("expiry: invalid timeout config %+v", *c)
	}
	return nil
}

// Orders is what expiry needs of the order lifecycle.
type Orders interface {
	// Expire releases the PENDING order id whose deadline passed; false when
	// it was not (or no longer) pending or not yet due.
	Expire(ctx context.Context, id string) (bool, error)
	// Deadline is when order id expires, and whether it is PENDING (false
	// also when there is no such order).
	Deadline(ctx context.Context, id string) (time.Time, bool, error)
	// ExpiredIDs lists up to limit PENDING orders past their deadline, the
	// earliest first.
	ExpiredIDs(ctx context.Context, limit int) ([]string, error)
}

// Holds are the token API's reservations, which expire without an order.
type Holds interface {
	// ReleaseExpired releases up to limit token-API reservations past
	// their deadline and returns how many.
	ReleaseExpired(ctx context.Context, limit int) (int, error)
}

// Timeouts releases unpaid orders at their deadline: a Redis delay queue fires
// each order, and a database sweep, run by one node at a time under the
// distributed lock, catches whatever the queue missed (Redis lost it, a poller
// died) and releases expired token-API reservations.
type Timeouts struct {
	orders Orders
	q      *stock.DelayQueue
	cfg    TimeoutConfig

	// Expired counts the orders this node expired; Reaped the token-API
	// reservations it released; Polls the claim round trips it made to Redis
	// (one per poll: the shards' claims go out in one pipeline, which on
	// Cluster is one request per master, sent at once).
	Expired atomic.Int64
	Reaped  atomic.Int64
	Polls   atomic.Int64

	// turn rotates the shard a poll starts with.
	turn atomic.Uint32
	// legacyAt is when the next poll looks at the legacy queue (unix ms; 0:
	// now). While it has entries, every poll does; once it is seen empty,
	// once per SweepInterval, for entries an older node may still add.
	legacyAt atomic.Int64
	// sleepUntil is when the sleeping poller wakes (unix ms; 0 while it
	// polls), and scheduled the earliest deadline Schedule saw since the
	// poll began: an order wakes the poller only if it is due before the
	// poller would wake anyway, so a busy node does not poll every shard
	// for every order it creates.
	sleepUntil atomic.Int64
	scheduled  atomic.Int64

	run  job.Runner
	wake chan struct{}

	// While the loops run, Schedule does not call Redis: it leaves the entry
	// in pending and the flusher writes what accumulated in one pipeline, so
	// a sale costs the one round trip of its admission, not two. An entry
	// lost with the process is the sweep's to find.
	writeBehind atomic.Bool
	mu          sync.Mutex
	pending     map[string]time.Time // order id -> deadline, not yet written
	flushWake   chan struct{}
	// flushing is held while a pipeline is in flight, so an Unschedule never
	// overtakes the ZADD it must undo.
	flushing sync.Mutex
	// Flushes counts the pipelines the flusher sent.
	Flushes atomic.Int64
}

func NewTimeouts(orders Orders, rdb redis.UniversalClient, cfg TimeoutConfig) (*Timeouts, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	t := &Timeouts{orders: orders, q: stock.NewDelayQueue(rdb, cfg.Shards), cfg: cfg, wake: make(chan struct{}, 1),
		pending: map[string]time.Time{}, flushWake: make(chan struct{}, 1)}
	t.turn.Store(rand.Uint32()) // nodes start on different shards
	t.scheduled.Store(math.MaxInt64)
	return t, nil
}

// Schedule puts order id on the delay queue at its deadline (the order
// lifecycle's OnCreated).
// Losing this write is safe: the sweep finds the order in the database.
// While the loops run, the write is left to the flusher (see writeBehind).
func (t *Timeouts) Schedule(ctx context.Context, id string, deadline time.Time) {
	if t.writeBehind.Load() {
		t.mu.Lock()
		t.pending[id] = deadline
		first := len(t.pending) == 1
		t.mu.Unlock()
		if first {
			select {
			case t.flushWake <- struct{}{}:
			default:
			}
		}
		return // the flusher tells the poller once the entry is in Redis
	}
	if err := t.q.Add(ctx, stock.Entry{ID: id, Deadline: deadline}); err != nil {
		t.cfg.Logger.Warn("timeout: scheduling failed; the sweep will release the order", "order", id, "err", err)
		return
	}
	t.scheduledAt(stock.DueMillis(deadline))
}

// scheduledAt tells the poller about a deadline now in Redis: it wakes if it
// sleeps past it.
func (t *Timeouts) scheduledAt(due int64) {
	lowerTo(&t.scheduled, due)
	if due < t.sleepUntil.Load() { // the poller sleeps past this deadline
		select {
		case t.wake <- struct{}{}:
		default:
		}
	}
}

// Unschedule drops a finished order (paid or cancelled) from its shard, so
// the queue holds pending orders only and Redis keeps nothing per finished
// order. A failure is harmless: the entry is claimed at its deadline and
// found not PENDING.
func (t *Timeouts) Unschedule(ctx context.Context, id string) {
	t.mu.Lock()
	_, unwritten := t.pending[id]
	delete(t.pending, id)
	t.mu.Unlock()
	if unwritten {
		return // never reached Redis
	}
	// The entry may be in the pipeline in flight: let it land first.
	t.flushing.Lock()
	//lint:ignore SA2001 an empty critical section is the wait for the flusher
	t.flushing.Unlock()
	if err := t.q.Remove(ctx, id); err != nil {
		t.cfg.Logger.Warn("timeout: unscheduling failed; the entry is dropped at its deadline", "order", id, "err", err)
	}
}

// lowerTo sets a to v if v is lower.
func lowerTo(a *atomic.Int64, v int64) {
	for cur := a.Load(); v < cur; cur = a.Load() {
		if a.CompareAndSwap(cur, v) {
			return
		}
	}
}

// PollOnce claims the due orders from every shard (and the legacy queue when
// it is time to look at it) and expires them. It returns how many it expired
// and when the next entry of the queues it saw is due (zero if none).
func (t *Timeouts) PollOnce(ctx context.Context) (int, time.Time, error) {
	now := t.cfg.Now()
	// Every shard, starting from a rotating one: the claims are split evenly,
	// and the order they are worked in moves on each poll.
	shards := t.q.Shards()
	first := int(t.turn.Add(1) % uint32(shards))
	qs := make([]stock.Queue, 0, shards+1)
	withLegacy := now.UnixMilli() >= t.legacyAt.Load()
	if withLegacy {
		qs = append(qs, stock.Legacy) // the oldest orders first
	}
	for i := range shards {
		qs = append(qs, stock.Queue((first+i)%shards))
	}
	limit := max(1, (t.cfg.ClaimBatch+len(qs)-1)/len(qs))

	t.Polls.Add(1)
	claims, err := t.q.Claim(ctx, qs, now, limit, t.cfg.Lease)
	errs := []error{err}
	var next time.Time
	for i, c := range claims {
		if withLegacy && i == 0 && c.OK {
			// Look again when its next entry is due, or after a sweep
			// interval at the latest (an older node may still add to it).
			at := now.Add(t.cfg.SweepInterval).UnixMilli()
			if c.Next >= 0 {
				at = min(at, c.Next)
			}
			t.legacyAt.Store(at)
		}
		if c.Next >= 0 && (next.IsZero() || c.Next < next.UnixMilli()) {
			next = time.UnixMilli(c.Next)
		}
	}

	expired := 0
	done := map[stock.Queue][]string{} // per queue, the claims that need nothing more
	for i, c := range claims {
		for _, id := range c.IDs {
			ok, err := t.orders.Expire(ctx, id)
			if err == nil && !ok {
				err = t.requeueIfEarly(ctx, id)
			}
			if err != nil { // keep the claim: its lease brings it back
				errs = append(errs, err)
				continue
			}
			if ok {
				expired++
			}
			done[qs[i]] = append(done[qs[i]], id)
		}
	}
	t.Expired.Add(int64(expired))
	if len(done) > 0 {
		// Record the work done even if the round was just stopped; a claim
		// left behind comes back when its lease ends and is dropped then.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := t.q.Done(dctx, done); err != nil {
			errs = append(errs, fmt.Errorf("timeout: dropping claims: %w", err))
		}
	}
	return expired, next, errors.Join(errs...)
}

// requeueIfEarly puts back an order that was claimed before this node's
// clock says it is due (clocks differ between nodes), into its shard; an
// order that is no longer PENDING needs nothing.
func (t *Timeouts) requeueIfEarly(ctx context.Context, id string) error {
	deadline, pending, err := t.orders.Deadline(ctx, id)
	if err != nil || !pending {
		return err
	}
	return t.q.Add(ctx, stock.Entry{ID: id, Deadline: deadline})
}

// SweepOnce expires every PENDING order past its deadline and releases every
// token-API reservation past its deadline. The caller holds the sweep lock
// (Start does that).
func (t *Timeouts) SweepOnce(ctx context.Context) (int, error) {
	expired := 0
	for {
		ids, err := t.orders.ExpiredIDs(ctx, t.cfg.SweepBatch)
		if err != nil {
			return expired, fmt.Errorf("timeout: sweep: %w", err)
		}
		progress := 0
		for _, id := range ids {
			ok, err := t.orders.Expire(ctx, id)
			if err != nil {
				return expired, err
			}
			if ok {
				t.Expired.Add(1)
				expired++
				progress++
			}
		}
		if len(ids) < t.cfg.SweepBatch || progress == 0 {
			break
		}
	}
	for t.cfg.Holds != nil {
		n, err := t.cfg.Holds.ReleaseExpired(ctx, t.cfg.SweepBatch)
		t.Reaped.Add(int64(n))
		if err != nil || n < t.cfg.SweepBatch {
			return expired, err
		}
	}
	return expired, nil
}

// Start runs the poller and the sweeper until Stop; a second Start is a no-op.
func (t *Timeouts) Start(ctx context.Context) {
	t.writeBehind.Store(true)
	t.run.Start(ctx, t.pollLoop, t.sweepLoop, t.flushLoop)
}

// Stop ends the loops and waits for them (the flusher writes what is
// pending first); safe before Start and twice.
func (t *Timeouts) Stop() {
	t.run.Stop()
	t.writeBehind.Store(false)
	t.flush(context.Background()) // what the flusher left, and anything scheduled while it stopped
}

// flushLoop writes pending entries whenever there are some: under load the
// entries of every sale that completed during one pipeline's round trip go
// out in the next. What is pending when it ends, Stop writes.
func (t *Timeouts) flushLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.flushWake:
			t.flush(ctx)
		}
	}
}

// flush writes the pending entries in one pipeline, grouped by shard.
func (t *Timeouts) flush(ctx context.Context) {
	t.flushing.Lock()
	defer t.flushing.Unlock()
	t.mu.Lock()
	if len(t.pending) == 0 {
		t.mu.Unlock()
		return
	}
	batch := t.pending
	t.pending = make(map[string]time.Time, len(batch))
	t.mu.Unlock()
	entries := make([]stock.Entry, 0, len(batch))
	earliest := int64(math.MaxInt64)
	for id, deadline := range batch {
		entries = append(entries, stock.Entry{ID: id, Deadline: deadline})
		earliest = min(earliest, stock.DueMillis(deadline))
	}
	t.Flushes.Add(1)
	if err := t.q.Add(ctx, entries...); err != nil {
		t.cfg.Logger.Warn("timeout: scheduling failed; the sweep will release the orders", "orders", len(batch), "err", err)
		return
	}
	t.scheduledAt(earliest)
}

func (t *Timeouts) pollLoop(ctx context.Context) {
	backoff := job.Backoff{Min: 100 * time.Millisecond, Max: 10 * time.Second}
	for ctx.Err() == nil {
		t.sleepUntil.Store(0) // awake: Schedule leaves its deadline in scheduled
		t.scheduled.Store(math.MaxInt64)
		rctx, cancel := context.WithTimeout(ctx, t.cfg.RunTimeout)
		_, next, err := t.PollOnce(rctx)
		cancel()
		wait := t.cfg.MaxPollWait
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			t.cfg.Logger.Warn("timeout: poll failed", "err", err)
			wait = backoff.Next()
		default:
			backoff.Reset()
			now := t.cfg.Now()
			if !next.IsZero() {
				wait = min(wait, max(next.Sub(now), time.Millisecond))
			}
			// Publish the wake-up time, then look at what was scheduled
			// during the poll: an order scheduled from here on sees the
			// wake-up time and wakes the poller if it is due sooner.
			until := now.Add(wait).UnixMilli()
			t.sleepUntil.Store(until)
			if due := t.scheduled.Load(); due < until {
				wait = max(time.UnixMilli(due).Sub(now), time.Millisecond)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.wake:
		case <-time.After(wait):
		}
	}
}

// sweepLoop sweeps the database once per SweepInterval on one node at a
// time, for what the delay queue missed.
func (t *Timeouts) sweepLoop(ctx context.Context) {
	lock := job.Lock{Locker: t.cfg.Locker, Key: lock.SweepKey, TTL: t.cfg.SweepLockTTL, Log: t.cfg.Logger}
	job.Periodic(ctx, lock, t.cfg.SweepInterval, t.cfg.RunTimeout, func(rctx context.Context) {
		n, err := t.SweepOnce(rctx)
		switch {
		case err != nil && !errors.Is(err, context.Canceled) && ctx.Err() == nil:
			t.cfg.Logger.Warn("timeout: sweep failed", "err", err)
		case n > 0:
			t.cfg.Logger.Info("timeout: sweep expired orders the queue missed", "orders", n)
		}
	})
}
