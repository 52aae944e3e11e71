package expiry

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/groupcommit"
	"github.com/acme/inventory/internal/lock"
	"github.com/acme/inventory/internal/maintenance"
	"github.com/acme/inventory/internal/tokens"
	"github.com/acme/inventory/order"
	"github.com/acme/inventory/stock"
	"github.com/acme/inventory/testkit/testenv"
)

// node is one more service instance on rig's database, Redis and clock.
type node struct {
	st     *stock.Store
	svc    *order.Service
	tokens *tokens.Service
	tm     *Timeouts
}

func (r *rig) node(cfg TimeoutConfig) *node {
	r.t.Helper()
	st, err := stock.NewStore(r.rdb, stock.Config{Init: arbiter.InitFunc(r.db)})
	require.NoError(r.t, err)
	n := &node{st: st}
	n.svc = order.NewService(r.db, st, order.Config{TTL: 15 * time.Minute, Now: r.clock.Now,
		OnCreated:  func(ctx context.Context, o *order.Order) { n.tm.Schedule(ctx, o.ID, o.ExpiresAt) },
		OnFinished: func(ctx context.Context, o *order.Order) { n.tm.Unschedule(ctx, o.ID) },
		OnExtended: func(ctx context.Context, id string, deadline time.Time) { n.tm.Schedule(ctx, id, deadline) }})
	r.t.Cleanup(func() { _ = n.svc.Close() })
	commits := groupcommit.New(r.db)
	r.t.Cleanup(func() { _ = commits.Close() })
	n.tokens = tokens.New(r.db, st, commits, tokens.Config{TTL: 15 * time.Minute, Now: r.clock.Now})
	cfg.Now, cfg.Locker, cfg.Holds = r.clock.Now, st.Locker(), n.tokens
	n.tm, err = NewTimeouts(n.svc, r.rdb, cfg)
	require.NoError(r.t, err)
	r.t.Cleanup(n.tm.Stop)
	return n
}

var fastTimeouts = TimeoutConfig{MaxPollWait: 20 * time.Millisecond, SweepInterval: 50 * time.Millisecond, SweepLockTTL: time.Second}

func (r *rig) createOrders(svc *order.Service, n int, skus ...string) []string {
	r.t.Helper()
	ids := make([]string, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			o, err := svc.Create(context.Background(), fmt.Sprintf("u%d", i), "", line(skus[i%len(skus)], 1+int64(i%2)))
			if err != nil {
				r.t.Error(err)
				return
			}
			ids[i] = o.ID
		}()
	}
	wg.Wait()
	return ids
}

func (r *rig) waitNoPending() {
	r.t.Helper()
	require.Eventually(r.t, func() bool {
		return r.count(`SELECT COUNT(*) FROM orders WHERE status = 'PENDING'`) == 0
	}, 60*time.Second, 10*time.Millisecond)
}

// requireStockBack asserts every SKU is back where it began: nothing
// reserved in the database, all of on_hand available in Redis.
func (r *rig) requireStockBack(stocked map[string]int64) {
	r.t.Helper()
	for sku, n := range stocked {
		lv, err := r.st.Levels(context.Background(), sku)
		require.NoError(r.t, err)
		require.True(r.t, lv.Initialised, sku)
		require.EqualValues(r.t, n, lv.Available, "%s is back where it began in Redis", sku)
		r.requireQty(sku, n, 0)
		r.checkInvariant(sku)
	}
}

// Three nodes run pollers and sweeps at once over 1,000 expiring orders: each
// order expires once, each reservation is given back once, and the stock ends
// where it began.
func TestTimeoutsThreeNodes(t *testing.T) {
	r := newRig(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), // the database pool's own goroutines come and go
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
		goleak.IgnoreAnyFunction("github.com/go-sql-driver/mysql.(*mysqlConn).startWatcher.func1"))
	stocked := map[string]int64{"A": 1000, "B": 1000}
	for sku, n := range stocked {
		r.addSKU(sku, n)
	}
	nodes := []*node{r.node(fastTimeouts), r.node(fastTimeouts), r.node(fastTimeouts)}
	ids := r.createOrders(nodes[0].svc, 1000, "A", "B")
	require.EqualValues(t, 1000, r.count(`SELECT COUNT(*) FROM orders WHERE status = 'PENDING'`))
	perShard := queueSizes(t, r.rdb, nodes[0].tm)
	require.Len(t, perShard, 16)
	var queued int64
	for key, n := range perShard {
		require.NotZero(t, n, "%s: the orders are spread over every shard", key)
		queued += n
	}
	require.EqualValues(t, 1000, queued)

	for _, n := range nodes {
		n.tm.Start(context.Background())
	}
	r.clock.Advance(15*time.Minute + time.Second)
	r.waitNoPending()
	// The sweep races the pollers: the entries of orders it expired are
	// dropped when a poller claims them.
	waitQueueEmpty(t, r.rdb, nodes[0].tm)
	for _, n := range nodes {
		n.tm.Stop()
		n.tm.Stop() // double stop is fine
	}

	var expired, reaped int64
	for _, n := range nodes {
		expired += n.tm.Expired.Load()
		reaped += n.tm.Reaped.Load()
	}
	require.EqualValues(t, len(ids), expired, "every order expired exactly once across the nodes")
	require.Zero(t, reaped, "the orders gave their holds back; nothing was left to reap")
	require.EqualValues(t, 1000, r.count(`SELECT COUNT(*) FROM orders WHERE status = 'EXPIRED'`))
	r.requireStockBack(stocked)
	requireQueueEmpty(t, r.rdb, nodes[0].tm)
}

// queue is one queue of the delay queue as Redis holds it: the key layout
// stock/keys.go documents, written out here so a change of it shows.
type queue struct{ due, claimed string }

func keysOf(q stock.Queue) queue {
	if q == stock.Legacy {
		return queue{"inv:{timeouts}:due", "inv:{timeouts}:claimed"}
	}
	tag := fmt.Sprintf("inv:{timeouts:%d}", q)
	return queue{tag + ":due", tag + ":claimed"}
}

// queues are tm's shards and the legacy queue.
func queues(tm *Timeouts) []queue {
	var out []queue
	for i := range tm.q.Shards() {
		out = append(out, keysOf(stock.Queue(i)))
	}
	return append(out, keysOf(stock.Legacy))
}

// shardOf is the keys of the shard order id waits in.
func shardOf(tm *Timeouts, id string) queue { return keysOf(tm.q.ShardOf(id)) }

// dueAt is order id's entry as the queue scores it.
func dueAt(id string, deadline time.Time) redis.Z {
	return redis.Z{Score: float64(stock.DueMillis(deadline)), Member: id}
}

// queueSizes is how many entries each shard of tm's delay queue holds (due
// and claimed), by due key; the legacy queue is counted when not empty.
func queueSizes(t testing.TB, rdb redis.Cmdable, tm *Timeouts) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	out := map[string]int64{}
	for _, q := range queues(tm) {
		due, err := rdb.ZCard(ctx, q.due).Result()
		require.NoError(t, err)
		claimed, err := rdb.ZCard(ctx, q.claimed).Result()
		require.NoError(t, err)
		if q != keysOf(stock.Legacy) || due+claimed > 0 {
			out[q.due] = due + claimed
		}
	}
	return out
}

// requireQueueEmpty asserts nothing is left on tm's delay queue, in any
// shard or in the legacy queue.
func requireQueueEmpty(t testing.TB, rdb redis.Cmdable, tm *Timeouts) {
	t.Helper()
	for key, n := range queueSizes(t, rdb, tm) {
		require.Zero(t, n, "%s is empty", key)
	}
}

// waitQueueEmpty waits until the running pollers have emptied tm's delay
// queue (the claims of orders expired are dropped at the end of a poll).
func waitQueueEmpty(t testing.TB, rdb redis.Cmdable, tm *Timeouts) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, n := range queueSizes(t, rdb, tm) {
			if n > 0 {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "the pollers drain the queue")
}

// dropQueue makes Redis lose the whole delay queue.
func dropQueue(t testing.TB, rdb redis.Cmdable, tm *Timeouts) {
	t.Helper()
	for _, q := range queues(tm) {
		require.NoError(t, rdb.Del(context.Background(), q.due, q.claimed).Err())
	}
}

// Redis loses the delay queue before the deadlines: the sweep still releases
// every order, and releases a token-API reservation at its own deadline (a
// late replay of that token takes nothing). Units an admission took in Redis
// that no database write ever recorded (the process died in between) are
// not the sweep's: the realign gives them back.
func TestSweepCatchesWhatTheQueueMissed(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	stocked := map[string]int64{"A": 100}
	r.addSKU("A", 100)
	n := r.node(fastTimeouts)
	ids := r.createOrders(n.svc, 40, "A") // 60 units
	r.clock.Advance(30 * time.Second)
	left, err := n.tokens.Reserve(ctx, "A", 5, "bare") // due 30s after the orders
	require.NoError(t, err)
	require.EqualValues(t, 35, left)
	dropQueue(t, r.rdb, n.tm)
	r.requireQty("A", 100, 65)

	r.clock.Advance(15*time.Minute - 29*time.Second) // the orders are due, the token not yet
	expired, err := n.tm.SweepOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 40, expired)
	require.Zero(t, n.tm.Reaped.Load())
	for _, id := range ids {
		o, err := n.svc.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, order.Expired, o.Status)
		require.Equal(t, arbiter.Released, r.reservationState(id, "A"))
	}
	require.Equal(t, arbiter.Held, r.reservationState("t.bare", "A"), "the token reservation waits for its own deadline")
	r.requireQty("A", 100, 5)
	require.EqualValues(t, 95, r.redisAvailable("A"))

	r.clock.Advance(time.Minute)
	expired, err = n.tm.SweepOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, expired)
	require.EqualValues(t, 1, n.tm.Reaped.Load())
	require.Equal(t, arbiter.Released, r.reservationState("t.bare", "A"))
	r.requireStockBack(stocked)
	_, err = n.tokens.Reserve(ctx, "A", 5, "bare")
	require.ErrorIs(t, err, tokens.ErrReleased, "a late replay of the released token cannot take it again")
	_, err = n.tm.SweepOnce(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n.tm.Reaped.Load(), "released once")
	r.requireStockBack(stocked)

	_, err = r.st.Admit(ctx, "A", 7, "") // ...and the process dies before its database write
	require.NoError(t, err)
	_, err = n.tm.SweepOnce(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 93, r.redisAvailable("A"), "no row holds the units: the sweep cannot see them")
	done, err := maintenance.NewReconciler(r.db, r.st, nil).Realign(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"A"}, done)
	r.requireStockBack(stocked)
}

// A node holding the sweep lock dies: nobody sweeps while its lock lives, and
// another node takes over once it expires.
func TestSweepLockTakeover(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.addSKU("A", 100)
	n := r.node(fastTimeouts)
	r.createOrders(n.svc, 20, "A")
	dropQueue(t, r.rdb, n.tm) // only the sweep can release them
	r.clock.Advance(16 * time.Minute)

	dead, err := r.st.Locker().Obtain(ctx, lock.SweepKey, 800*time.Millisecond, 0)
	require.NoError(t, err) // ...and its holder never comes back
	n.tm.Start(ctx)
	for {
		// Count first, then look at the lock: a count taken while the dead
		// node's lock still holds afterwards was taken under it.
		expired := r.count(`SELECT COUNT(*) FROM orders WHERE status = 'EXPIRED'`)
		val, err := r.rdb.Get(ctx, lock.SweepKey).Result()
		if errors.Is(err, redis.Nil) || err == nil && val != dead.Token() {
			break
		}
		require.NoError(t, err)
		require.Zero(t, expired, "no sweep while the dead node's lock lives")
		time.Sleep(20 * time.Millisecond)
	}
	r.waitNoPending()
	n.tm.Stop()
	require.EqualValues(t, 20, n.tm.Expired.Load(), "the surviving node expired them all")
	r.requireStockBack(map[string]int64{"A": 100})
}

// Payments race the timeout on every order: each order ends either PAID (with
// exactly one deduction) or EXPIRED (with none), and the stock adds up.
func TestPaymentRacesTimeout(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.addSKU("A", 200)
	n := r.node(fastTimeouts)
	ids := r.createOrders(n.svc, 100, "A")
	r.clock.Advance(15*time.Minute + time.Millisecond)

	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for {
			got, _, err := n.tm.PollOnce(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			if got == 0 {
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		for i, id := range ids {
			if i%2 == 0 {
				if o, err := n.svc.Pay(ctx, id, "pay-"+id); err != nil {
					t.Error(err)
				} else if o.Status != order.Paid {
					t.Errorf("order %s: payment left it %s", id, o.Status)
				}
			}
		}
	}()
	wg.Wait()
	_, err := n.tm.SweepOnce(ctx)
	require.NoError(t, err)

	for i, id := range ids {
		o, err := n.svc.Get(ctx, id)
		require.NoError(t, err)
		outbox := r.count(`SELECT COUNT(*) FROM stock_outbox WHERE token IN (?, ?)`, id, id+".late")
		switch o.Status {
		case order.Paid:
			// Paid in time (under its id) or after it expired (re-reserved under "<id>.late").
			require.EqualValues(t, 1, r.count(`SELECT COUNT(*) FROM stock_outbox WHERE token = ?`, o.ReservationToken), id)
			require.EqualValues(t, 1, outbox, id)
			require.Equal(t, arbiter.Committed, r.reservationState(o.ReservationToken, "A"))
			require.Zero(t, i%2, "only orders that were paid are PAID")
		case order.Expired:
			require.Zero(t, outbox, id)
			require.Equal(t, arbiter.Released, r.reservationState(id, "A"))
		default:
			t.Fatalf("order %s ended %s", id, o.Status)
		}
	}
	require.EqualValues(t, 50, r.count(`SELECT COUNT(*) FROM orders WHERE status = 'PAID'`),
		"every payment won, in time or late (stock was there to re-reserve)")
	r.requireQty("A", 200, 50) // the paid orders (even i: one unit each) stay reserved until applied
	r.checkInvariant("A")
}

func TestTimeoutsConfigAndLifecycle(t *testing.T) {
	r := newRig(t)
	locker := r.st.Locker()
	_, err := NewTimeouts(r.svc, r.rdb, TimeoutConfig{Lease: time.Millisecond, Locker: locker})
	require.Error(t, err, "a lease shorter than a second is refused")
	for _, shards := range []int{-1, maxShards + 1} {
		_, err = NewTimeouts(r.svc, r.rdb, TimeoutConfig{Shards: shards, Locker: locker})
		require.Error(t, err, "%d shards are refused", shards)
	}
	_, err = NewTimeouts(r.svc, r.rdb, TimeoutConfig{})
	require.Error(t, err, "no locker for the sweep is refused")
	tm, err := NewTimeouts(r.svc, r.rdb, TimeoutConfig{Locker: locker})
	require.NoError(t, err)
	require.Equal(t, 16, tm.q.Shards(), "16 shards by default")
	tm.Stop() // before Start
	tm.Start(context.Background())
	tm.Start(context.Background()) // no second set of loops
	tm.Stop()
	tm.Stop()
}

// A poller whose clock runs ahead of the node that wrote the order claims it
// before the database agrees it is due: the order goes back on the queue, not
// to the sweep.
func TestEarlyClaimIsRequeued(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.addSKU("A", 10)
	n := r.node(fastTimeouts)
	o, err := n.svc.Create(ctx, "u1", "", line("A", 1))
	require.NoError(t, err)
	cfg := fastTimeouts
	cfg.Now, cfg.Locker = func() time.Time { return r.clock.Now().Add(20 * time.Minute) }, n.st.Locker()
	fast, err := NewTimeouts(n.svc, r.rdb, cfg)
	require.NoError(t, err)

	expired, _, err := fast.PollOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, expired)
	score, err := r.rdb.ZScore(ctx, shardOf(fast, o.ID).due, o.ID).Result()
	require.NoError(t, err, "the order is back on the queue, in its shard")
	require.EqualValues(t, dueAt(o.ID, o.ExpiresAt).Score, score)
	claimed, err := r.rdb.ZCard(ctx, shardOf(fast, o.ID).claimed).Result()
	require.NoError(t, err)
	require.Zero(t, claimed)

	r.clock.Advance(15*time.Minute + time.Millisecond)
	expired, _, err = fast.PollOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, expired)
	r.requireStockBack(map[string]int64{"A": 10})
}

// One poll claims from every shard: with a claim batch of one per shard and
// every shard holding due orders, it takes exactly one from each. Its sleep
// is the earliest deadline over all the shards.
func TestTimeoutPollClaimsFromEveryShard(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.addSKU("A", 1000)
	cfg := fastTimeouts
	cfg.ClaimBatch = 16 // with the legacy queue, 17 queues: one each
	n := r.node(cfg)
	r.createOrders(n.svc, 400, "A")
	before := queueSizes(t, r.rdb, n.tm)
	for key, size := range before {
		require.NotZero(t, size, key)
	}
	r.clock.Advance(15*time.Minute + time.Millisecond)

	expired, next, err := n.tm.PollOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 16, expired)
	require.False(t, next.After(r.clock.Now()), "more are due: poll again at once")
	for key, size := range queueSizes(t, r.rdb, n.tm) {
		require.Equal(t, before[key]-1, size, "%s gave one order", key)
	}
	for {
		got, _, err := n.tm.PollOnce(ctx)
		require.NoError(t, err)
		if got == 0 {
			break
		}
	}
	require.Zero(t, r.count(`SELECT COUNT(*) FROM orders WHERE status = 'PENDING'`))
	requireQueueEmpty(t, r.rdb, n.tm)

	// Two orders, five seconds apart, in two shards: the poll sleeps until
	// the first, then until the second.
	first, err := n.svc.Create(ctx, "u1", "", line("A", 1))
	require.NoError(t, err)
	// Orders created until one lands in another shard than first's; the
	// earliest of them (the first created) is the next deadline after first.
	var second, afterFirst *order.Order
	for second == nil || shardOf(n.tm, second.ID) == shardOf(n.tm, first.ID) {
		r.clock.Advance(5 * time.Second)
		second, err = n.svc.Create(ctx, "u2", "", line("A", 1))
		require.NoError(t, err)
		if afterFirst == nil {
			afterFirst = second
		}
	}
	for range 20 { // whichever shard a poll starts with
		expired, next, err = n.tm.PollOnce(ctx)
		require.NoError(t, err)
		require.Zero(t, expired)
		require.EqualValues(t, dueAt(first.ID, first.ExpiresAt).Score, next.UnixMilli())
	}
	r.clock.Advance(first.ExpiresAt.Sub(r.clock.Now()) + time.Millisecond)
	expired, next, err = n.tm.PollOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, expired)
	require.EqualValues(t, dueAt(afterFirst.ID, afterFirst.ExpiresAt).Score, next.UnixMilli())
}

// Orders an older version scheduled on the unsharded queue (one of them
// claimed by a poller that died) are still released by the queue, once each;
// an early claim moves its order into its shard; and an order an older node
// adds after the queue was seen empty is found within a sweep interval.
func TestTimeoutLegacyQueueIsDrained(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.addSKU("A", 100)
	n := r.node(fastTimeouts)
	older := order.NewService(r.db, r.st, order.Config{TTL: 15 * time.Minute, Now: r.clock.Now,
		OnCreated: func(ctx context.Context, o *order.Order) {
			require.NoError(t, r.rdb.ZAdd(ctx, keysOf(stock.Legacy).due, dueAt(o.ID, o.ExpiresAt)).Err())
		}})
	t.Cleanup(func() { _ = older.Close() })
	ids := r.createOrders(older, 30, "A")
	dead := ids[0] // claimed by an older poller that died; its lease ends at the deadline
	score, err := r.rdb.ZScore(ctx, keysOf(stock.Legacy).due, dead).Result()
	require.NoError(t, err)
	require.NoError(t, r.rdb.ZRem(ctx, keysOf(stock.Legacy).due, dead).Err())
	require.NoError(t, r.rdb.ZAdd(ctx, keysOf(stock.Legacy).claimed, redis.Z{Score: score, Member: dead}).Err())
	for key, size := range queueSizes(t, r.rdb, n.tm) {
		if key != keysOf(stock.Legacy).due {
			require.Zero(t, size, key)
		}
	}

	// A poller whose clock runs ahead claims early from the legacy queue:
	// the orders go back, each into its shard.
	ahead := fastTimeouts
	ahead.Now = func() time.Time { return r.clock.Now().Add(20 * time.Minute) }
	ahead.Locker = n.st.Locker()
	ahead.ClaimBatch = 5 * 17 // five from each of the 16 shards and the legacy queue
	fast, err := NewTimeouts(n.svc, r.rdb, ahead)
	require.NoError(t, err)
	expired, _, err := fast.PollOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, expired)
	moved := 0
	for _, id := range ids {
		if _, err := r.rdb.ZScore(ctx, shardOf(n.tm, id).due, id).Result(); err == nil {
			moved++
		}
	}
	require.Equal(t, 5, moved, "the early claims moved into their shards")

	r.clock.Advance(15*time.Minute + time.Second)
	total := 0
	for {
		got, _, err := n.tm.PollOnce(ctx)
		require.NoError(t, err)
		if got == 0 {
			break
		}
		total += got
	}
	require.Equal(t, 30, total, "the queue released every order")
	require.EqualValues(t, 30, r.count(`SELECT COUNT(*) FROM orders WHERE status = 'EXPIRED'`))
	requireQueueEmpty(t, r.rdb, n.tm)
	r.requireStockBack(map[string]int64{"A": 100})
	require.Equal(t, r.clock.Now().Add(fastTimeouts.SweepInterval).UnixMilli(), n.tm.legacyAt.Load(),
		"an empty legacy queue is looked at again after a sweep interval, not on every poll")

	// A rolling upgrade: an older node still schedules there.
	late, err := older.Create(ctx, "late", "", line("A", 1))
	require.NoError(t, err)
	r.clock.Advance(15*time.Minute + time.Second)
	expired, _, err = n.tm.PollOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, expired)
	o, err := n.svc.Get(ctx, late.ID)
	require.NoError(t, err)
	require.Equal(t, order.Expired, o.Status)
	requireQueueEmpty(t, r.rdb, n.tm)
	require.EqualValues(t, 31, n.tm.Expired.Load())
}

// On the real Redis Cluster the shards' keys land on many slots, spread
// over the masters, and three pollers release each order exactly once
// through the queue alone (the sweep is kept out of the way).
//
// The cluster is held for this test (testenv.RedisCluster): the stock
// package's tests, which flush it, wait until it ends.
func TestTimeoutShardsOnCluster(t *testing.T) {
	ctx := context.Background()
	rc := testenv.RedisCluster(t)
	require.NoError(t, rc.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() }),
		"a real Redis Cluster is required (run `make up`)")
	masters := map[string]bool{}
	var mu sync.Mutex
	require.NoError(t, rc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		masters[c.Options().Addr] = true
		return nil
	}))

	r := newRig(t) // the database and the clock
	cfg := TimeoutConfig{MaxPollWait: 20 * time.Millisecond, SweepInterval: time.Hour, Now: r.clock.Now, Locker: lock.NewLocker(rc)}
	var nodes []*node
	for range 3 {
		st, err := stock.NewStore(rc, stock.Config{Init: arbiter.InitFunc(r.db)})
		require.NoError(t, err)
		n := &node{st: st}
		n.svc = order.NewService(r.db, st, order.Config{TTL: 15 * time.Minute, Now: r.clock.Now,
			OnCreated: func(ctx context.Context, o *order.Order) { n.tm.Schedule(ctx, o.ID, o.ExpiresAt) }})
		t.Cleanup(func() { _ = n.svc.Close() })
		n.tm, err = NewTimeouts(n.svc, rc, cfg)
		require.NoError(t, err)
		t.Cleanup(n.tm.Stop)
		nodes = append(nodes, n)
	}
	tm := nodes[0].tm
	var keys []string
	for _, q := range queues(tm) {
		keys = append(keys, q.due, q.claimed)
	}
	dropKeys := func() {
		for _, k := range keys {
			require.NoError(t, rc.Del(ctx, k).Err())
		}
	}
	dropKeys()
	t.Cleanup(dropKeys)

	slots := map[int64]bool{}
	onMasters := map[string]bool{}
	for _, q := range queues(tm)[:tm.q.Shards()] {
		slot, err := rc.ClusterKeySlot(ctx, q.due).Result()
		require.NoError(t, err)
		claimedSlot, err := rc.ClusterKeySlot(ctx, q.claimed).Result()
		require.NoError(t, err)
		require.Equal(t, slot, claimedSlot, "%s: a shard's two keys share a slot", q.due)
		slots[slot] = true
		m, err := rc.MasterForKey(ctx, q.due)
		require.NoError(t, err)
		onMasters[m.Options().Addr] = true
	}
	t.Logf("16 shards on %d slots, on masters %v", len(slots), onMasters)
	require.Len(t, slots, 16, "every shard has a slot of its own")
	require.Equal(t, masters, onMasters, "the shards are spread over every master")

	suffix := strconv.FormatInt(time.Now().UnixNano()%1_000_000_000, 36)
	stocked := map[string]int64{}
	var skus []string
	for i := range 3 {
		sku := fmt.Sprintf("tmo-%s-%d", suffix, i)
		skus = append(skus, sku)
		stocked[sku] = 500
		r.addSKU(sku, 500)
	}
	t.Cleanup(func() {
		for _, sku := range skus {
			for _, k := range stock.DeductKeys(sku)[:1] {
				_ = rc.Del(ctx, k).Err()
			}
		}
	})
	const orders = 600
	r.createOrders(nodes[0].svc, orders, skus...)
	used := map[string]bool{}
	var queued int64
	for _, q := range queues(tm)[:tm.q.Shards()] {
		n, err := rc.ZCard(ctx, q.due).Result()
		require.NoError(t, err)
		if n > 0 {
			m, err := rc.MasterForKey(ctx, q.due)
			require.NoError(t, err)
			used[m.Options().Addr] = true
		}
		queued += n
	}
	require.EqualValues(t, orders, queued)
	require.Equal(t, masters, used, "the orders wait on every master")

	for _, n := range nodes {
		n.tm.Start(ctx)
	}
	r.clock.Advance(15*time.Minute + time.Second)
	r.waitNoPending()
	waitQueueEmpty(t, rc, tm)
	var expired int64
	for _, n := range nodes {
		n.tm.Stop()
		expired += n.tm.Expired.Load()
	}
	require.EqualValues(t, orders, expired, "every order expired exactly once, by the pollers")
	require.EqualValues(t, orders, r.count(`SELECT COUNT(*) FROM orders WHERE status = 'EXPIRED'`))
	for sku, n := range stocked {
		r.requireQty(sku, n, 0)
		st := nodes[0].st
		require.NoError(t, st.EnsureInit(ctx, sku))
		lv, err := st.Levels(ctx, sku)
		require.NoError(t, err)
		require.EqualValues(t, n, lv.Available, "%s is back where it began in Redis", sku)
	}
}

// Creating orders wakes the sleeping poller only for a deadline earlier than
// the one it sleeps until: a busy node does not poll every shard per order.
func TestTimeoutScheduleWakesOnlyForAnEarlierDeadline(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.addSKU("A", 100)
	cfg := fastTimeouts
	cfg.MaxPollWait = time.Hour
	cfg.SweepInterval = time.Hour
	n := r.node(cfg)
	first, err := n.svc.Create(ctx, "u0", "", line("A", 1))
	require.NoError(t, err)
	n.tm.Start(ctx)
	require.Eventually(t, func() bool { return n.tm.sleepUntil.Load() == int64(dueAt(first.ID, first.ExpiresAt).Score) },
		10*time.Second, time.Millisecond, "the poller sleeps until the first deadline")
	require.EqualValues(t, 1, n.tm.Polls.Load())

	r.clock.Advance(time.Second)
	r.createOrders(n.svc, 20, "A")    // due after the first
	time.Sleep(50 * time.Millisecond) // a window for a wrong wake-up to show
	require.EqualValues(t, 1, n.tm.Polls.Load(), "later deadlines do not wake the poller")

	sooner := order.NewService(r.db, r.st, order.Config{TTL: time.Minute, Now: r.clock.Now,
		OnCreated: func(ctx context.Context, o *order.Order) { n.tm.Schedule(ctx, o.ID, o.ExpiresAt) }})
	t.Cleanup(func() { _ = sooner.Close() })
	o, err := sooner.Create(ctx, "u1", "", line("A", 1))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return n.tm.sleepUntil.Load() == int64(dueAt(o.ID, o.ExpiresAt).Score) },
		10*time.Second, time.Millisecond, "an earlier deadline wakes it, and it sleeps until that one")
	require.EqualValues(t, 2, n.tm.Polls.Load())
	n.tm.Stop()
}

// queuedEntries counts the entries of every timeout shard of n.
func queuedEntries(t *testing.T, r *rig, n *node) int64 {
	t.Helper()
	var total int64
	for _, q := range queues(n.tm)[:n.tm.q.Shards()] {
		c, err := r.rdb.ZCard(context.Background(), q.due).Result()
		require.NoError(t, err)
		total += c
	}
	return total
}

// A paid or cancelled order leaves the delay queue at once: the queue holds
// pending orders only, so Redis keeps nothing per finished order.
func TestFinishedOrdersLeaveTheQueue(t *testing.T) {
	r := newRig(t)
	r.addSKU("A", 100)
	n := r.node(fastTimeouts)
	ctx := context.Background()
	queued := func() int64 { return queuedEntries(t, r, n) }
	var ids []string
	for i := 0; i < 6; i++ {
		o, err := n.svc.Create(ctx, "u", "", line("A", 1))
		require.NoError(t, err)
		ids = append(ids, o.ID)
	}
	require.Equal(t, int64(6), queued())
	_, err := n.svc.Pay(ctx, ids[0], "p0")
	require.NoError(t, err)
	_, err = n.svc.Pay(ctx, ids[0], "p0") // a replay removes nothing more
	require.NoError(t, err)
	_, err = n.svc.Cancel(ctx, ids[1])
	require.NoError(t, err)
	require.Equal(t, int64(4), queued())
	for _, id := range ids[2:] {
		_, err := n.svc.Pay(ctx, id, "p-"+id)
		require.NoError(t, err)
	}
	require.Zero(t, queued())
}

// While the loops run, scheduling costs a sale no Redis round trip: entries
// are written behind, many per pipeline; an order finished before its entry
// was written never reaches Redis; Stop writes what is left.
func TestScheduleWritesBehind(t *testing.T) {
	r := newRig(t)
	r.addSKU("A", 1000)
	n := r.node(fastTimeouts)
	ctx := context.Background()
	queued := func() int64 { return queuedEntries(t, r, n) }
	n.tm.Start(ctx)
	ids := r.createOrders(n.svc, 200, "A")
	require.Eventually(t, func() bool { return queued() == 200 }, 10*time.Second, 5*time.Millisecond)
	require.Less(t, n.tm.Flushes.Load(), int64(200), "entries share pipelines")
	for _, id := range ids[:50] {
		_, err := n.svc.Pay(ctx, id, "p-"+id)
		require.NoError(t, err)
	}
	require.Equal(t, int64(150), queued())

	// An order finished right after it was scheduled, before or after the
	// flusher wrote its entry: nothing is left behind either way.
	for i := 0; i < 20; i++ {
		o := &order.Order{ID: fmt.Sprintf("quick-%d", i), ExpiresAt: r.clock.Now().Add(time.Hour)}
		n.tm.Schedule(ctx, o.ID, o.ExpiresAt)
		if i%2 == 1 {
			time.Sleep(2 * time.Millisecond) // let the flusher write some first
		}
		n.tm.Unschedule(ctx, o.ID)
	}
	n.tm.Stop()
	require.Equal(t, int64(150), queued(), "nothing left behind for the finished orders")

	// After Stop, scheduling writes at once again.
	_, err := n.svc.Create(ctx, "u", "", line("A", 1))
	require.NoError(t, err)
	require.Equal(t, int64(151), queued())
}
