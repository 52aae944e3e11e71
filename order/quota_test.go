package order_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/order"
	"github.com/acme/inventory/testkit/testenv"
	"github.com/acme/inventory/testkit/testrig"
)

func overLimit(t *testing.T, err error, user, sku string, limit int64) {
	t.Helper()
	require.ErrorIs(t, err, inventory.ErrConflict)
	require.EqualError(t, err, fmt.Sprintf("buyer %s reached the per-user limit of %d for %s", user, limit, sku))
}

// The per-user limit is the database's: it holds on the order path, survives
// Redis losing everything, comes back on cancel and on expiry, and a late
// payment re-counts it (REFUND_REQUIRED when the buyer is at the limit).
func TestPerUserLimitIsArbitratedByTheDatabase(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	sku := testenv.Unique("LIM")
	cat := r.Catalog
	_, err := cat.Put(ctx, sku, 100, 2)
	require.NoError(t, err)
	line := func(q int64) []inventory.Line { return []inventory.Line{{SKU: sku, Qty: q}} }

	a1, err := r.Orders.Create(ctx, "alice", "", line(1))
	require.NoError(t, err)
	a2, err := r.Orders.Create(ctx, "alice", "", line(1))
	require.NoError(t, err)
	_, err = r.Orders.Create(ctx, "alice", "", line(1))
	overLimit(t, err, "alice", sku, 2)
	_, err = r.Orders.Create(ctx, "bob", "", line(3))
	overLimit(t, err, "bob", sku, 2)
	_, err = r.Orders.Create(ctx, "bob", "", line(2))
	require.NoError(t, err)
	require.Equal(t, int64(2), r.Quota(sku, "alice"))
	require.Equal(t, int64(2), r.Quota(sku, "bob"))
	r.RequireQty(sku, 100, 4)
	require.Equal(t, int64(3), r.Count(`SELECT COUNT(*) FROM stock_reservations WHERE sku = ? AND buyer IS NOT NULL`, sku), "alice 1+1, bob 2")

	// Redis forgets everything: the database still refuses alice.
	require.NoError(t, r.RDB.FlushDB(ctx).Err())
	_, err = r.Orders.Create(ctx, "alice", "", line(1))
	overLimit(t, err, "alice", sku, 2)
	r.RequireQty(sku, 100, 4)
	r.CheckInvariant(sku)

	// A cancel gives the unit back to alice's limit.
	_, err = r.Orders.Cancel(ctx, a1.ID)
	require.NoError(t, err)
	require.Equal(t, int64(1), r.Quota(sku, "alice"))
	a3, err := r.Orders.Create(ctx, "alice", "", line(1))
	require.NoError(t, err)
	_, err = r.Orders.Create(ctx, "alice", "", line(1))
	overLimit(t, err, "alice", sku, 2)

	// order.Paid units keep counting; an expired order's come back.
	stop := r.StartPipeline()
	_, err = r.Orders.Pay(ctx, a2.ID, "pay-a2")
	require.NoError(t, err)
	r.WaitApplied()
	stop()
	require.Equal(t, int64(2), r.Quota(sku, "alice"))
	r.Clock.Advance(16 * time.Minute)
	expired, err := r.Orders.Expire(ctx, a3.ID)
	require.NoError(t, err)
	require.True(t, expired)
	require.Equal(t, int64(1), r.Quota(sku, "alice"))
	a4, err := r.Orders.Create(ctx, "alice", "", line(1))
	require.NoError(t, err)
	require.Equal(t, int64(2), r.Quota(sku, "alice"))

	// a3's late payment would take alice past her limit: REFUND_REQUIRED,
	// nothing re-reserved.
	late, err := r.Orders.Pay(ctx, a3.ID, "pay-a3")
	require.NoError(t, err)
	require.Equal(t, order.RefundRequired, late.Status)
	require.Equal(t, int64(2), r.Quota(sku, "alice"))
	// With a4 cancelled, a late payment is within the limit and re-counts.
	r.Clock.Advance(-16 * time.Minute)
	_, err = r.Orders.Cancel(ctx, a4.ID)
	require.NoError(t, err)
	b1, err := r.Orders.Create(ctx, "carol", "", line(1))
	require.NoError(t, err)
	r.Clock.Advance(16 * time.Minute)
	expired, err = r.Orders.Expire(ctx, b1.ID)
	require.NoError(t, err)
	require.True(t, expired)
	require.Equal(t, int64(0), r.Quota(sku, "carol"))
	paid, err := r.Orders.Pay(ctx, b1.ID, "pay-b1")
	require.NoError(t, err)
	require.Equal(t, order.Paid, paid.Status)
	require.Equal(t, int64(1), r.Quota(sku, "carol"))
	r.RequireQty(sku, 99, 3) // alice: a2 sold; reserved: bob 2 held, carol 1 committed (late)
	r.CheckInvariant(sku)
}

// A limit set after a reservation was made does not count that reservation,
// and its release gives nothing back that was not counted.
func TestPerUserLimitSetLater(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	sku := testenv.Unique("LIM")
	cat := r.Catalog
	_, err := cat.Put(ctx, sku, 10, 0)
	require.NoError(t, err)
	first, err := r.Orders.Create(ctx, "alice", "", []inventory.Line{{SKU: sku, Qty: 3}})
	require.NoError(t, err)
	_, err = cat.Put(ctx, sku, 10, 1)
	require.NoError(t, err)
	_, err = r.Orders.Cancel(ctx, first.ID)
	require.NoError(t, err)
	require.Equal(t, int64(0), r.Quota(sku, "alice"))
	_, err = r.Orders.Create(ctx, "alice", "", []inventory.Line{{SKU: sku, Qty: 1}})
	require.NoError(t, err)
	_, err = r.Orders.Create(ctx, "alice", "", []inventory.Line{{SKU: sku, Qty: 1}})
	overLimit(t, err, "alice", sku, 1)
	r.CheckInvariant(sku)
}

// Many concurrent purchases by the same buyers, group-committed together:
// each buyer gets exactly the limit, every other attempt is refused, and the
// counts, reservations and Redis agree.
func TestPerUserLimitRace(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	sku := testenv.Unique("LIM")
	_, err := r.Catalog.Put(ctx, sku, 1000, 3)
	require.NoError(t, err)
	const buyers, attempts = 5, 20
	var mu sync.Mutex
	won := map[string]int{}
	var wg sync.WaitGroup
	for b := 0; b < buyers; b++ {
		for i := 0; i < attempts; i++ {
			wg.Add(1)
			go func(user string) {
				defer wg.Done()
				_, err := r.Orders.Create(ctx, user, "", []inventory.Line{{SKU: sku, Qty: 1}})
				switch {
				case err == nil:
					mu.Lock()
					won[user]++
					mu.Unlock()
				case errors.Is(err, inventory.ErrConflict):
				default:
					t.Errorf("%s: %v", user, err)
				}
			}(fmt.Sprintf("buyer-%d", b))
		}
	}
	wg.Wait()
	for b := 0; b < buyers; b++ {
		user := fmt.Sprintf("buyer-%d", b)
		require.Equal(t, 3, won[user], user)
		require.Equal(t, int64(3), r.Quota(sku, user), user)
	}
	r.RequireQty(sku, 1000, 3*buyers)
	r.CheckInvariant(sku)
}

// A seckill sale under a per-user limit costs one Redis round trip: the
// limit's pre-filter and the stock in one script call. Many tabs of one buyer
// get exactly the limit. When Redis forgets a buyer's purchases (its buyers
// hash is lost), the next admission with a limit initialises the hash again
// from the database's counts (its limit is the record), so the pre-filter
// refuses where the database would.
func TestSeckillCountsTheLimitInTheAdmission(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	sku := r.PutSKU("SK", 100, 2)
	_, err := r.Orders.Seckill(ctx, "warm", sku, 2) // the SKU initialised, the script loaded
	require.NoError(t, err)

	cmds := testenv.CountCommands(r.RDB)
	_, err = r.Orders.Seckill(ctx, "carol", sku, 2)
	require.NoError(t, err)
	require.EqualValues(t, 1, cmds.Load(), "one Redis call per sale")

	var wg sync.WaitGroup
	errs := make([]error, 16)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); _, errs[i] = r.Orders.Seckill(ctx, "dave", sku, 2) }()
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		if err == nil {
			won++
			continue
		}
		overLimit(t, err, "dave", sku, 2)
	}
	require.Equal(t, 2, won)
	require.Equal(t, int64(2), r.Quota(sku, "dave"))

	// Redis forgets erin's purchases; the database still counts them.
	_, err = r.Orders.Seckill(ctx, "erin", sku, 2)
	require.NoError(t, err)
	_, err = r.Orders.Seckill(ctx, "erin", sku, 2)
	require.NoError(t, err)
	require.NoError(t, r.RDB.Del(ctx, "inv:{"+sku+"}:buyers").Err())
	_, err = r.Orders.Seckill(ctx, "erin", sku, 2)
	overLimit(t, err, "erin", sku, 2)
	n, err := r.RDB.HGet(ctx, "inv:{"+sku+"}:buyers", "erin").Result()
	require.NoError(t, err)
	require.Equal(t, "2", n, "the database's count is back in Redis")
	r.RequireQty(sku, 100, 1+1+2+2)
	require.EqualValues(t, 100-6, r.RedisAvailable(sku), "nothing taken for the refused sale")
}

// buyersState is what Redis's buyers hash of sku says of each user ("none":
// no count) and what the database's buyer_quotas says.
func buyersState(t *testing.T, r *testrig.Rig, sku string, users ...string) (inRedis, inDB map[string]string) {
	t.Helper()
	inRedis, inDB = map[string]string{}, map[string]string{}
	all, err := r.RDB.HGetAll(context.Background(), "inv:{"+sku+"}:buyers").Result()
	require.NoError(t, err)
	for _, u := range users {
		inRedis[u], inDB[u] = "none", fmt.Sprint(r.Quota(sku, u))
		if v, ok := all[u]; ok {
			inRedis[u] = v
		}
		if inDB[u] == "0" {
			inDB[u] = "none"
		}
	}
	return inRedis, inDB
}

// buyUntilRefused runs n seckill purchases of sku for user, one after the
// other, and returns how many succeeded; every refusal must be the limit's.
func buyUntilRefused(t *testing.T, r *testrig.Rig, sku, user string, limit int64, n int) int {
	t.Helper()
	won := 0
	for range n {
		_, err := r.Orders.Seckill(context.Background(), user, sku, limit)
		if err == nil {
			won++
			continue
		}
		overLimit(t, err, user, sku, limit)
	}
	return won
}

// A Redis that came back older (restored from a snapshot taken before two
// of a buyer's orders were cancelled) counts the buyer at the limit the
// database no longer holds; the periodic realign, which finds the SKU by
// its level, restores the buyers' counts with it: the buyer buys exactly
// the two units the database allows, and the third is refused.
func TestRealignRestoresBuyersCounts(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	sku := r.PutSKU("RB", 10, 3)
	stockKey, buyersKey := "inv:{"+sku+"}:stock", "inv:{"+sku+"}:buyers"
	var ids []string
	for range 3 {
		o, err := r.Orders.Seckill(ctx, "ann", sku, 3)
		require.NoError(t, err)
		ids = append(ids, o.ID)
	}
	snapStock, err := r.RDB.HGetAll(ctx, stockKey).Result()
	require.NoError(t, err)
	snapBuyers, err := r.RDB.HGetAll(ctx, buyersKey).Result()
	require.NoError(t, err)
	require.Equal(t, "3", snapBuyers["ann"])

	for _, id := range ids[:2] {
		_, err := r.Orders.Cancel(ctx, id)
		require.NoError(t, err)
	}
	inRedis, inDB := buyersState(t, r, sku, "ann")
	require.Equal(t, map[string]string{"ann": "1"}, inDB)
	require.Equal(t, inDB, inRedis, "the cancels gave the counts back in Redis too")

	// Redis comes back from the snapshot.
	require.NoError(t, r.RDB.Del(ctx, stockKey, buyersKey).Err())
	require.NoError(t, r.RDB.HSet(ctx, stockKey, snapStock).Err())
	require.NoError(t, r.RDB.HSet(ctx, buyersKey, snapBuyers).Err())
	require.EqualValues(t, 7, r.RedisAvailable(sku))

	skus, err := r.Reconciler().Realign(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{sku}, skus)
	inRedis, inDB = buyersState(t, r, sku, "ann")
	require.Equal(t, inDB, inRedis, "realigned: the database's counts")
	require.EqualValues(t, 9, r.RedisAvailable(sku))

	require.Equal(t, 2, buyUntilRefused(t, r, sku, "ann", 3, 4), "exactly what the database allows")
	require.EqualValues(t, 3, r.Quota(sku, "ann"))
	inRedis, inDB = buyersState(t, r, sku, "ann")
	require.Equal(t, map[string]string{"ann": "3"}, inDB)
	require.Equal(t, inDB, inRedis)
	r.RequireQty(sku, 10, 3)
	require.EqualValues(t, 7, r.RedisAvailable(sku))
	r.CheckInvariant(sku)
}

// The buyers hash lost on its own (deleted, evicted, expired), overwritten
// below the database's counts, or lost with every key (the cold init, -3):
// each time the buyer buys exactly what the database allows, the next
// purchase is refused, and Redis's counts end equal to the database's.
func TestLostBuyersCountsComeBackFromTheDatabase(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	sku := r.PutSKU("LB", 100, 3)
	buyersKey := "inv:{" + sku + "}:buyers"
	users := []string{"bea", "cid", "dan"}
	for _, u := range users {
		require.Equal(t, 1, buyUntilRefused(t, r, sku, u, 3, 1))
	}
	check := func(what string) {
		t.Helper()
		inRedis, inDB := buyersState(t, r, sku, users...)
		require.Equal(t, inDB, inRedis, what)
	}
	check("counted as bought")

	// Deleted: the next admission with a limit initialises the hash again.
	require.NoError(t, r.RDB.Del(ctx, buyersKey).Err())
	require.Equal(t, 2, buyUntilRefused(t, r, sku, "bea", 3, 3), "after the hash was deleted")
	check("after the hash was deleted")

	// Overwritten below the database: the database refuses what Redis let
	// through, and the refusal realigns the counts.
	require.NoError(t, r.RDB.HSet(ctx, buyersKey, "cid", 0).Err())
	require.Equal(t, 2, buyUntilRefused(t, r, sku, "cid", 3, 3), "after the hash was overwritten")
	check("after the hash was overwritten")

	// Every key lost: the cold init brings the counts back with the stock.
	require.NoError(t, r.RDB.FlushDB(ctx).Err())
	require.Equal(t, 2, buyUntilRefused(t, r, sku, "dan", 3, 3), "after every key was lost")
	check("after every key was lost")
	r.RequireQty(sku, 100, 9)
	require.EqualValues(t, 91, r.RedisAvailable(sku))
	r.CheckInvariant(sku)
	reports, err := r.Reconciler().Reconcile(ctx, false)
	require.NoError(t, err)
	require.Empty(t, reports)
}
