package events_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/events"
	"github.com/acme/inventory/testkit/testenv"
	"github.com/acme/inventory/testkit/testrig"
)

// Two nodes run the job; one leads at a time. Every event the sales and
// releases write is numbered once for the feed, each SKU's in seq order,
// and one sku.level_changed per SKU carries the levels the SKU ended at.
// When the leader stops, the other takes over and numbers what follows.
func TestJobNumbersEveryEventOnceAndFailsOver(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), // the database pool's own goroutines come and go
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
		goleak.IgnoreAnyFunction("github.com/go-sql-driver/mysql.(*mysqlConn).startWatcher.func1"))
	ctx := context.Background()
	cfg := events.Config{Interval: 20 * time.Millisecond, LevelInterval: 50 * time.Millisecond, LockTTL: 300 * time.Millisecond}
	first, second := events.New(r.DB, r.Stock.Locker(), cfg), events.New(r.DB, r.Stock.Locker(), cfg)
	first.Start(ctx)
	second.Start(ctx)
	defer second.Stop()

	sku := r.PutSKU("EVJ", 2, 0)
	churn := func(n int) {
		for range n {
			tok := testenv.Unique("j")
			_, err := r.Tokens.Reserve(ctx, sku, 2, tok)
			require.NoError(t, err)
			_, err = r.Tokens.Release(ctx, sku, tok)
			require.NoError(t, err)
		}
	}
	churn(5)
	first.Stop()
	first.Stop() // twice: a no-op
	churn(5)

	ev := arbiter.EventsOf(r.DB)
	require.Eventually(t, func() bool {
		// The SKU's events first, then none unpublished: every event read
		// was numbered. (Read the other way round, the last level event
		// could be written between the two reads and not be numbered yet.)
		all, err := ev.OfSKU(sku)
		require.NoError(t, err)
		n, err := ev.Unpublished()
		require.NoError(t, err)
		last := all[len(all)-1]
		return n == 0 && last.Type == arbiter.EventLevelChanged && last.Reserved == 0
	}, 10*time.Second, 20*time.Millisecond, "every event numbered, the last levels announced")
	page, err := ev.Page(arbiter.EventFilter{SKU: sku, Limit: 1000})
	require.NoError(t, err)
	all, err := ev.OfSKU(sku)
	require.NoError(t, err)
	require.Len(t, page, len(all), "each event once in the feed")
	soldOut := 0
	for i, e := range page {
		require.EqualValues(t, i+1, e.Seq, "the feed has the SKU's events in seq order")
		if e.Type == arbiter.EventSoldOut {
			soldOut++
		}
	}
	require.Equal(t, 10, soldOut, "one per sale of the last units")
}

// Orders racing through the group commit (many in a batch, each batch one
// conditional UPDATE per SKU) for more units than there are announce one
// sku.sold_out, with the database's levels; the cancels that follow
// announce one sku.back_in_stock.
func TestGroupCommitRaceAnnouncesOneSoldOut(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	const units, buyers = 20, 64
	sku := r.PutSKU("EVGC", units, 0)
	ids := make([]string, buyers)
	testrig.Race(buyers, func(i int) {
		if o, err := r.Orders.Create(ctx, testenv.Unique("u"), "", testrig.Line(sku, 1)); err == nil {
			ids[i] = o.ID
		}
	})
	r.RequireQty(sku, units, units)
	testrig.Race(buyers, func(i int) {
		if ids[i] != "" {
			_, err := r.Orders.Cancel(ctx, ids[i])
			require.NoError(t, err)
		}
	})
	all, err := arbiter.EventsOf(r.DB).OfSKU(sku)
	require.NoError(t, err)
	var got []string
	for _, e := range all {
		got = append(got, e.Type)
		if e.Type == arbiter.EventSoldOut {
			require.EqualValues(t, [3]int64{units, units, 0}, [3]int64{e.OnHand, e.Reserved, e.Available})
		}
	}
	require.Equal(t, []string{arbiter.EventSoldOut, arbiter.EventBackInStock}, got)
}
