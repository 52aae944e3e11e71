// Package stocksync is the sync path: it carries the stock operations the
// order lifecycle recorded in the outbox to the ordered topic and from it
// into the database, once in effect. The Relay publishes outbox rows (key =
// SKU, so each SKU keeps its order) on one node at a time; the Applier is the
// consumer's handler and settles each delivery through the arbiter, which
// decides by the reservation's state. Neither knows about orders.
package stocksync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/job"
	"github.com/acme/inventory/internal/lock"
	"github.com/acme/inventory/mq"
)

// RelayConfig tunes a Relay.
type RelayConfig struct {
	// Interval between polls when nothing wakes the relay. Default 200ms.
	Interval time.Duration
	// Batch bounds the rows read per round. Default 200.
	Batch int
	// Parallel bounds the SKUs whose messages are being sent at once; each
	// SKU's own messages go out one request after another. Default 8.
	Parallel int
	// LockTTL is the single-runner lock's expiry (renewed while running).
	// Default DefaultRelayLockTTL.
	LockTTL time.Duration
	Logger  *slog.Logger
	// Now is the clock a held-back SKU's wait is measured by. Default time.Now.
	Now func() time.Time
	// AfterSend, for fault-injection tests, runs after each send and before the row is marked
	// sent; an error stops the round there, as a crash would: nothing of the
	// round is marked sent.
	AfterSend func(row arbiter.OutboxRow) error
}

// DefaultRelayLockTTL is the relay lock's default expiry. When the node
// leading the relay dies, nothing is published until its lock lapses (up to
// this long after its last renewal, every third of it) and another node's
// next attempt (every half of it, jittered) takes it: at most 1.5× this,
// 2-3 s. It must stay below the consumer's own takeover after a crash (about
// 4 s: docs/design.md, "When a node dies"), or the sync's resumption after a
// crash is the relay's, not the consumer's: with 10 s it was 6-15 s when the
// dead node also led the relay, against SPEC's 5 s. A renewal that fails for
// this long (a Redis stall, a pause) hands the relay over; sending a row
// twice is harmless (the consumer's ledger), so a short lock costs only its
// renewals.
const DefaultRelayLockTTL = 2 * time.Second

// Relay publishes outbox rows to the ordered topic, on one node at a time (a
// distributed lock, renewed while it runs). Each SKU's rows go out in id
// order; different SKUs go out concurrently, and a SKU whose send fails is
// held back (with its own backoff) while the others go on. A crash between
// the send and marking the row sent sends it again later: the consumer's
// ledger makes that harmless. A row is never sent before its transaction
// commits.
type Relay struct {
	db       *gorm.DB
	producer mq.Producer
	locker   *lock.Locker
	cfg      RelayConfig
	wake     chan struct{}
	run      job.Runner

	mu   sync.Mutex
	held map[string]heldBack // SKUs whose last send failed

	// Sent counts the messages this relay published.
	Sent atomic.Int64
	// Leading says whether this node leads the relay now.
	Leading atomic.Bool
}

// heldBack is a SKU whose send failed: its rows are not read again before
// until, so a SKU that keeps failing neither fills every batch nor slows
// the others down.
type heldBack struct {
	until time.Time
	delay time.Duration // the last wait; doubled on each failure
}

const (
	// maxSKUBackoff bounds the wait of a SKU that keeps failing, and of the
	// relay after failed rounds.
	maxSKUBackoff = 5 * time.Second
	// maxHeldInQuery bounds the SKUs the outbox query leaves out; rows of
	// further held-back SKUs are read and skipped.
	maxHeldInQuery = 500
)

func NewRelay(db *gorm.DB, p mq.Producer, locker *lock.Locker, cfg RelayConfig) *Relay {
	if cfg.Interval <= 0 {
		cfg.Interval = 200 * time.Millisecond
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 200
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 8
	}
	if cfg.LockTTL <= 0 {
		cfg.LockTTL = DefaultRelayLockTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Relay{db: db, producer: p, locker: locker, cfg: cfg, wake: make(chan struct{}, 1), held: map[string]heldBack{}}
}

// Wake makes the relay look at the outbox now (after a commit).
func (r *Relay) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Start runs the relay until Stop; a second Start is a no-op.
func (r *Relay) Start(ctx context.Context) { r.run.Start(ctx, r.loop) }

// Stop ends the relay and waits for it; safe before Start and twice.
func (r *Relay) Stop() { r.run.Stop() }

func (r *Relay) loop(ctx context.Context) {
	job.Lead(ctx, job.Lock{Locker: r.locker, Key: lock.RelayKey, TTL: r.cfg.LockTTL, Log: r.cfg.Logger}, r.lead)
}

// lead relays while this node holds the lock (ctx ends when it is lost).
func (r *Relay) lead(ctx context.Context) {
	r.Leading.Store(true)
	defer r.Leading.Store(false)
	backoff := job.Backoff{Min: r.cfg.Interval, Max: maxSKUBackoff}
	var warned time.Time // failed sends are logged at most once a second
	for ctx.Err() == nil {
		read, sent, failed, err := r.round(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			r.cfg.Logger.Warn("relay: round failed", "err", err)
			job.Sleep(ctx, backoff.Next(), r.wake)
			continue
		case failed != nil && time.Since(warned) >= time.Second:
			// Those SKUs wait on their own backoff; the others go on.
			r.cfg.Logger.Warn("relay: held back SKUs whose send failed", "err", failed)
			warned = time.Now()
		}
		backoff.Reset()
		if read == r.cfg.Batch && sent > 0 {
			continue // more waiting
		}
		job.Sleep(ctx, r.cfg.Interval, r.wake)
	}
}

// maxRun bounds the messages of one send request.
const maxRun = 128

// skuRuns is one SKU's rows of a round, in id order, in chunks of at most
// maxRun (one send request each).
type skuRuns struct {
	sku  string
	runs [][]arbiter.OutboxRow
}

// runsBySKU groups rows (in id order) by SKU, keeping id order within each
// SKU; the SKUs come in the order of their oldest row.
func runsBySKU(rows []arbiter.OutboxRow) []skuRuns {
	var order []string
	by := map[string][]arbiter.OutboxRow{}
	for _, row := range rows {
		if _, ok := by[row.SKU]; !ok {
			order = append(order, row.SKU)
		}
		by[row.SKU] = append(by[row.SKU], row)
	}
	out := make([]skuRuns, len(order))
	for i, sku := range order {
		out[i].sku = sku
		for rs := by[sku]; len(rs) > 0; {
			n := min(len(rs), maxRun)
			out[i].runs = append(out[i].runs, rs[:n])
			rs = rs[n:]
		}
	}
	return out
}

// RelayOnce sends up to one batch of unsent rows and marks them sent; it
// returns how many it sent. The rows of a SKU whose send failed stay unsent
// (and the SKU is held back for a while); the error names it, and the other
// SKUs' rows are sent and marked all the same.
func (r *Relay) RelayOnce(ctx context.Context) (int, error) {
	_, sent, failed, err := r.round(ctx)
	return sent, errors.Join(failed, err)
}

// SendError is a round's failed sends: the SKUs named were held back, and
// the other SKUs' rows went out.
type SendError struct {
	SKUs []string
	Errs []error // one per SKU
}

func (e *SendError) Error() string {
	msg := fmt.Sprintf("relay: sending %s failed: %v", e.SKUs[0], e.Errs[0])
	if len(e.SKUs) > 1 {
		msg += fmt.Sprintf(" (and %d more SKUs)", len(e.SKUs)-1)
	}
	return msg
}

func (e *SendError) Unwrap() []error { return e.Errs }

// round reads up to one batch of unsent rows (leaving out held-back SKUs),
// sends each SKU's runs in order, up to Parallel SKUs at once, and marks what
// went out in one update. It returns the rows read and sent, the failed sends
// (a *SendError, nil if none) and an error that stopped the round (nothing
// of it is marked sent then).
func (r *Relay) round(ctx context.Context) (read, sent int, failed, err error) {
	held := r.heldSKUs(r.cfg.Now())
	skip := make([]string, 0, min(len(held), maxHeldInQuery))
	for sku := range held {
		if len(skip) == maxHeldInQuery {
			break
		}
		skip = append(skip, sku)
	}
	rows, err := arbiter.OutboxOf(r.db.WithContext(ctx)).Unsent(skip, r.cfg.Batch)
	if err != nil {
		return 0, 0, nil, err
	}
	groups := runsBySKU(slices.DeleteFunc(slices.Clone(rows), func(row arbiter.OutboxRow) bool { return held[row.SKU] }))

	// One goroutine per SKU, at most Parallel at once: a SKU's rows go out in
	// one request per run, in id order, and stop at its first failure, so its
	// later rows never pass the failed ones.
	type result struct {
		ids   []int64
		err   error // the send that failed
		crash error // AfterSend stopped the round
	}
	results := make([]result, len(groups))
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	sem := make(chan struct{}, r.cfg.Parallel)
	var wg sync.WaitGroup
	for i, g := range groups {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			res := &results[i]
			for _, run := range g.runs {
				if res.err = r.send(sctx, run); res.err != nil {
					return
				}
				if r.cfg.AfterSend != nil {
					if res.crash = r.cfg.AfterSend(run[0]); res.crash != nil {
						stop()
						return
					}
				}
				for _, row := range run {
					res.ids = append(res.ids, row.ID)
				}
			}
		})
	}
	wg.Wait()

	var ids []int64
	fails := &SendError{}
	for i, res := range results {
		if res.crash != nil {
			return len(rows), 0, nil, res.crash // "crash": the sent rows stay unmarked
		}
		ids = append(ids, res.ids...)
		if res.err != nil {
			fails.SKUs = append(fails.SKUs, groups[i].sku)
			fails.Errs = append(fails.Errs, res.err)
		}
	}
	if len(ids) > 0 {
		// The rows are sent: marking them must not be cut short by Stop
		// cancelling ctx, or every shutdown would send them again.
		mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := arbiter.OutboxOf(r.db.WithContext(mctx)).MarkSent(ids, time.Now().UTC()); err != nil {
			return len(rows), 0, nil, fmt.Errorf("relay: marking sent: %w", err)
		}
		r.Sent.Add(int64(len(ids)))
	}
	r.holdBack(groups, fails.SKUs)
	if len(fails.SKUs) == 0 {
		return len(rows), len(ids), nil, nil
	}
	return len(rows), len(ids), fails, nil
}

// send publishes one run of one SKU's rows in one request.
func (r *Relay) send(ctx context.Context, run []arbiter.OutboxRow) error {
	msgs := make([]mq.Message, len(run))
	for i, row := range run {
		body, _ := json.Marshal(arbiter.StockMessage{Token: row.Token, SKU: row.SKU, Op: row.Op, Qty: row.Qty})
		msgs[i] = mq.Message{Key: row.SKU, Body: body}
	}
	return r.producer.Send(ctx, msgs...)
}

// heldSKUs is the set of SKUs not to read at now.
func (r *Relay) heldSKUs(now time.Time) map[string]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]bool{}
	for sku, h := range r.held {
		if now.Before(h.until) {
			out[sku] = true
		}
	}
	return out
}

// holdBack holds back the SKUs whose send failed (a jittered wait, doubled
// on each failure in a row) and forgets the others of the round.
func (r *Relay) holdBack(groups []skuRuns, failed []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.cfg.Now()
	for _, sku := range failed {
		d := r.cfg.Interval
		if h, ok := r.held[sku]; ok {
			d = min(2*h.delay, maxSKUBackoff)
		}
		r.held[sku] = heldBack{until: now.Add(job.Jitter(d)), delay: d}
	}
	for _, g := range groups {
		if !slices.Contains(failed, g.sku) {
			delete(r.held, g.sku)
		}
	}
}
