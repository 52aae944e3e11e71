package breaker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// ShardIdle is how long a shard may go unasked before Shards stops
// counting it (a node the cluster no longer routes to: removed, or a
// master replaced by its replica). While the service runs, every master is
// asked at least once a second (the timeout release polls every shard of
// its delay queue).
const ShardIdle = time.Minute

// Shards are the breakers of a sharded dependency, one per node: a Redis
// Cluster node that stops answering refuses the calls that need it, fast,
// while the other nodes keep serving theirs.
type Shards struct {
	name string
	s    Settings
	rdb  *redis.ClusterClient

	mu sync.Mutex
	m  map[string]*shard // by node address
}

type shard struct {
	b      *Breaker
	client atomic.Pointer[redis.Client] // the node's current client, which the probe pings
	asked  atomic.Int64                 // unix nanoseconds of the last call a caller made (not a probe's)
}

// RedisCluster gives every node client rdb makes (go-redis's OnNewNode) a
// breaker of its own, keyed by the node's address, under which all its
// commands and pipelines run (a cluster pipeline is split by node, so each
// part passes its node's breaker). Settings.Probe is ignored: a shard's
// probe pings its node. Call it before rdb's first command. A client that
// go-redis makes again for an address (after dropping an unused one) gets
// the address's breaker back.
func RedisCluster(rdb *redis.ClusterClient, name string, s Settings) *Shards {
	sh := &Shards{name: name, s: s, rdb: rdb, m: map[string]*shard{}}
	rdb.OnNewNode(sh.attach)
	return sh
}

func (sh *Shards) attach(node *redis.Client) {
	addr := node.Options().Addr
	sh.mu.Lock()
	n, ok := sh.m[addr]
	if !ok {
		n = &shard{}
		s := sh.s
		s.Probe = func(ctx context.Context) error { return n.client.Load().Ping(ctx).Err() }
		n.b = newBreaker(sh.name, addr, s)
		sh.m[addr] = n
	}
	sh.mu.Unlock()
	n.client.Store(node)
	node.AddHook(shardHook{redisHook: redisHook{n.b}, n: n})
}

// shardHook is a node's redisHook that also records when callers last
// asked the node.
type shardHook struct {
	redisHook
	n *shard
}

func (h shardHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	guarded := h.redisHook.ProcessHook(next)
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.touch(ctx)
		return guarded(ctx, cmd)
	}
}

func (h shardHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	guarded := h.redisHook.ProcessPipelineHook(next)
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.touch(ctx)
		return guarded(ctx, cmds)
	}
}

// touch records a caller's call (at most one store a second).
func (n *shard) touch(ctx context.Context) {
	if ctx.Value(probeKey{}) != nil {
		return
	}
	if now := time.Now().UnixNano(); now-n.asked.Load() > int64(time.Second) {
		n.asked.Store(now)
	}
}

// Breakers are the breakers of the shards callers asked within ShardIdle
// (all of them if none was), in address order.
func (sh *Shards) Breakers() []*Breaker {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	since := time.Now().Add(-ShardIdle).UnixNano()
	var active, all []*Breaker
	for _, n := range sh.m {
		all = append(all, n.b)
		if n.asked.Load() >= since {
			active = append(active, n.b)
		}
	}
	if len(active) == 0 {
		active = all
	}
	slices.SortFunc(active, func(a, b *Breaker) int { return strings.Compare(a.shard, b.shard) })
	return active
}

// Err is nil while every shard's breaker is closed, and otherwise says
// which shards are refused (their OpenErrors; errors.Is(err, ErrOpen)).
func (sh *Shards) Err() error {
	bs := sh.Breakers()
	var open []error
	for _, b := range bs {
		if err := b.Err(); err != nil {
			open = append(open, err)
		}
	}
	if len(open) == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d %s shards unavailable: %w", len(open), len(bs), sh.name, joined(open))
}

// Check reports whether the dependency can serve anything (readiness): nil
// while at least one shard answers (Breaker.Check, the shards at once),
// otherwise every shard's error. A node whose shard is down is still
// ready to sell what the other shards hold: Err says which are down.
// Before the client has met any node, it pings the cluster.
func (sh *Shards) Check(ctx context.Context) error {
	bs := sh.Breakers()
	if len(bs) == 0 {
		return sh.rdb.Ping(ctx).Err()
	}
	errs := make([]error, len(bs))
	var wg sync.WaitGroup
	for i, b := range bs {
		wg.Go(func() {
			if err := b.Check(ctx); err != nil && !errors.Is(err, ErrOpen) {
				errs[i] = fmt.Errorf("%s: %w", b.label(), err)
			} else {
				errs[i] = err
			}
		})
	}
	wg.Wait()
	if slices.Contains(errs, nil) {
		return nil
	}
	return fmt.Errorf("no %s shard answers: %w", sh.name, joined(errs))
}

// joined is errors.Join on one line.
type joined []error

func (j joined) Error() string {
	msgs := make([]string, len(j))
	for i, err := range j {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}

func (j joined) Unwrap() []error { return j }
