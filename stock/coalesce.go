package stock

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// The admissions of concurrent requests are sent to Redis together: each
// still runs the deduction script on its own (one EVALSHA per admission,
// atomic as before, with its own answer), but many go in one pipeline, so
// Redis reads and writes once for them all and the service makes one
// write and one read system call for them all instead of one each. Under a
// seckill burst that is most of what an admission costs both processes
// (a loopback write and read per call, on both sides).
//
// No timer, no goroutine: as the group commit of reservations
// (order/batch.go), a caller that finds fewer than maxFlights pipelines in
// flight sends what is queued (its own admission and those that queued
// meanwhile, up to maxPipelined) and answers every caller in it; the others
// wait. Alone, a caller sends at once: a pipeline of one, no wait.
//
// Deadlines: a caller whose context ends while it is still queued leaves
// (nothing was sent, nothing taken); a pipeline is sent under the earliest
// deadline of its callers, and an admission with less time left than a
// pipeline recently took is not put into one (it could only make the
// others fail with it), but answered context.DeadlineExceeded unsent.
const (
	maxFlights   = 2   // pipelines in flight at once
	maxPipelined = 128 // admissions per pipeline
	maxMinLeft   = 20 * time.Millisecond
)

// coalescer queues admissions and sends them in pipelines (see above).
type coalescer struct {
	rdb redis.UniversalClient

	mu     sync.Mutex
	queue  []*admitCall
	flying int

	avgNanos atomic.Int64 // a moving average of a pipeline's round trip
	stats    *Stats
}

// admitCall is one deduction script call: its keys and arguments, and once
// done the script's answer or the error.
type admitCall struct {
	keys     []string
	args     []any
	deadline time.Time // zero: none

	wake chan struct{} // buffered: the caller has something to do
	done bool
	res  []int64
	err  error
}

// run runs the deduction script for keys and args, in a pipeline with the
// admissions of other callers (see coalescer), and returns its answer.
func (c *coalescer) run(ctx context.Context, keys []string, args []any) ([]int64, error) {
	call := &admitCall{keys: keys, args: args, wake: make(chan struct{}, 1)}
	call.deadline, _ = ctx.Deadline()
	c.mu.Lock()
	c.queue = append(c.queue, call)
	ended := ctx.Done() // nil once seen: a caller whose pipeline is in flight waits for it
	for !call.done {
		if c.flying < maxFlights && len(c.queue) > 0 {
			c.send()
			continue
		}
		c.mu.Unlock()
		select {
		case <-call.wake:
		case <-ended:
			ended = nil
		}
		c.mu.Lock()
		if !call.done && ctx.Err() != nil && c.dequeue(call) {
			c.wakeHead()
			c.mu.Unlock()
			return nil, ctx.Err()
		}
	}
	c.mu.Unlock()
	return call.res, call.err
}

// send takes the queue's oldest admissions (up to maxPipelined) and sends
// them in one pipeline, c.mu released meanwhile; then it answers them and,
// a flight being free again, wakes the queue's head. Called with c.mu held.
func (c *coalescer) send() {
	batch := c.take()
	if len(batch) == 0 {
		return
	}
	c.flying++
	c.mu.Unlock()
	start := time.Now()
	ok := c.pipeline(batch)
	if ok {
		avg := c.avgNanos.Load()
		c.avgNanos.Store(avg + (int64(time.Since(start))-avg)/8)
	}
	c.stats.Pipelines.Add(1)
	c.stats.Pipelined.Add(int64(len(batch)))
	c.mu.Lock()
	for _, call := range batch {
		call.done = true
		call.signal()
	}
	c.flying--
	c.wakeHead()
}

// take takes the next pipeline's admissions off the queue, oldest first,
// answering unsent those whose deadline is nearer than a pipeline recently
// took (at most maxMinLeft). Called with c.mu held.
func (c *coalescer) take() []*admitCall {
	now := time.Now()
	minLeft := min(time.Duration(c.avgNanos.Load()), maxMinLeft)
	batch := make([]*admitCall, 0, min(len(c.queue), maxPipelined))
	n := 0
	for _, call := range c.queue {
		if len(batch) == maxPipelined {
			break
		}
		n++
		if !call.deadline.IsZero() && call.deadline.Sub(now) < minLeft {
			call.done, call.err = true, context.DeadlineExceeded
			call.signal()
			continue
		}
		batch = append(batch, call)
	}
	c.queue = c.queue[n:]
	return batch
}

// pipeline sends batch's script calls in one pipeline, under the earliest
// of their deadlines, and sets each call's answer. A call Redis answered
// NOSCRIPT (its script cache was flushed) is sent again alone, which loads
// the script. It reports whether Redis answered the pipeline.
func (c *coalescer) pipeline(batch []*admitCall) bool {
	ctx := context.Background()
	var earliest time.Time
	for _, call := range batch {
		if !call.deadline.IsZero() && (earliest.IsZero() || call.deadline.Before(earliest)) {
			earliest = call.deadline
		}
	}
	if !earliest.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, earliest)
		defer cancel()
	}
	pipe := c.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(batch))
	for i, call := range batch {
		cmds[i] = deductScript.EvalSha(ctx, pipe, call.keys, call.args...)
	}
	_, err := pipe.Exec(ctx) // each command's own error is read below
	for i, call := range batch {
		cmd := cmds[i]
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			cmd = deductScript.Run(ctx, c.rdb, call.keys, call.args...)
		}
		call.res, call.err = scriptAnswer(cmd)
	}
	_, answered := err.(redis.Error) // a command's own error reply: Redis did answer
	return err == nil || answered
}

// scriptAnswer is the deduction script's two integers, or the command's error.
func scriptAnswer(cmd *redis.Cmd) ([]int64, error) {
	res, err := cmd.Int64Slice()
	if err != nil {
		return nil, err
	}
	if len(res) != 2 {
		return nil, errScriptAnswer
	}
	return res, nil
}

// wakeHead wakes the oldest queued caller if a flight is free, so it sends
// the next pipeline. Called with c.mu held.
func (c *coalescer) wakeHead() {
	if c.flying < maxFlights && len(c.queue) > 0 {
		c.queue[0].signal()
	}
}

// signal wakes call's caller (at most one wake-up is pending).
func (call *admitCall) signal() {
	select {
	case call.wake <- struct{}{}:
	default:
	}
}

// dequeue takes call out of the queue if it is still there (not yet sent).
// Called with c.mu held.
func (c *coalescer) dequeue(call *admitCall) bool {
	if i := slices.Index(c.queue, call); i >= 0 {
		c.queue = slices.Delete(c.queue, i, i+1)
		return true
	}
	return false
}
