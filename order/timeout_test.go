package order

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/acme/inventory/stock"
)

// node is one more service instance on rig's database, Redis and clock.
type node struct {
	svc *Service
	tm  *Timeouts
}

func (r *rig) node(cfg TimeoutConfig) *node {
	r.t.Helper()
	st, err := stock.NewStore(r.rdb, stock.Config{Init: InitFunc(r.db)})
	require.NoError(r.t, err)
	n := &node{}
	n.svc = NewService(r.db, st, Config{TTL: 15 * time.Minute, Now: r.clock.Now,
		OnCreated: func(ctx context.Context, o *Order) { n.tm.Schedule(ctx, o) }})
	cfg.Now = r.clock.Now
	n.tm, err = NewTimeouts(n.svc, r.rdb, cfg)
	require.NoError(r.t, err)
	r.t.Cleanup(n.tm.Stop)
	return n
}

var fastTimeouts = TimeoutConfig{MaxPollWait: 20 * time.Millisecond, SweepInterval: 50 * time.Millisecond, SweepLockTTL: time.Second}

func (r *rig) createOrders(svc *Service, n int, skus ...string) []string {
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
	r := newRig(t, memoryTransport(t))
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

	for _, n := range nodes {
		n.tm.Start(context.Background())
	}
	r.clock.Advance(15*time.Minute + time.Second)
	r.waitNoPending()
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
	due, err := r.rdb.ZCard(context.Background(), dueKey).Result()
	require.NoError(t, err)
	require.Zero(t, due)
}

// Redis loses the delay queue before the deadlines: the sweep still releases
// every order, and releases a token-API reservation at its own deadline (a
// late replay of that token takes nothing). Units an admission took in Redis
// that no database write ever recorded (the process died in between) are
// not the sweep's: the realign gives them back.
func TestSweepCatchesWhatTheQueueMissed(t *testing.T) {
	r := newRig(t, memoryTransport(t))
	ctx := context.Background()
	stocked := map[string]int64{"A": 100}
	r.addSKU("A", 100)
	n := r.node(fastTimeouts)
	ids := r.createOrders(n.svc, 40, "A") // 60 units
	r.clock.Advance(30 * time.Second)
	left, err := n.svc.Reserve(ctx, "A", 5, "bare") // due 30s after the orders
	require.NoError(t, err)
	require.EqualValues(t, 35, left)
	require.NoError(t, r.rdb.Del(ctx, dueKey).Err())
	r.requireQty("A", 100, 65)

	r.clock.Advance(15*time.Minute - 29*time.Second) // the orders are due, the token not yet
	expired, err := n.tm.SweepOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 40, expired)
	require.Zero(t, n.tm.Reaped.Load())
	for _, id := range ids {
		o, err := n.svc.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, Expired, o.Status)
		require.Equal(t, Released, r.reservationState(id, "A"))
	}
	require.Equal(t, Held, r.reservationState("t.bare", "A"), "the token reservation waits for its own deadline")
	r.requireQty("A", 100, 5)
	require.EqualValues(t, 95, r.redisAvailable("A"))

	r.clock.Advance(time.Minute)
	expired, err = n.tm.SweepOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, expired)
	require.EqualValues(t, 1, n.tm.Reaped.Load())
	require.Equal(t, Released, r.reservationState("t.bare", "A"))
	r.requireStockBack(stocked)
	_, err = n.svc.Reserve(ctx, "A", 5, "bare")
	require.ErrorIs(t, err, ErrTokenReleased, "a late replay of the released token cannot take it again")
	_, err = n.tm.SweepOnce(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n.tm.Reaped.Load(), "released once")
	r.requireStockBack(stocked)

	_, err = r.st.Admit(ctx, "A", 7, "") // ...and the process dies before its database write
	require.NoError(t, err)
	_, err = n.tm.SweepOnce(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 93, r.redisAvailable("A"), "no row holds the units: the sweep cannot see them")
	done, err := NewCatalog(r.db, r.st, nil).Realign(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"A"}, done)
	r.requireStockBack(stocked)
}

// A node holding the sweep lock dies: nobody sweeps while its lock lives, and
// another node takes over once it expires.
func TestSweepLockTakeover(t *testing.T) {
	r := newRig(t, memoryTransport(t))
	ctx := context.Background()
	r.addSKU("A", 100)
	n := r.node(fastTimeouts)
	r.createOrders(n.svc, 20, "A")
	require.NoError(t, r.rdb.Del(ctx, dueKey).Err()) // only the sweep can release them
	r.clock.Advance(16 * time.Minute)

	dead, err := r.st.Locker().Obtain(ctx, sweepLockKey, 800*time.Millisecond, 0)
	require.NoError(t, err) // ...and its holder never comes back
	n.tm.Start(ctx)
	for {
		ttl, err := r.rdb.PTTL(ctx, sweepLockKey).Result()
		require.NoError(t, err)
		val, _ := r.rdb.Get(ctx, sweepLockKey).Result()
		if ttl <= 0 || val != dead.Token() {
			break
		}
		require.Zero(t, r.count(`SELECT COUNT(*) FROM orders WHERE status = 'EXPIRED'`), "no sweep while the dead node's lock lives")
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
	r := newRig(t, memoryTransport(t))
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
				} else if o.Status != Paid {
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
		case Paid:
			// Paid in time (under its id) or after it expired (re-reserved under "<id>.late").
			require.EqualValues(t, 1, r.count(`SELECT COUNT(*) FROM stock_outbox WHERE token = ?`, o.ReservationToken), id)
			require.EqualValues(t, 1, outbox, id)
			require.Equal(t, Committed, r.reservationState(o.ReservationToken, "A"))
			require.Zero(t, i%2, "only orders that were paid are PAID")
		case Expired:
			require.Zero(t, outbox, id)
			require.Equal(t, Released, r.reservationState(id, "A"))
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
	r := newRig(t, memoryTransport(t))
	_, err := NewTimeouts(r.svc, r.rdb, TimeoutConfig{Lease: time.Millisecond})
	require.Error(t, err, "a lease shorter than a second is refused")
	tm, err := NewTimeouts(r.svc, r.rdb, TimeoutConfig{})
	require.NoError(t, err)
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
	r := newRig(t, memoryTransport(t))
	ctx := context.Background()
	r.addSKU("A", 10)
	n := r.node(fastTimeouts)
	o, err := n.svc.Create(ctx, "u1", "", line("A", 1))
	require.NoError(t, err)
	cfg := fastTimeouts
	cfg.Now = func() time.Time { return r.clock.Now().Add(20 * time.Minute) }
	fast, err := NewTimeouts(n.svc, r.rdb, cfg)
	require.NoError(t, err)

	expired, _, err := fast.PollOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, expired)
	score, err := r.rdb.ZScore(ctx, dueKey, o.ID).Result()
	require.NoError(t, err, "the order is back on the queue")
	require.EqualValues(t, dueAt(o).Score, score)
	claimed, err := r.rdb.ZCard(ctx, claimedKey).Result()
	require.NoError(t, err)
	require.Zero(t, claimed)

	r.clock.Advance(15*time.Minute + time.Millisecond)
	expired, _, err = fast.PollOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, expired)
	r.requireStockBack(map[string]int64{"A": 10})
}
