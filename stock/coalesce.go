package stock

import (
	"context"
	"sync"
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
// On a Redis Cluster each master has a queue (and flights) of its own,
// chosen by the master the admission's slot is on: a pipeline goes to one
// node, so a node that stops answering holds up only the admissions it
// would have answered, never those of the other nodes queued behind or
// with them.
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
	q     *batchq.Queue[*admitCall] // a single Redis's; a cluster's while its masters are unknown
	stats *Stats

	cluster *redis.ClusterClient // nil: a single Redis
	masters sync.Map             // on a cluster: master address -> *batchq.Queue[*admitCall]
}

func newCoalescer(rdb redis.UniversalClient, stats *Stats) *coalescer {
	c := &coalescer{rdb: rdb, stats: stats}
	c.cluster, _ = rdb.(*redis.ClusterClient)
	c.q = c.newQueue()
	return c
}

func (c *coalescer) newQueue() *batchq.Queue[*admitCall] {
	return batchq.New(batchq.Config{Flights: maxFlights, MaxBatch: maxPipelined, MaxLeftNeeded: maxMinLeft}, c.pipeline)
}

// queue is the queue of the admission whose first key is key: the queue of
// the master its slot is on (go-redis's cached view of the cluster), or
// the one queue of a single Redis.
func (c *coalescer) queue(ctx context.Context, key string) *batchq.Queue[*admitCall] {
	if c.cluster == nil {
		return c.q
	}
	node, err := c.cluster.MasterForKey(ctx, key)
	if err != nil {
		return c.q // no view of the cluster yet: the command finds its node itself
	}
	addr := node.Options().Addr
	if q, ok := c.masters.Load(addr); ok {
		return q.(*batchq.Queue[*admitCall])
	}
	q, _ := c.masters.LoadOrStore(addr, c.newQueue())
	return q.(*batchq.Queue[*admitCall])
}

// queued is how many admissions wait in the queues (for tests).
func (c *coalescer) queued() int {
	_, n := c.q.Load()
	c.masters.Range(func(_, q any) bool {
		_, m := q.(*batchq.Queue[*admitCall]).Load()
		n += m
		return true
	})
	return n
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
	if err := c.queue(ctx, keys[0]).Do(ctx, call); err != nil {
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
