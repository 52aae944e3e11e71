package campaign_test

// Campaigns on the real MariaDB and Redis (testkit/testrig): each test
// tries to break one rule of the window, the allotment or the end.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/campaign"
	"github.com/acme/inventory/order"
	"github.com/acme/inventory/stock"
	"github.com/acme/inventory/testkit/testenv"
	"github.com/acme/inventory/testkit/testrig"
)

// put creates a campaign of a fresh SKU (stock units) on r.
func put(t *testing.T, r *testrig.Rig, stockUnits, allotment, limit int64, starts, ends time.Time) (string, string) {
	t.Helper()
	sku := r.PutSKU("CAMP", stockUnits, 0)
	id := testenv.Unique("c")
	_, err := r.Campaigns.Put(context.Background(), id, campaign.Spec{SKU: sku, Allotment: allotment, StartsAt: starts, EndsAt: ends,
		PerUserLimit: limit}, nil)
	require.NoError(t, err)
	return id, sku
}

// poolInRedis is what Redis holds of the campaign's pool.
func poolInRedis(t *testing.T, r *testrig.Rig, id, sku string) int64 {
	t.Helper()
	lv, err := r.Stock.CampaignLevels(context.Background(), stock.Campaign{ID: id, SKU: sku})
	require.NoError(t, err)
	require.True(t, lv.Initialised)
	return lv.Available
}

// A burst of buyers before the opening is refused at Redis speed: not one
// statement reaches the database, nothing is taken, and the answer says
// when the sale opens. (The pool was written to Redis when the campaign
// was put: no buyer waits for a cold init.)
func TestBurstBeforeTheOpeningNeverReachesTheDatabase(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	opens := time.Now().Add(time.Hour)
	id, sku := put(t, r, 50, 20, 0, opens, opens.Add(time.Hour))
	_, err := r.Campaigns.Get(ctx, id) // the countdown's view, read once
	require.NoError(t, err)
	var refused atomic.Int64
	n := testrig.CountStatements(t, r.DB, func() {
		testrig.Race(200, func(i int) {
			_, err := r.Campaigns.Buy(ctx, id, fmt.Sprintf("u%d", i), "")
			var early campaign.NotStarted
			if errors.As(err, &early) && errors.Is(err, inventory.ErrNotStarted) && early.StartsAt.Equal(opens.UTC().Truncate(time.Microsecond)) {
				refused.Add(1)
			} else {
				t.Errorf("buyer %d: %v", i, err)
			}
		})
	})
	require.Zero(t, n, "no statement reached the database")
	require.EqualValues(t, 200, refused.Load())
	require.Zero(t, r.Count(`SELECT COUNT(*) FROM orders`))
	require.EqualValues(t, 20, poolInRedis(t, r, id, sku))
	r.RequireQty(sku, 50, 20)
}

// Two nodes whose clocks disagree with the database's: the one that runs
// an hour fast admits in Redis (its clock says the sale is open), and the
// database, whose clock decides, refuses: nothing is sold, the unit goes
// back to Redis's pool. The node on time is refused by Redis already.
func TestAFastClockCannotSellEarly(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	opens := time.Now().Add(30 * time.Minute)
	id, sku := put(t, r, 10, 5, 0, opens, opens.Add(time.Hour))
	fast := campaign.New(r.DB, r.Stock, r.Orders, campaign.Config{Now: func() time.Time { return time.Now().Add(time.Hour) }})
	_, err := fast.Buy(ctx, id, "u1", "")
	require.ErrorIs(t, err, inventory.ErrNotStarted, "the database's clock refused")
	_, err = r.Campaigns.Buy(ctx, id, "u2", "")
	require.ErrorIs(t, err, inventory.ErrNotStarted, "Redis refused")
	require.Zero(t, r.Count(`SELECT COUNT(*) FROM orders`))
	require.EqualValues(t, 5, poolInRedis(t, r, id, sku), "the fast node's admission was given back")
	r.RequireQty(sku, 10, 5)
	r.CheckInvariant(sku)
}

// Many buyers race for a live campaign: exactly its allotment is sold,
// each buyer within the campaign's limit, Redis's pool and the database's
// agree at 0, and the SKU's own stock is untouched.
func TestCampaignSellsExactlyItsAllotment(t *testing.T) {
	{
		r := testrig.New(t, testrig.MemoryTransport(t))
		ctx := context.Background()
		id, sku := put(t, r, 100, 30, 2, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
		var sold, limited, out atomic.Int64
		perUser := make([]atomic.Int64, 20)
		testrig.Race(120, func(i int) {
			_, err := r.Campaigns.Buy(ctx, id, fmt.Sprintf("u%d", i%20), "")
			switch {
			case err == nil:
				sold.Add(1)
				perUser[i%20].Add(1)
			case errors.Is(err, inventory.ErrInsufficientStock):
				out.Add(1)
			case errors.Is(err, inventory.ErrConflict):
				limited.Add(1)
			default:
				t.Errorf("buyer %d: %v", i, err)
			}
		})
		require.EqualValues(t, 30, sold.Load())
		require.EqualValues(t, 120, sold.Load()+limited.Load()+out.Load())
		for u := range perUser {
			require.LessOrEqual(t, perUser[u].Load(), int64(2), "buyer u%d", u)
		}
		require.Zero(t, poolInRedis(t, r, id, sku))
		n, err := arbiter.CountCampaign(r.DB, id)
		require.NoError(t, err)
		require.Equal(t, arbiter.CampaignCounts{Held: 30}, n)
		r.RequireQty(sku, 100, 30)
		r.CheckInvariant(sku)
		v, err := r.Campaigns.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, campaign.Live, v.State, "the view is the one read when the campaign was put")
		r.Clock.Advance(campaign.Staleness)
		v, err = r.Campaigns.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, campaign.SoldOut, v.State, "read again once Staleness passed")
		require.Equal(t, [3]int64{0, 30, 0}, [3]int64{v.Sold, v.Held, v.Remaining})
	}
}

// Redis loses everything at the opening: the first buyers' admission
// initialises the pool from the database once, and the sale goes on
// exactly as if nothing happened.
func TestRedisFlushedAtTheOpening(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	id, sku := put(t, r, 40, 25, 0, time.Now().Add(-time.Second), time.Now().Add(time.Hour))
	require.NoError(t, r.RDB.FlushDB(ctx).Err())
	var sold, out atomic.Int64
	testrig.Race(60, func(i int) {
		_, err := r.Campaigns.Buy(ctx, id, fmt.Sprintf("u%d", i), "")
		switch {
		case err == nil:
			sold.Add(1)
		case errors.Is(err, inventory.ErrInsufficientStock):
			out.Add(1)
		default:
			t.Errorf("buyer %d: %v", i, err)
		}
	})
	require.EqualValues(t, 25, sold.Load())
	require.EqualValues(t, 35, out.Load())
	require.Zero(t, poolInRedis(t, r, id, sku))
	r.RequireQty(sku, 40, 25)
	r.CheckInvariant(sku)
}

// A campaign order that expires while the campaign runs gives its unit
// back to the campaign (another buyer gets it); one paid after the end (a
// late payment) takes the unit again from the SKU, which the end gave the
// rest to.
func TestLatePaymentAfterTheEnd(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	id, sku := put(t, r, 10, 2, 0, time.Now().Add(-time.Second), time.Now().Add(time.Hour))
	a, err := r.Campaigns.Buy(ctx, id, "alice", "")
	require.NoError(t, err)
	b, err := r.Campaigns.Buy(ctx, id, "bob", "")
	require.NoError(t, err)
	_, err = r.Campaigns.Buy(ctx, id, "carol", "")
	require.ErrorIs(t, err, inventory.ErrInsufficientStock)

	r.Clock.Advance(testrig.TTL + time.Second)
	ok, err := r.Orders.Expire(ctx, a.ID)
	require.NoError(t, err)
	require.True(t, ok)
	require.EqualValues(t, 1, poolInRedis(t, r, id, sku), "the expired unit is the campaign's again")
	c, err := r.Campaigns.Buy(ctx, id, "carol", "")
	require.NoError(t, err)
	r.RequireQty(sku, 10, 2)

	v, err := r.Campaigns.End(ctx, id)
	require.NoError(t, err)
	require.Equal(t, campaign.Ended, v.State)
	_, err = r.Campaigns.Buy(ctx, id, "dave", "")
	require.ErrorIs(t, err, inventory.ErrEnded)
	r.RequireQty(sku, 10, 2)

	paid, err := r.Orders.Pay(ctx, a.ID, "pay-a")
	require.NoError(t, err)
	require.Equal(t, order.Paid, paid.Status, "the stock was still there: the late payment takes it from the SKU")
	r.RequireQty(sku, 10, 3)
	for _, o := range []*order.Order{b, c} {
		_, err := r.Orders.Cancel(ctx, o.ID)
		require.NoError(t, err)
	}
	r.RequireQty(sku, 10, 1)
	r.CheckInvariant(sku)
	stop := r.StartPipeline()
	defer stop()
	r.WaitApplied()
	r.RequireQty(sku, 9, 0)
	r.CheckInvariant(sku)
}

// A campaign ended before its opening: its window closes at once (a
// millisecond long), its pool leaves Redis, and a buy is sale_ended, not
// sale_not_started, on this node and on one whose view of the campaign
// still says it opens later (straight to the pool too: its
// initialisation answers ended and writes nothing).
func TestEndedBeforeItsOpening(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	id, sku := put(t, r, 10, 4, 0, time.Now().Add(time.Hour), time.Now().Add(2*time.Hour))
	v, err := r.Campaigns.End(ctx, id)
	require.NoError(t, err)
	require.Equal(t, campaign.Ended, v.State)
	require.True(t, v.EndsAt.After(v.StartsAt), "the window [%s, %s)", v.StartsAt, v.EndsAt)
	require.False(t, v.EndsAt.After(time.Now()))
	lv, err := r.Stock.CampaignLevels(ctx, stock.Campaign{ID: id, SKU: sku})
	require.NoError(t, err)
	require.False(t, lv.Initialised, "an ended campaign has nothing in Redis")
	r.Clock.Advance(time.Millisecond)
	_, err = r.Campaigns.Buy(ctx, id, "u1", "")
	require.ErrorIs(t, err, inventory.ErrEnded)
	_, err = r.Orders.BuyCampaign(ctx, "u1", "", order.CampaignSale{ID: id, SKU: sku}, time.Now().Add(time.Hour))
	require.ErrorIs(t, err, inventory.ErrEnded)
	lv, err = r.Stock.CampaignLevels(ctx, stock.Campaign{ID: id, SKU: sku})
	require.NoError(t, err)
	require.False(t, lv.Initialised)
	r.RequireQty(sku, 10, 0)
	r.CheckInvariant(sku)
}

// redisKeys is every key of the rig's Redis database (the test's own).
func redisKeys(t *testing.T, r *testrig.Rig) []string {
	t.Helper()
	var keys []string
	iter := r.RDB.Scan(context.Background(), 0, "*", 1000).Iterator()
	for iter.Next(context.Background()) {
		keys = append(keys, iter.Val())
	}
	require.NoError(t, iter.Err())
	slices.Sort(keys)
	return keys
}

// An ended campaign leaves nothing behind in Redis, whichever way it ends
// (the end route, or its window's close and the timeout sweep that
// releases the pool): after sales under a per-user limit, a hold released
// while it ran (back to the pool), a sale in flight at the end (admitted
// in Redis, then refused by the database: undone, and realigned as a sale
// of unknown outcome is), a hold that expires after the end and one
// cancelled after it (back to the SKU), a buy after the end and one
// through a node's stale view (straight to the pool), the Redis key set is
// the one before the campaign.
func TestAnEndedCampaignLeavesNoKeys(t *testing.T) {
	for _, end := range []struct {
		name string
		end  func(r *testrig.Rig, id string)
	}{
		{"the end route", func(r *testrig.Rig, id string) {
			_, err := r.Campaigns.End(context.Background(), id)
			require.NoError(r.T, err)
		}},
		{"the window and the sweep", func(r *testrig.Rig, id string) {
			r.Clock.Advance(2 * time.Hour) // the sweep's clock; the database's says the same an hour later
			n, err := r.Tokens.ReleaseExpired(context.Background(), 100)
			require.NoError(r.T, err)
			require.Equal(r.T, 1, n, "the pool, released at its deadline")
		}},
	} {
		t.Run(end.name, func(t *testing.T) {
			r := testrig.New(t, testrig.MemoryTransport(t))
			ctx := context.Background()
			sku := r.PutSKU("KEYS", 20, 0)
			require.NoError(t, r.Stock.EnsureInit(ctx, sku))
			before := redisKeys(t, r)

			id := testenv.Unique("c")
			_, err := r.Campaigns.Put(ctx, id, campaign.Spec{SKU: sku, Allotment: 5, StartsAt: time.Now().Add(-time.Second),
				EndsAt: time.Now().Add(time.Hour), PerUserLimit: 2}, nil)
			require.NoError(t, err)
			pool := stock.Campaign{ID: id, SKU: sku}
			var orders []*order.Order
			for _, u := range []string{"alice", "alice", "bob", "carol"} {
				o, err := r.Campaigns.Buy(ctx, id, u, "")
				require.NoError(t, err)
				orders = append(orders, o)
			}
			_, err = r.Campaigns.Buy(ctx, id, "alice", "")
			require.ErrorIs(t, err, inventory.ErrConflict, "alice's limit")
			_, err = r.Orders.Cancel(ctx, orders[1].ID) // while it runs: back to the pool
			require.NoError(t, err)
			dave := &stock.Buyer{User: "dave", Limit: 2}
			inFlight, err := r.Stock.AdmitCampaign(ctx, pool, 1, dave, time.Now())
			require.NoError(t, err)
			require.NotEmpty(t, slices.DeleteFunc(redisKeys(t, r), func(k string) bool { return slices.Contains(before, k) }),
				"the campaign has keys while it runs")

			end.end(r, id)
			// The sale in flight: the database refuses it (the pool is
			// released), and its failure tails run.
			require.NoError(t, r.Stock.UndoCampaign(ctx, pool, 1, inFlight, dave))
			require.NoError(t, r.Stock.RealignCampaign(ctx, pool))
			// Buys after the end: from this node's view, and from a node
			// whose view still has the window open.
			_, err = r.Campaigns.Buy(ctx, id, "erin", "")
			require.ErrorIs(t, err, inventory.ErrEnded)
			_, err = r.Orders.BuyCampaign(ctx, "erin", "", order.CampaignSale{ID: id, SKU: sku, Limit: 2}, time.Now())
			require.ErrorIs(t, err, inventory.ErrEnded)
			// Holds after the end: one expires, one is cancelled; their units
			// go back to the SKU.
			r.Clock.Advance(testrig.TTL + time.Second)
			ok, err := r.Orders.Expire(ctx, orders[0].ID)
			require.NoError(t, err)
			require.True(t, ok)
			for _, o := range orders[2:] {
				_, err := r.Orders.Cancel(ctx, o.ID)
				require.NoError(t, err)
			}

			require.Equal(t, before, redisKeys(t, r), "Redis keys after the campaign ended")
			r.RequireQty(sku, 20, 0)
			r.CheckInvariant(sku)
		})
	}
}

// However many product pages poll a campaign, a node reads it from the
// database at most once per Staleness, one read at a time: 100 pollers
// arriving together after it went stale cost one read (its two statements).
func TestCountdownIsReadOnceForManyPollers(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	id, _ := put(t, r, 10, 4, 0, time.Now().Add(-time.Second), time.Now().Add(time.Hour))
	r.Clock.Advance(campaign.Staleness)
	n := testrig.CountStatements(t, r.DB, func() {
		testrig.Race(100, func(int) {
			v, err := r.Campaigns.Get(ctx, id)
			if err != nil || v.State != campaign.Live || v.Remaining != 4 {
				t.Errorf("%+v, %v", v, err)
			}
		})
	})
	require.EqualValues(t, 2, n, "the campaign and its counts, once")
}

// Before the opening a node reads a campaign from the database once (when
// it was put): a minute of countdown polls and early buys, every 100 ms up
// to starts_at, sends not one statement. The view is checked against
// Redis's copy of the pool instead, which every change of the campaign
// writes again.
func TestNoStatementsBeforeTheOpening(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	opens := r.Clock.Now().Add(time.Minute)
	id, _ := put(t, r, 50, 20, 0, opens, opens.Add(time.Hour))
	var polls int
	n := testrig.CountStatements(t, r.DB, func() {
		for ; r.Clock.Now().Before(opens); r.Clock.Advance(100 * time.Millisecond) {
			v, err := r.Campaigns.Get(ctx, id)
			require.NoError(t, err)
			require.Equal(t, campaign.Scheduled, v.State)
			require.EqualValues(t, 20, v.Remaining)
			_, err = r.Campaigns.Buy(ctx, id, "u1", "")
			require.ErrorIs(t, err, inventory.ErrNotStarted)
			polls++
		}
	})
	require.Zero(t, n, "statements in %d polls and buys before the opening", polls)
	require.Zero(t, r.Count(`SELECT COUNT(*) FROM orders`))
}

// A campaign changed on another node: this node's countdown follows
// within Staleness, without waiting for the opening; and when the change
// moves the opening earlier, to a moment already past, this node sells
// within Staleness instead of refusing by the window it had read.
func TestAChangeOnAnotherNodeIsSeenWithinStaleness(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	opens := r.Clock.Now().Add(time.Hour)
	id, sku := put(t, r, 50, 20, 0, opens, opens.Add(time.Hour))
	other := campaign.New(r.DB, r.Stock, r.Orders, campaign.Config{Now: r.Clock.Now})
	v, err := other.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, [2]int64{20, 0}, [2]int64{v.Allotment, v.PerUserLimit})

	_, err = r.Campaigns.Put(ctx, id, campaign.Spec{SKU: sku, Allotment: 30, StartsAt: opens, EndsAt: opens.Add(time.Hour), PerUserLimit: 2}, nil)
	require.NoError(t, err)
	r.Clock.Advance(campaign.Staleness)
	v, err = other.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, [3]int64{30, 2, 30}, [3]int64{v.Allotment, v.PerUserLimit, v.Remaining}, "the other node's change, after Staleness")

	_, err = other.Buy(ctx, id, "u1", "")
	require.ErrorIs(t, err, inventory.ErrNotStarted)
	opened := time.Now().Add(-time.Second) // the database's clock decides: a moment it has passed
	_, err = r.Campaigns.Put(ctx, id, campaign.Spec{SKU: sku, Allotment: 30, StartsAt: opened, EndsAt: opens.Add(time.Hour), PerUserLimit: 2}, nil)
	require.NoError(t, err)
	r.Clock.Advance(campaign.Staleness)
	o, err := other.Buy(ctx, id, "u1", "")
	require.NoError(t, err, "the opening moved earlier on another node")
	require.Equal(t, sku, o.Items[0].SKU)
	v, err = other.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, campaign.Live, v.State)
	require.True(t, v.StartsAt.Equal(opened.UTC().Truncate(time.Microsecond)), "%s", v.StartsAt)
}

// During a sale a buy waits for no read of the campaign's counts (a scan
// of its reservations, longer with every sale): after Staleness its
// definition is confirmed in Redis, and every buy costs only the sale's
// own statements. A change on another node (a new limit) is still seen
// within Staleness: Redis's copy no longer confirms the old definition.
func TestBuysDuringTheSaleReadNoCounts(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	id, sku := put(t, r, 100, 50, 1, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	_, err := r.Campaigns.Buy(ctx, id, "u0", "")
	require.NoError(t, err)
	var reads atomic.Int64
	name := "count-reads:" + t.Name()
	count := func(tx *gorm.DB) {
		if q := tx.Statement.SQL.String(); strings.Contains(q, "GROUP BY state") || strings.Contains(q, "FROM `campaigns` WHERE id =") {
			reads.Add(1) // the view's reads: its counts, its row
		}
	}
	require.NoError(t, r.DB.Callback().Row().After("gorm:row").Register(name, count))
	require.NoError(t, r.DB.Callback().Query().After("gorm:query").Register(name, count))
	t.Cleanup(func() { _ = r.DB.Callback().Row().Remove(name); _ = r.DB.Callback().Query().Remove(name) })
	for i := 1; i <= 6; i++ {
		r.Clock.Advance(campaign.Staleness)
		_, err := r.Campaigns.Buy(ctx, id, fmt.Sprintf("u%d", i), "")
		require.NoError(t, err)
	}
	require.Zero(t, reads.Load(), "reads of the view in 6 buys, each after Staleness")

	other := campaign.New(r.DB, r.Stock, r.Orders, campaign.Config{Now: r.Clock.Now})
	_, err = other.Put(ctx, id, campaign.Spec{SKU: sku, Allotment: 50, StartsAt: time.Now().Add(-time.Minute), EndsAt: time.Now().Add(time.Hour),
		PerUserLimit: 2}, nil)
	require.NoError(t, err)
	reads.Store(0) // the other node's own
	r.Clock.Advance(campaign.Staleness)
	_, err = r.Campaigns.Buy(ctx, id, "u1", "")
	require.NoError(t, err, "the limit raised to 2 on another node is this node's within Staleness")
	require.EqualValues(t, 2, reads.Load(), "the view read again once (the row and its counts)")
	_, err = r.Campaigns.Buy(ctx, id, "u1", "")
	require.ErrorIs(t, err, inventory.ErrConflict, "and the new limit holds")
}

// A buy that crosses nothing (not the campaign's first sale, not its
// last unit) costs no statement for campaign events: the order's row,
// its reservation (lean: the hold's row), the campaign's limit, the pool's conditional UPDATE
// and the pool's fence read (which also takes its units and the
// campaign's event flags); no SKU's fence, as it moves no SKU's row. The
// first buy pays for campaign.started, the last for campaign.sold_out.
func TestABuyThatCrossesNothingCostsNoStatementMore(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	id, _ := put(t, r, 10, 3, 0, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	cost := func(user string) int64 {
		return testrig.CountStatements(t, r.DB, func() {
			_, err := r.Campaigns.Buy(ctx, id, user, "")
			require.NoError(t, err)
		})
	}
	first, middle, last := cost("u1"), cost("u2"), cost("u3")
	t.Logf("statements of a campaign buy: the first %d, one that crosses nothing %d, the last %d", first, middle, last)
	want := int64(5)
	if r.IsLean() {
		want = 4 // the hold's row instead of the order's and the reservation's
	}
	require.Equal(t, want, middle)
	require.Greater(t, first, middle)
	require.Greater(t, last, middle)
}

// A campaign's per-user counts in Redis are fenced as a SKU's are: a
// buyer whose admission died (Redis counted it, the database never
// recorded it) is refused by that count only until the pool is realigned,
// whose counts are the database's; and once the buyer's sale is recorded,
// a Redis that lost the counts learns them again from the database, so
// the limit holds in Redis, not only in the database.
func TestADeadAdmissionDoesNotCountAgainstTheBuyer(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	id, sku := put(t, r, 10, 5, 1, time.Now().Add(-time.Second), time.Now().Add(time.Hour))
	pool := stock.Campaign{ID: id, SKU: sku}
	_, err := r.Stock.AdmitCampaign(ctx, pool, 1, &stock.Buyer{User: "ann", Limit: 1}, time.Now()) // ...and its node dies
	require.NoError(t, err)
	_, err = r.Campaigns.Buy(ctx, id, "ann", "")
	require.ErrorIs(t, err, inventory.ErrConflict, "until a realign, Redis counts the dead admission")

	require.NoError(t, r.Stock.RealignCampaign(ctx, pool))
	o, err := r.Campaigns.Buy(ctx, id, "ann", "")
	require.NoError(t, err, "realigned: ann's count is the database's, which never had the dead admission")
	require.Equal(t, sku, o.Items[0].SKU)

	require.NoError(t, r.RDB.Del(ctx, "inv:{"+sku+"}:cb:"+id).Err()) // Redis loses the counts
	_, err = r.Campaigns.Buy(ctx, id, "ann", "")
	require.ErrorIs(t, err, inventory.ErrConflict)
	stmts := testrig.CountStatements(t, r.DB, func() {
		_, err = r.Campaigns.Buy(ctx, id, "ann", "")
	})
	require.ErrorIs(t, err, inventory.ErrConflict)
	require.Zero(t, stmts, "Redis refuses ann by the count it read again from the database")
	n, cerr := arbiter.CountCampaign(r.DB, id)
	require.NoError(t, cerr)
	require.Equal(t, arbiter.CampaignCounts{Held: 1, Left: 4}, n)
	r.CheckInvariant(sku)
}
