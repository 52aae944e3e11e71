package stock

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/acme/inventory/internal/batchq"
)

// The admissions of concurrent requests are sent to Redis together: each
// still runs the deduction script on its own (one EVALSHA per admission,
// atomic as before, with its own answer), but many go in one pipeline, so
// Redis reads and writes once for them all and the service makes one
// write and one read system call for them all instead of one each. Under a
// seckill burst that is most of what an admission costs both processes
// (a loopback write and read per call, on both sides).
//
// The callers take turns through internal/batchq's queue, as the group
// commit of reservations does (order/batch.go): a caller that finds fewer
// than maxFlights pipelines in flight sends what is queued (its own
// admission and those that queued meanwhile, up to maxPipelined) and
// answers every caller in it; the others wait. Alone, a caller sends at
// once: a pipeline of one, no wait. No timer, no goroutine.
//
// Deadlines: a caller whose context ends while it is still queued leaves
// (nothing was sent, nothing taken); a pipeline is sent under the earliest
// deadline of its callers, and an admission with less time left than a
// pipeline recently took (at most maxMinLeft) is not put into one (it
// could only make the others fail with it), but answered
// context.DeadlineExceeded unsent.
const (
	maxFlights   = 2   // pipelines in flight at once
	maxPipelined = 128 // admissions per pipeline
	maxMinLeft   = 20 * time.Millisecond
)

// coalescer sends admissions in pipelines (see above).
type coalescer struct {
	rdb   redis.UniversalClient
	q     *batchq.Queue[*admitCall]
	stats *Stats
}

func newCoalescer(rdb redis.UniversalClient, stats *Stats) *coalescer {
	c := &coalescer{rdb: rdb, stats: stats}
	c.q = batchq.New(batchq.Config{Flights: maxFlights, MaxBatch: maxPipelined, MaxLeftNeeded: maxMinLeft}, c.pipeline)
	return c
}

// admitCall is one deduction script call: its keys and arguments, and once
// sent the script's answer or the error.
type admitCall struct {
	keys []string
	args []any
	res  []int64
	err  error
}

// run runs the deduction script for keys and args, in a pipeline with the
// admissions of other callers (see coalescer), and returns its answer.
func (c *coalescer) run(ctx context.Context, keys []string, args []any) ([]int64, error) {
	call := &admitCall{keys: keys, args: args}
	if err := c.q.Do(ctx, call); err != nil {
		return nil, err
	}
	return call.res, call.err
}

// pipeline sends batch's script calls in one pipeline under ctx (its
// earliest deadline), and sets each call's answer. A call Redis answered
// NOSCRIPT (its script cache was flushed) is sent again alone, which loads
// the script. It reports whether Redis answered the pipeline.
func (c *coalescer) pipeline(ctx context.Context, batch []*admitCall) bool {
	c.stats.Pipelines.Add(1)
	c.stats.Pipelined.Add(int64(len(batch)))
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
