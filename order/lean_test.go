package order_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/projection"
	"github.com/acme/inventory/order"
	"github.com/acme/inventory/testkit/testrig"
)

// TestLeanContract runs the order suite again with every sale recorded as
// the lean sale does (one row of holds in the commit, the order and its
// reservations projected after it): each order must answer, pay, cancel,
// expire, extend and refund as before, whether the projector has run or
// not.
func TestLeanContract(t *testing.T) {
	testrig.RunLean(t,
		TestIdempotentCreate,
		TestIdempotentRetryAfterRedisForgot,
		TestPayCancelRefund,
		TestCancelPayRaceOneWinner,
		TestLatePayment,
		TestItemsAreTheReservations,
		TestEndToEndMemory,
		TestKeyLossWithPendingAndUnapplied,
		TestDatabaseRefusesWhatRedisOverAdmits,
		TestPerUserLimitIsArbitratedByTheDatabase,
		TestPerUserLimitSetLater,
		TestPerUserLimitRace,
		TestSeckillCountsTheLimitInTheAdmission,
		TestRealignRestoresBuyersCounts,
		TestLostBuyersCountsComeBackFromTheDatabase,
		TestCreateHold,
		TestExtendRules,
		TestExtensionRacesTheTimeout,
		TestShip,
		TestShipRacesRefund,
		TestBuySeckillReadsTheSKUsLimit,
	)
	if !testrig.Embedded { // MariaDB's alone
		// (TestExtensionIsOneRoundTrip is not among them: the first
		// transition of an order the projector has not reached writes its
		// projection first, more round trips, once.)
		testrig.RunLean(t, TestSeckillOfUnknownOutcomeKeepsItsAdmission, TestCartOfUnknownOutcomeKeepsItsAdmission)
	}
}

// The lean sale's commit writes one row of holds per line and none of
// the projection; the order answers at once all the same, and the
// projector writes the rest exactly once, at the positions the sale
// numbered.
func TestLeanSaleRecordsOneRowPerHold(t *testing.T) {
	r := testrig.NewLean(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	r.AddSKU("LA", 10)
	r.AddSKU("LB", 10)

	o, err := r.Orders.Create(ctx, "u1", "k1", []inventory.Line{{SKU: "LA", Qty: 2}, {SKU: "LB", Qty: 1}})
	require.NoError(t, err)
	require.EqualValues(t, 2, r.Raw(`SELECT COUNT(*) FROM holds`))
	require.Zero(t, r.Raw(`SELECT COUNT(*) FROM orders`), "the order is the projection's")
	require.Zero(t, r.Raw(`SELECT COUNT(*) FROM stock_reservations`))
	require.Zero(t, r.Raw(`SELECT COUNT(*) FROM stock_movements WHERE kind = 'RESERVE'`))
	require.EqualValues(t, 1, r.Raw(`SELECT COUNT(*) FROM idempotency_keys WHERE order_id = ?`, o.ID))
	require.EqualValues(t, 2, r.Raw(`SELECT COUNT(*) FROM skus WHERE holds_dirty = 1`))
	r.RequireQty("LA", 10, 2)

	// Read at once: projected by the read.
	got, err := r.Orders.Get(ctx, o.ID)
	require.NoError(t, err)
	require.Equal(t, o.ID, got.ID)
	require.Equal(t, "u1", got.UserID)
	require.Equal(t, order.Pending, got.Status)
	require.Equal(t, []order.Item{{OrderID: o.ID, SKU: "LA", Qty: 2}, {OrderID: o.ID, SKU: "LB", Qty: 1}}, got.Items)
	require.True(t, got.ExpiresAt.Equal(o.ExpiresAt))
	require.EqualValues(t, 1, r.Raw(`SELECT COUNT(*) FROM orders`))

	// More sales, then the projector: each hold once, its movement at
	// the seq the sale numbered, the cursors at the end.
	for i := range 5 {
		_, err := r.Orders.Create(ctx, fmt.Sprintf("u%d", i+2), "", testrig.Line("LA", 1))
		require.NoError(t, err)
	}
	r.Catch()
	r.Catch() // again: nothing changes
	require.EqualValues(t, 6, r.Raw(`SELECT COUNT(*) FROM orders`))
	require.EqualValues(t, 7, r.Raw(`SELECT COUNT(*) FROM stock_reservations`))
	require.Zero(t, r.Raw(`SELECT COUNT(*) FROM holds h LEFT JOIN stock_movements m ON m.sku = h.sku AND m.position = h.seq
		AND m.kind = 'RESERVE' AND m.reserved_delta = h.qty WHERE m.id IS NULL`), "every hold's RESERVE at its seq")
	require.Zero(t, r.Raw(`SELECT COUNT(*) FROM skus WHERE projected_seq <> hold_seq OR holds_dirty <> 0`))
	require.EqualValues(t, 7, r.MovementSums("LA")[1], "the reservations' movements sum to reserved")
	r.CheckInvariant("LA")
	r.CheckInvariant("LB")
}

// No hold outlives its deadline because the projector is down: the sweep
// projects what it needs (the projector never runs here).
func TestLeanHoldExpiresWithoutTheProjector(t *testing.T) {
	r := testrig.NewLean(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	r.AddSKU("LX", 3)
	o, err := r.Orders.Create(ctx, "u1", "", testrig.Line("LX", 3))
	require.NoError(t, err)

	ids, err := r.Orders.ExpiredIDs(ctx, 10)
	require.NoError(t, err)
	require.Empty(t, ids, "not due yet")
	r.Clock.Advance(testrig.TTL + time.Second)
	ids, err = r.Orders.ExpiredIDs(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, []string{o.ID}, ids, "found by the sweep with the projector down")
	expired, err := r.Orders.Expire(ctx, o.ID)
	require.NoError(t, err)
	require.True(t, expired)
	rawReserved := r.Raw(`SELECT reserved FROM skus WHERE sku = 'LX'`)
	require.Zero(t, rawReserved, "the units are back")
	again, err := r.Orders.Create(ctx, "u3", "", testrig.Line("LX", 3))
	require.NoError(t, err, "and sell again")
	require.NotEqual(t, o.ID, again.ID)
	r.CheckInvariant("LX")
}

// Buyers race the projector: sales, cancels right after their 201 (before
// or after the projector reached them) and projector rounds all at once,
// under -race. Every order is found with its lines, every cancel gives
// its units back once, and the counters are the projection's sums.
func TestLeanSalesRaceTheProjector(t *testing.T) {
	r := testrig.NewLean(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	const stock = 40
	r.AddSKU("LR", stock)
	stop := make(chan struct{})
	projected := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				projected <- nil
				return
			default:
			}
			if _, err := r.Projector.Round(ctx); err != nil {
				projected <- err
				return
			}
		}
	}()
	var sold, cancelled, refused atomic.Int64
	ids := make([]string, 60)
	testrig.Race(60, func(i int) {
		o, err := r.Orders.Create(ctx, fmt.Sprintf("b%d", i), "", testrig.Line("LR", 1))
		switch {
		case errors.Is(err, inventory.ErrInsufficientStock):
			refused.Add(1)
			return
		case err != nil:
			t.Errorf("buyer %d: %v", i, err)
			return
		}
		sold.Add(1)
		ids[i] = o.ID
		if i%3 == 0 {
			if _, err := r.Orders.Cancel(ctx, o.ID); err != nil {
				t.Errorf("cancel %d: %v", i, err)
				return
			}
			cancelled.Add(1)
		}
	})
	close(stop)
	require.NoError(t, <-projected)
	require.EqualValues(t, 60, sold.Load()+refused.Load())
	require.LessOrEqual(t, sold.Load()-cancelled.Load(), int64(stock), "never more held than stocked")
	for i, id := range ids {
		if id == "" {
			continue
		}
		o, err := r.Orders.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, []order.Item{{OrderID: id, SKU: "LR", Qty: 1}}, o.Items)
		want := order.Pending
		if i%3 == 0 {
			want = order.Cancelled
		}
		require.Equal(t, want, o.Status, "order of buyer %d", i)
	}
	r.Catch()
	r.RequireQty("LR", stock, sold.Load()-cancelled.Load())
	require.Equal(t, sold.Load()-cancelled.Load(), r.MovementSums("LR")[1], "the movements sum to reserved")
	require.EqualValues(t, sold.Load(), r.Count(`SELECT COUNT(*) FROM orders`))
	r.CheckInvariant("LR")
}

// An Idempotency-Key makes a retry a duplicate whichever way each attempt
// is written: a node selling lean and one writing as before, on one
// database, racing the same key, make one order.
func TestLeanKeyIsOneOrderAcrossWritePaths(t *testing.T) {
	classic := testrig.New(t, testrig.MemoryTransport(t))
	testrig.Lean = true
	lean := testrig.Assemble(t, classic.Transport, classic.DB, classic.RDB, testrig.Opts{})
	testrig.Lean = false
	ctx := context.Background()
	classic.AddSKU("LK", 100)
	for round := range 10 {
		key := fmt.Sprintf("key-%d", round)
		ids := make([]string, 8)
		testrig.Race(8, func(i int) {
			node := classic
			if i%2 == 1 {
				node = lean
			}
			o, err := node.Orders.Create(ctx, "u1", key, testrig.Line("LK", 2))
			if err != nil {
				t.Errorf("round %d attempt %d: %v", round, i, err)
				return
			}
			ids[i] = o.ID
		})
		for i := range ids {
			require.Equal(t, ids[0], ids[i], "round %d: one order for the key", round)
		}
	}
	classic.Catch()
	require.EqualValues(t, 10, classic.Count(`SELECT COUNT(*) FROM orders`))
	classic.RequireQty("LK", 100, 20)
	classic.CheckInvariant("LK")
}

// A cart's lines are on several SKUs, which the projector reaches in
// different rounds when its backlog is long: an order is projected whole
// all the same, so no read finds it with some of its lines and no cancel
// gives back some of them while the rest stays held.
func TestLeanCartIsProjectedWhole(t *testing.T) {
	r := testrig.NewLean(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	r.AddSKU("LC1", 10)
	r.AddSKU("LC2", 10)
	o, err := r.Orders.Create(ctx, "u1", "", []inventory.Line{{SKU: "LC1", Qty: 2}, {SKU: "LC2", Qty: 3}})
	require.NoError(t, err)
	// One SKU a round: the first round reaches one of the cart's SKUs.
	narrow := projection.New(r.DB, r.Stock.Locker(), projection.Config{SKUs: 1, PerSKU: 1})
	n, err := narrow.Round(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "one SKU's hold read")
	require.EqualValues(t, 2, r.Raw(`SELECT COUNT(*) FROM stock_reservations WHERE order_id = ?`, o.ID), "and the whole order written")
	got, err := r.Orders.Get(ctx, o.ID)
	require.NoError(t, err)
	require.Len(t, got.Items, 2)
	_, err = r.Orders.Cancel(ctx, o.ID)
	require.NoError(t, err)
	r.RequireQty("LC1", 10, 0)
	r.RequireQty("LC2", 10, 0)
	r.Catch()
	r.CheckInvariant("LC1")
	r.CheckInvariant("LC2")
}

// A round is bounded (up to PerSKU holds of a SKU, up to Holds in all, up
// to SKUs SKUs) and the SKUs with a backlog take turns, round robin by
// name: a SKU far behind never starves the others, and what a bound left
// is projected by the next rounds, each hold once.
func TestLeanProjectorRoundsAreBoundedAndTakeTurns(t *testing.T) {
	r := testrig.NewLean(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	for sku, n := range map[string]int{"LRA": 5, "LRB": 3, "LRC": 1} {
		r.AddSKU(sku, 10)
		for i := range n {
			_, err := r.Orders.Create(ctx, fmt.Sprintf("u%d", i), "", []inventory.Line{{SKU: sku, Qty: 1}})
			require.NoError(t, err)
		}
	}
	p := projection.New(r.DB, r.Stock.Locker(), projection.Config{SKUs: 2, PerSKU: 2, Holds: 3})
	projected := func() []int64 {
		var out []int64
		for _, sku := range []string{"LRA", "LRB", "LRC"} {
			out = append(out, r.Raw(`SELECT COUNT(*) FROM stock_reservations WHERE sku = ?`, sku))
		}
		return out
	}
	for i, want := range []struct {
		n      int
		counts []int64
	}{
		{3, []int64{2, 1, 0}}, // LRA and LRB (two SKUs): LRA's PerSKU, then LRB up to Holds
		{3, []int64{4, 1, 1}}, // from after LRB: LRC, then round the end to LRA
		{3, []int64{5, 3, 1}}, // from after LRA: LRB's last two, then LRA's last one
		{0, []int64{5, 3, 1}},
	} {
		n, err := p.Round(ctx)
		require.NoError(t, err)
		require.Equal(t, want.n, n, "round %d: holds read", i+1)
		require.Equal(t, want.counts, projected(), "round %d: reservations of LRA, LRB, LRC", i+1)
	}
	require.EqualValues(t, 0, r.Raw(`SELECT COUNT(*) FROM skus WHERE holds_dirty = 1`), "every cursor at its SKU's last hold")
	for _, sku := range []string{"LRA", "LRB", "LRC"} {
		r.CheckInvariant(sku)
	}
}

// A round whose holds were all projected already (their payments, reads
// or cancels projected them first) still moves its SKU's cursor past
// them: the skipped holds are not the projector's to forget, and the next
// round reads the holds after them.
func TestLeanProjectorMovesPastHoldsProjectedFirst(t *testing.T) {
	r := testrig.NewLean(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	r.AddSKU("LPF", 10)
	var ids []string
	for i := range 3 {
		o, err := r.Orders.Create(ctx, fmt.Sprintf("u%d", i), "", []inventory.Line{{SKU: "LPF", Qty: 1}})
		require.NoError(t, err)
		ids = append(ids, o.ID)
	}
	for _, id := range ids[:2] { // read: projected by the read
		_, err := r.Orders.Get(ctx, id)
		require.NoError(t, err)
	}
	p := projection.New(r.DB, r.Stock.Locker(), projection.Config{PerSKU: 2})
	for i, want := range []int{2, 1, 0} {
		n, err := p.Round(ctx)
		require.NoError(t, err)
		require.Equal(t, want, n, "round %d: holds read", i+1)
	}
	require.EqualValues(t, 3, r.Raw(`SELECT COUNT(*) FROM stock_reservations WHERE sku = 'LPF'`))
	require.EqualValues(t, 0, r.Raw(`SELECT COUNT(*) FROM skus WHERE holds_dirty = 1`))
	r.CheckInvariant("LPF")
}

// With the projector down, the sweep pages past the expired holds it
// projected already: a pass of one hold at a time reaches each of them in
// turn, not the first one at every pass.
func TestLeanSweepPagesPastTheHoldsItProjected(t *testing.T) {
	r := testrig.NewLean(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	r.AddSKU("LXP", 3)
	var want []string
	for i := range 3 {
		o, err := r.Orders.Create(ctx, fmt.Sprintf("u%d", i), "", testrig.Line("LXP", 1))
		require.NoError(t, err)
		want = append(want, o.ID)
	}
	r.Clock.Advance(testrig.TTL + time.Second)
	for i := range 3 {
		ids, err := r.Orders.ExpiredIDs(ctx, 1)
		require.NoError(t, err)
		require.Equal(t, []string{want[i]}, ids, "pass %d", i+1)
		expired, err := r.Orders.Expire(ctx, ids[0])
		require.NoError(t, err)
		require.True(t, expired)
	}
	require.Zero(t, r.Raw(`SELECT reserved FROM skus WHERE sku = 'LXP'`), "every unit back, the projector never run")
	r.CheckInvariant("LXP")
}

// The database may pick the projection a payment writes first (its order
// not yet projected) as a deadlock's victim: the payment runs it again,
// as every transaction of the service does, and the buyer's callback is
// answered, never a 500. Here a transaction that wrote more rows holds
// the RESERVE movement's place the projection inserts, then asks for the
// order's row the projection inserted: InnoDB rolls the projection back.
func TestLeanPaymentOutlivesItsProjectionsDeadlock(t *testing.T) {
	r := testrig.NewLean(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	r.AddSKU("LD", 5)
	o, err := r.Orders.Create(ctx, "u1", "", testrig.Line("LD", 2))
	require.NoError(t, err)
	seq := r.Raw(`SELECT seq FROM holds WHERE sku = 'LD'`)

	blocker := r.DB.Begin()
	defer blocker.Rollback()
	for i := range 20 { // heavier than the projection: InnoDB's victim is the lighter one
		require.NoError(t, blocker.Exec(`INSERT INTO stock_movements (sku, position, kind, on_hand_delta, reserved_delta, reason, reference, created_at)
			VALUES ('LD-weight', ?, 'RESERVE', 0, 1, '', 'weight', NOW(6))`, i+1).Error)
	}
	require.NoError(t, blocker.Exec(`INSERT INTO stock_movements (sku, position, kind, on_hand_delta, reserved_delta, reason, reference, created_at)
		VALUES ('LD', ?, 'RESERVE', 0, 2, '', 'blocker', NOW(6))`, seq).Error)

	type answer struct {
		o   *order.Order
		err error
	}
	paid := make(chan answer, 1)
	go func() {
		o, err := r.Orders.Pay(ctx, o.ID, "pay-1")
		paid <- answer{o, err}
	}()
	waiting := func(table string) func() bool { // the projection waits for the blocker (INNODB_TRX is a cache: the process list is fresh)
		return func() bool {
			return r.Raw(`SELECT COUNT(*) FROM information_schema.PROCESSLIST
				WHERE db = DATABASE() AND info LIKE CONCAT('INSERT INTO ', ?, ' %')`, table) == 1
		}
	}
	require.Eventually(t, func() bool {
		select {
		case a := <-paid:
			t.Fatalf("answered before waiting: %+v %v", a.o, a.err)
		default:
		}
		return waiting("stock_movements")()
	}, 10*time.Second, time.Millisecond)
	var ids []string // waits for the projection's order row: a cycle
	require.NoError(t, blocker.Raw(`SELECT id FROM orders WHERE id = ? FOR UPDATE`, o.ID).Scan(&ids).Error)
	require.Empty(t, ids, "the projection was rolled back")
	var a answer
	require.Eventually(t, func() bool { // its second run waits for the blocker again, or it answered
		select {
		case a = <-paid:
			return true
		default:
			return waiting("%")()
		}
	}, 10*time.Second, time.Millisecond)
	require.NoError(t, blocker.Rollback().Error)
	if a.o == nil && a.err == nil {
		a = <-paid
	}
	require.NoError(t, a.err)
	require.Equal(t, order.Paid, a.o.Status)
	r.Catch()
	r.RequireQty("LD", 5, 2)
	r.CheckInvariant("LD")
}
