// Package batchq lets concurrent callers share round trips to a server:
// each caller queues its item, and a caller that finds fewer than
// Config.Flights batches in flight takes what is queued (oldest first, up
// to Config.MaxBatch) and sends it itself, while the others wait to be
// answered or to take the next batch. No timer and no goroutine of its own:
// alone, a caller sends at once, a batch of one; under load one round trip
// serves many. The group commit of reservations (order/batch.go) and the
// pipelines of admissions to Redis (stock/coalesce.go) are its two users.
//
// Deadlines: a caller whose context ends while its item is still queued
// leaves the queue (nothing sent); Send gets its batch's earliest
// deadline; an item with less time left than a recent successful batch
// took (at most Config.MaxLeftNeeded) is not taken into one, where it could
// only make the others fail with it, and is answered Config.Late unsent. A
// caller whose batch is in flight waits for it, past its own deadline if
// need be: Send's context ends at the batch's deadline.
package batchq

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Config shapes a Queue.
type Config struct {
	Flights  int // batches in flight at once (> 0)
	MaxBatch int // items per batch (> 0)
	// MaxQueued bounds the items waiting; past it Do refuses at once with
	// Full. 0: unbounded.
	MaxQueued int
	// MaxLeftNeeded caps the time left an item needs to be taken into a batch,
	// so an item with most of its deadline left is always taken however
	// slow recent batches were.
	MaxLeftNeeded time.Duration
	// Full is Do's error when the queue is full; Late its error for an item
	// given up unsent (its context ended while queued, or too little of it
	// was left to be taken). Late nil: the context's own error.
	Full, Late error
}

// Send sends a batch under ctx, which ends at the batch's earliest deadline
// (none if no item has one) and carries no caller's cancellation: a batch
// in flight is for all its callers. It sets each item's answer in the item;
// it runs on one caller's goroutine, the queue's lock released, and reports
// whether the server answered the batch (only those batches move the
// average a batch takes).
type Send[T any] func(ctx context.Context, batch []T) bool

// Queue is a queue of items of type T (pointers to the callers' requests,
// in which Send writes their answers).
type Queue[T any] struct {
	cfg  Config
	send Send[T]

	mu     sync.Mutex
	queue  []*waiter[T]
	flying int

	avgNanos atomic.Int64 // a moving average of a successful batch's duration
}

type waiter[T any] struct {
	item     T
	deadline time.Time     // zero: none
	wake     chan struct{} // buffered: the caller has something to do
	done     bool
	err      error // the queue's own answer: given up unsent
}

// New returns a Queue whose batches send sends.
func New[T any](cfg Config, send Send[T]) *Queue[T] {
	return &Queue[T]{cfg: cfg, send: send}
}

// Do queues item and returns once it was sent and answered (nil: Send set
// its answer in item) or given up unsent (Config.Full, Config.Late or the
// context's error).
//
// A waiting caller is woken only when it has something to do: its item is
// done, or it is the oldest queued and a flight is free (a batch that ends
// wakes its callers and the queue's head, not every caller).
func (q *Queue[T]) Do(ctx context.Context, item T) error {
	w := &waiter[T]{item: item, wake: make(chan struct{}, 1)}
	w.deadline, _ = ctx.Deadline()
	q.mu.Lock()
	if q.cfg.MaxQueued > 0 && len(q.queue) >= q.cfg.MaxQueued {
		q.mu.Unlock()
		return q.cfg.Full
	}
	q.queue = append(q.queue, w)
	ended := ctx.Done() // nil once seen: a caller whose batch is in flight waits for it
	for !w.done {
		if q.flying < q.cfg.Flights && len(q.queue) > 0 {
			q.flight()
			continue
		}
		q.mu.Unlock()
		select {
		case <-w.wake:
		case <-ended:
			ended = nil
		}
		q.mu.Lock()
		if !w.done && ctx.Err() != nil && q.dequeue(w) {
			q.wakeHead()
			q.mu.Unlock()
			return q.late(ctx.Err())
		}
	}
	q.mu.Unlock()
	return w.err
}

// Load is how many batches are in flight and how many items are queued.
func (q *Queue[T]) Load() (flying, queued int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.flying, len(q.queue)
}

// Average is the moving average of a successful batch's duration.
func (q *Queue[T]) Average() time.Duration { return time.Duration(q.avgNanos.Load()) }

// SetAverage sets it (tests: a history of slow batches).
func (q *Queue[T]) SetAverage(d time.Duration) { q.avgNanos.Store(int64(d)) }

func (q *Queue[T]) late(ctxErr error) error {
	if q.cfg.Late != nil {
		return q.cfg.Late
	}
	return ctxErr
}

// flight takes a batch off the queue and sends it, q.mu released
// meanwhile; then it answers the batch's callers and, a flight being free
// again, wakes the queue's head. Called with q.mu held.
func (q *Queue[T]) flight() {
	batch, deadline := q.take()
	if len(batch) == 0 {
		return
	}
	q.flying++
	items := make([]T, len(batch))
	for i, w := range batch {
		items[i] = w.item
	}
	q.mu.Unlock()
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if !deadline.IsZero() {
		ctx, cancel = context.WithDeadline(ctx, deadline)
	}
	start := time.Now()
	ok := q.send(ctx, items)
	cancel()
	if ok { // a batch that failed says nothing of how long one takes
		avg := q.avgNanos.Load()
		q.avgNanos.Store(avg + (int64(time.Since(start))-avg)/8)
	}
	q.mu.Lock()
	for _, w := range batch {
		w.done = true
		w.signal()
	}
	q.flying--
	q.wakeHead()
}

// take takes the next batch off the queue, oldest first, answering unsent
// those whose deadline is nearer than a recent batch took (at most
// MaxLeftNeeded), and returns it with its earliest deadline. Called with q.mu
// held.
func (q *Queue[T]) take() ([]*waiter[T], time.Time) {
	now := time.Now()
	minLeft := min(time.Duration(q.avgNanos.Load()), q.cfg.MaxLeftNeeded)
	batch := make([]*waiter[T], 0, min(len(q.queue), q.cfg.MaxBatch))
	var earliest time.Time
	n := 0
	for _, w := range q.queue {
		if len(batch) == q.cfg.MaxBatch {
			break
		}
		n++
		if !w.deadline.IsZero() && w.deadline.Sub(now) < minLeft {
			w.done, w.err = true, q.late(context.DeadlineExceeded)
			w.signal()
			continue
		}
		if !w.deadline.IsZero() && (earliest.IsZero() || w.deadline.Before(earliest)) {
			earliest = w.deadline
		}
		batch = append(batch, w)
	}
	q.queue = q.queue[n:]
	return batch, earliest
}

// wakeHead wakes the oldest queued caller if a flight is free, so it sends
// the next batch. Called with q.mu held.
func (q *Queue[T]) wakeHead() {
	if q.flying < q.cfg.Flights && len(q.queue) > 0 {
		q.queue[0].signal()
	}
}

// signal wakes w's caller (at most one wake-up is pending).
func (w *waiter[T]) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// dequeue takes w out of the queue if it is still there (not yet taken).
// Called with q.mu held.
func (q *Queue[T]) dequeue(w *waiter[T]) bool {
	if i := slices.Index(q.queue, w); i >= 0 {
		q.queue = slices.Delete(q.queue, i, i+1)
		return true
	}
	return false
}
