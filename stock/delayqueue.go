package stock

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// DelayQueue is the Redis side of the timeout release (internal/expiry
// decides when to poll and what to do with a claimed order): order ids in
// sorted sets scored by deadline, sharded so that no key and no Cluster
// slot carries every order. An order waits in shard fnv32a(id) mod shards;
// each shard's due and claimed sets share one hash tag (the claim script
// needs both in one slot), and the shards' tags hash to different slots.
//
// A claim moves due entries into the shard's claimed set under a lease, so
// two pollers never claim one entry; the poller drops (Done) what it
// handled, and a claim whose lease ends (its poller died) is claimed again.
// The legacy queue (the unsharded one of earlier versions) is only claimed
// from and drained, never added to.
type DelayQueue struct {
	rdb    redis.UniversalClient
	shards []queuePair
	legacy queuePair
}

// Queue names one queue of a DelayQueue: a shard 0..Shards()-1, or Legacy.
type Queue int

// Legacy is the unsharded queue of earlier versions.
const Legacy Queue = -1

type queuePair struct{ due, claimed string }

// NewDelayQueue is the delay queue on rdb with the given number of shards
// (every node must use the same number).
func NewDelayQueue(rdb redis.UniversalClient, shards int) *DelayQueue {
	q := &DelayQueue{rdb: rdb, shards: make([]queuePair, shards),
		legacy: queuePair{legacyTimeoutDueKey, legacyTimeoutClaimedKey}}
	for i := range q.shards {
		q.shards[i] = queuePair{timeoutDueKey(i), timeoutClaimedKey(i)}
	}
	return q
}

// Shards is how many shards the queue has.
func (q *DelayQueue) Shards() int { return len(q.shards) }

func (q *DelayQueue) pair(n Queue) queuePair {
	if n == Legacy {
		return q.legacy
	}
	return q.shards[n]
}

// ShardOf is the shard order id waits in: a stable hash, the same on every node.
func (q *DelayQueue) ShardOf(id string) Queue {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return Queue(h.Sum32() % uint32(len(q.shards)))
}

// Entry is one order on the queue and its deadline.
type Entry struct {
	ID       string
	Deadline time.Time
}

// DueMillis is an entry's score: its deadline rounded up to the
// millisecond, so it is never claimed before the database agrees it is due.
func DueMillis(deadline time.Time) int64 { return (deadline.UnixMicro() + 999) / 1000 }

// Add puts entries on their shards, in one round trip (one pipeline of a
// ZADD per shard). An entry already there moves to its new deadline.
func (q *DelayQueue) Add(ctx context.Context, entries ...Entry) error {
	if len(entries) == 0 {
		return nil
	}
	byShard := map[Queue][]redis.Z{}
	for _, e := range entries {
		n := q.ShardOf(e.ID)
		byShard[n] = append(byShard[n], redis.Z{Score: float64(DueMillis(e.Deadline)), Member: e.ID})
	}
	if len(byShard) == 1 {
		for n, zs := range byShard {
			return q.rdb.ZAdd(ctx, q.pair(n).due, zs...).Err()
		}
	}
	pipe := q.rdb.Pipeline()
	for n, zs := range byShard {
		pipe.ZAdd(ctx, q.pair(n).due, zs...)
	}
	_, err := pipe.Exec(ctx)
	return err
}

// Remove drops order id from its shard's due set (an order that finished
// before its deadline).
func (q *DelayQueue) Remove(ctx context.Context, id string) error {
	return q.rdb.ZRem(ctx, q.pair(q.ShardOf(id)).due, id).Err()
}

// claimScript hands due orders of one queue to one poller.
//
//	KEYS[1] due  KEYS[2] claimed
//	ARGV[1] now (unix ms)  ARGV[2] limit  ARGV[3] lease (ms)
//
// Moves up to limit entries whose deadline passed, plus claims whose lease
// ran out (their poller died), into claimed with a new lease, atomically, so
// two pollers never claim the same entry. Returns {next, id...}: next is the
// earliest score left in either set as a decimal string ("-1" when both are
// empty).
var claimScript = redis.NewScript(`
local now, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)
if #out < limit then
  local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, limit - #out)
  for _, id in ipairs(due) do
    redis.call('ZREM', KEYS[1], id)
    out[#out + 1] = id
  end
end
local lease = now + tonumber(ARGV[3])
for _, id in ipairs(out) do redis.call('ZADD', KEYS[2], lease, id) end
local next = -1
for _, k in ipairs(KEYS) do
  local head = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
  if head[2] and (next == -1 or tonumber(head[2]) < next) then next = tonumber(head[2]) end
end
table.insert(out, 1, string.format('%d', next))
return out
`)

// Claimed is what one claim took from one queue.
type Claimed struct {
	OK   bool     // the claim ran (if not, Claim's error says why)
	IDs  []string // the orders claimed, under the lease
	Next int64    // the earliest score left in the queue (unix ms), -1 if none
}

// Claim takes up to limit due entries (and expired claims) from each of
// queues under a lease, in one round trip (a pipeline of the claim script;
// on Cluster, one request per master, sent at once). Out[i] is queues[i]'s;
// a queue whose claim failed has OK false and its error joined in err.
func (q *DelayQueue) Claim(ctx context.Context, queues []Queue, now time.Time, limit int, lease time.Duration) ([]Claimed, error) {
	args := []any{now.UnixMilli(), limit, lease.Milliseconds()}
	pipe := q.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(queues))
	for i, n := range queues {
		p := q.pair(n)
		cmds[i] = claimScript.EvalSha(ctx, pipe, []string{p.due, p.claimed}, args...)
	}
	_, _ = pipe.Exec(ctx) // each command's own error is looked at below
	out := make([]Claimed, len(queues))
	var errs []error
	for i, cmd := range cmds {
		out[i].Next = -1
		p := q.pair(queues[i])
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			// This server has not seen the script yet (a restart, a new
			// master): nothing ran, and EVAL loads it.
			cmd = claimScript.Run(ctx, q.rdb, []string{p.due, p.claimed}, args...)
		}
		res, err := cmd.StringSlice()
		if err == nil && len(res) == 0 {
			err = errors.New("the claim script answered nothing")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("stock: claim from %s: %w", p.due, err))
			continue
		}
		next, _ := strconv.ParseInt(res[0], 10, 64)
		out[i] = Claimed{OK: true, IDs: res[1:], Next: next}
	}
	return out, errors.Join(errs...)
}

// Done drops claims their poller finished with, in one round trip: done[n]
// are ids claimed from queue n.
func (q *DelayQueue) Done(ctx context.Context, done map[Queue][]string) error {
	pipe := q.rdb.Pipeline()
	for n, ids := range done {
		if len(ids) == 0 {
			continue
		}
		members := make([]any, len(ids))
		for i, id := range ids {
			members[i] = id
		}
		pipe.ZRem(ctx, q.pair(n).claimed, members...)
	}
	if pipe.Len() == 0 {
		return nil
	}
	_, err := pipe.Exec(ctx)
	return err
}
