package order_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/order"
	"github.com/acme/inventory/stock"
	"github.com/acme/inventory/testkit/testrig"
)

func TestCreateReservesFirst(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	r.AddSKU("HOT", 3)

	o, err := r.Orders.Create(ctx, "u1", "", testrig.Line("HOT", 3))
	require.NoError(t, err)
	require.Equal(t, order.Pending, o.Status)
	require.Equal(t, r.Clock.Now().Add(15*time.Minute).UTC().Truncate(time.Microsecond), o.ExpiresAt)
	stored, err := r.Orders.Get(ctx, o.ID)
	require.NoError(t, err)
	require.Equal(t, []order.Item{{OrderID: o.ID, SKU: "HOT", Qty: 3}}, stored.Items)
	require.Equal(t, o.ID, stored.ReservationToken)
	var res []arbiter.Reservation
	require.NoError(t, r.DB.Find(&res).Error)
	require.Len(t, res, 1)
	require.Equal(t, arbiter.Reservation{Token: o.ID, SKU: "HOT", OrderID: &o.ID, Qty: 3, State: arbiter.Held, Result: 0,
		ExpiresAt: res[0].ExpiresAt, CreatedAt: res[0].CreatedAt, UpdatedAt: res[0].UpdatedAt}, res[0],
		"the order's reservation row is written with the order, under its id")
	require.True(t, o.ExpiresAt.Equal(res[0].ExpiresAt))
	require.EqualValues(t, 3, r.SKU("HOT").Reserved)
	require.Zero(t, r.RedisAvailable("HOT"))

	// Sold out: a burst of buyers never reaches the database.
	n := testrig.CountStatements(t, r.DB, func() {
		var wg sync.WaitGroup
		for i := 0; i < 50; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := r.Orders.Create(ctx, fmt.Sprintf("u%d", i), "", testrig.Line("HOT", 1))
				if !errors.Is(err, inventory.ErrInsufficientStock) {
					t.Errorf("want insufficient stock, got %v", err)
				}
			}()
		}
		wg.Wait()
	})
	require.Zero(t, n, "no statement reached the database")
	require.EqualValues(t, 1, r.Count(`SELECT COUNT(*) FROM orders`))
	require.EqualValues(t, 1, r.Count(`SELECT COUNT(*) FROM stock_reservations`))
	require.Zero(t, r.RedisAvailable("HOT"), "the refused admissions took nothing")

	_, err = r.Orders.Create(ctx, "u1", "", testrig.Line("NOPE", 1))
	require.ErrorIs(t, err, inventory.ErrUnknownSKU)
	for _, bad := range [][]inventory.Line{nil, testrig.Line("HOT", 0), testrig.Line("HOT", -2), testrig.Line("HO T", 1), testrig.Line("HOT", inventory.DefaultMaxQty+1)} {
		_, err = r.Orders.Create(ctx, "u1", "", bad)
		require.ErrorIs(t, err, inventory.ErrInvalidArgument)
	}
	_, err = r.Orders.Create(ctx, "bad user", "", testrig.Line("HOT", 1))
	require.ErrorIs(t, err, inventory.ErrInvalidArgument)
	require.EqualValues(t, 1, r.Count(`SELECT COUNT(*) FROM orders`), "bad input wrote nothing")
	require.EqualValues(t, 3, r.SKU("HOT").Reserved)
	r.CheckInvariant("HOT")
}

func TestIdempotentCreate(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	r.AddSKU("A", 100)
	r.AddSKU("B", 100)
	cart := []inventory.Line{{SKU: "B", Qty: 1}, {SKU: "A", Qty: 2}}

	var wg sync.WaitGroup
	ids := make([]string, 16)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o, err := r.Orders.Create(ctx, "u1", "key-1", cart)
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = o.ID
		}()
	}
	wg.Wait()
	for _, id := range ids {
		require.Equal(t, ids[0], id, "every retry gets the same order")
	}
	require.EqualValues(t, 1, r.Count(`SELECT COUNT(*) FROM orders`))
	require.EqualValues(t, 2, r.Count(`SELECT COUNT(*) FROM stock_reservations WHERE token = ?`, ids[0]))
	require.EqualValues(t, 2, r.SKU("A").Reserved, "reserved once in the database")
	require.EqualValues(t, 1, r.SKU("B").Reserved)
	require.EqualValues(t, 98, r.RedisAvailable("A"), "the losing retries gave their admissions back")
	require.EqualValues(t, 99, r.RedisAvailable("B"))

	_, err := r.Orders.Create(ctx, "u1", "key-1", testrig.Line("A", 5))
	require.ErrorIs(t, err, inventory.ErrConflict, "same key, different order")
	require.EqualValues(t, 98, r.RedisAvailable("A"), "a conflicting retry takes nothing")
	o2, err := r.Orders.Create(ctx, "u2", "key-1", cart)
	require.NoError(t, err, "keys are per user")
	require.NotEqual(t, ids[0], o2.ID)
	r.CheckInvariant("A")
	r.CheckInvariant("B")
}

func TestPayCancelRefund(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	r.AddSKU("A", 10)
	redisApplied := r.RedisApplied()
	stop := r.StartPipeline()
	defer stop()

	o, err := r.Orders.Create(ctx, "u1", "", testrig.Line("A", 4))
	require.NoError(t, err)
	for i := 0; i < 3; i++ { // the provider delivers the callback three times
		paid, err := r.Orders.Pay(ctx, o.ID, "pay-1")
		require.NoError(t, err)
		require.Equal(t, order.Paid, paid.Status)
		require.Equal(t, "pay-1", *paid.PaymentID)
		require.Equal(t, o.ID, paid.ReservationToken)
	}
	_, err = r.Orders.Pay(ctx, o.ID, "pay-2")
	require.ErrorIs(t, err, inventory.ErrConflict, "a second payment for a paid order")
	_, err = r.Orders.Cancel(ctx, o.ID)
	require.ErrorIs(t, err, inventory.ErrConflict, "a paid order cannot be cancelled")
	require.EqualValues(t, 1, r.Count(`SELECT COUNT(*) FROM stock_outbox WHERE token = ? AND op = 'DEDUCT' AND qty = 4`, o.ID))
	require.EqualValues(t, 1, r.Count(`SELECT COUNT(*) FROM stock_outbox`))

	r.WaitApplied()
	require.Equal(t, arbiter.Sold, r.ReservationState(o.ID, "A"))
	r.RequireQty("A", 6, 0)
	r.CheckInvariant("A")

	refunded, err := r.Orders.Refund(ctx, o.ID)
	require.NoError(t, err)
	require.Equal(t, order.Refunded, refunded.Status)
	_, err = r.Orders.Refund(ctx, o.ID)
	require.ErrorIs(t, err, inventory.ErrConflict)
	require.EqualValues(t, 1, r.Count(`SELECT COUNT(*) FROM stock_outbox WHERE token = ? AND op = 'RESTORE' AND qty = 4`, o.ID))
	r.WaitApplied()
	redisApplied(1)
	require.EqualValues(t, 10, r.OnHand("A"))
	require.EqualValues(t, 10, r.RedisAvailable("A"), "refund gave the units back in Redis")
	r.CheckInvariant("A")

	c, err := r.Orders.Create(ctx, "u1", "", testrig.Line("A", 2))
	require.NoError(t, err)
	require.EqualValues(t, 8, r.RedisAvailable("A"))
	cancelled, err := r.Orders.Cancel(ctx, c.ID)
	require.NoError(t, err)
	require.Equal(t, order.Cancelled, cancelled.Status)
	require.Equal(t, arbiter.Released, r.ReservationState(c.ID, "A"))
	require.EqualValues(t, 10, r.RedisAvailable("A"), "the cancel gave the units back in Redis")
	_, err = r.Orders.Cancel(ctx, c.ID)
	require.ErrorIs(t, err, inventory.ErrConflict)
	require.EqualValues(t, 10, r.RedisAvailable("A"), "a second cancel gives back nothing")
	_, err = r.Orders.Refund(ctx, c.ID)
	require.ErrorIs(t, err, inventory.ErrConflict, "only paid orders are refunded")
	_, err = r.Orders.Pay(ctx, "nope", "pay-9")
	require.ErrorIs(t, err, inventory.ErrNotFound)
	r.RequireQty("A", 10, 0)
	r.CheckInvariant("A")
}

// Two nodes race a cancel and a payment on every order: each order has exactly
// one winner. A payment that wins leaves a PAID order; a payment that comes
// after the cancel leaves REFUND_REQUIRED (the buyer cancelled: the money goes
// back, the stock stays released). The stock follows the winner.
func TestCancelPayRaceOneWinner(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	r.AddSKU("A", 100)
	stop := r.StartPipeline()
	defer stop()

	const orders = 40
	ids := make([]string, orders)
	for i := range ids {
		o, err := r.Orders.Create(ctx, fmt.Sprintf("u%d", i), "", testrig.Line("A", 2))
		require.NoError(t, err)
		ids[i] = o.ID
	}
	var paidWins, refundRequired, cancelWins atomic.Int64
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(2)
		go func() {
			defer wg.Done()
			o, err := r.Orders.Pay(ctx, id, fmt.Sprintf("pay-%d", i))
			switch {
			case err != nil:
				t.Errorf("a payment always lands: %v", err)
			case o.Status == order.Paid:
				paidWins.Add(1)
			case o.Status == order.RefundRequired:
				refundRequired.Add(1)
			default:
				t.Errorf("payment left order %s %s", id, o.Status)
			}
		}()
		go func() {
			defer wg.Done()
			if _, err := r.Orders.Cancel(ctx, id); err == nil {
				cancelWins.Add(1)
			} else if !errors.Is(err, inventory.ErrConflict) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	paid := r.Count(`SELECT COUNT(*) FROM orders WHERE status = 'PAID'`)
	refund := r.Count(`SELECT COUNT(*) FROM orders WHERE status = 'REFUND_REQUIRED'`)
	require.EqualValues(t, orders, paid+refund, "no order is left CANCELLED: each was paid, in time or not")
	require.EqualValues(t, paidWins.Load(), paid)
	require.EqualValues(t, refundRequired.Load(), refund)
	require.EqualValues(t, cancelWins.Load(), refund, "every cancel that won left its payment to be refunded")
	require.EqualValues(t, paid, r.Count(`SELECT COUNT(*) FROM stock_outbox`), "only the paid orders deduct")
	require.Zero(t, r.Count(`SELECT COUNT(*) FROM stock_reservations WHERE token LIKE '%.late'`),
		"a cancelled order is never re-reserved")
	require.EqualValues(t, 2*refund, r.Count(`SELECT COALESCE(SUM(qty), 0) FROM stock_reservations WHERE state = 'RELEASED'`))
	r.WaitApplied()
	r.RequireQty("A", 100-2*paid, 0)
	require.EqualValues(t, paid, r.Count(`SELECT COUNT(*) FROM stock_ledger`), "one ledger row per paid line")
	r.CheckInvariant("A")
}

// A payment that arrives after the order expired re-reserves its lines in the
// database (a reservation "<id>.late", COMMITTED at once) when the stock is
// still there, and otherwise leaves the order REFUND_REQUIRED. A payment for a
// cancelled order is always REFUND_REQUIRED. A PENDING order past its
// deadline that nobody expired yet is simply paid.
func TestLatePayment(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	r.AddSKU("A", 5)
	r.AddSKU("B", 2)
	r.AddSKU("C", 3)

	o, err := r.Orders.Create(ctx, "u1", "", testrig.Line("A", 3))
	require.NoError(t, err)
	r.Clock.Advance(16 * time.Minute)
	paid, err := r.Orders.Pay(ctx, o.ID, "pay-1")
	require.NoError(t, err, "past its deadline but not expired: still held, so paid")
	require.Equal(t, order.Paid, paid.Status)
	require.Equal(t, o.ID, paid.ReservationToken)
	require.Equal(t, arbiter.Committed, r.ReservationState(o.ID, "A"))
	expired, err := r.Orders.Expire(ctx, o.ID)
	require.NoError(t, err)
	require.False(t, expired, "a paid order does not expire")
	require.EqualValues(t, 2, r.RedisAvailable("A"))

	// order.Expired, then paid while the stock is still there: re-reserved.
	o2, err := r.Orders.Create(ctx, "u2", "", testrig.Line("A", 2))
	require.NoError(t, err)
	expired, err = r.Orders.Expire(ctx, o2.ID)
	require.NoError(t, err)
	require.False(t, expired, "not past its deadline yet")
	r.Clock.Advance(16 * time.Minute)
	expired, err = r.Orders.Expire(ctx, o2.ID)
	require.NoError(t, err)
	require.True(t, expired)
	expired, err = r.Orders.Expire(ctx, o2.ID)
	require.NoError(t, err)
	require.False(t, expired, "expires once")
	require.Equal(t, arbiter.Released, r.ReservationState(o2.ID, "A"))
	require.EqualValues(t, 2, r.RedisAvailable("A"), "the expiry gave the units back")
	late, err := r.Orders.Pay(ctx, o2.ID, "pay-2")
	require.NoError(t, err)
	require.Equal(t, order.Paid, late.Status)
	require.Equal(t, o2.ID+".late", late.ReservationToken)
	stored, err := r.Orders.Get(ctx, o2.ID)
	require.NoError(t, err)
	require.Equal(t, order.Paid, stored.Status)
	require.Equal(t, o2.ID+".late", stored.ReservationToken)
	require.Equal(t, arbiter.Committed, r.ReservationState(o2.ID+".late", "A"))
	require.Equal(t, arbiter.Released, r.ReservationState(o2.ID, "A"), "the expired reservation stays released")
	require.EqualValues(t, 5, r.SKU("A").Reserved)
	require.Zero(t, r.RedisAvailable("A"), "Redis follows the re-reservation")
	again, err := r.Orders.Pay(ctx, o2.ID, "pay-2")
	require.NoError(t, err)
	require.Equal(t, order.Paid, again.Status, "replayed callback")
	require.Equal(t, o2.ID+".late", again.ReservationToken)
	_, err = r.Orders.Pay(ctx, o2.ID, "pay-other")
	require.ErrorIs(t, err, inventory.ErrConflict)
	require.EqualValues(t, 1, r.Count(`SELECT COUNT(*) FROM stock_reservations WHERE token = ?`, o2.ID+".late"), "re-reserved once")
	_, err = r.Orders.Create(ctx, "u9", "", testrig.Line("A", 1))
	require.ErrorIs(t, err, inventory.ErrInsufficientStock)

	// order.Expired, and the stock went to someone else: the payment must be refunded.
	o3, err := r.Orders.Create(ctx, "u3", "", testrig.Line("B", 2))
	require.NoError(t, err)
	r.Clock.Advance(16 * time.Minute)
	expired, err = r.Orders.Expire(ctx, o3.ID)
	require.NoError(t, err)
	require.True(t, expired)
	o4, err := r.Orders.Create(ctx, "u4", "", testrig.Line("B", 2)) // takes what o3 gave back
	require.NoError(t, err)
	refund, err := r.Orders.Pay(ctx, o3.ID, "pay-3")
	require.NoError(t, err)
	require.Equal(t, order.RefundRequired, refund.Status, "the stock is gone: the payment must be refunded")
	require.Equal(t, "pay-3", *refund.PaymentID)
	again, err = r.Orders.Pay(ctx, o3.ID, "pay-3")
	require.NoError(t, err)
	require.Equal(t, order.RefundRequired, again.Status, "replayed callback")
	require.Zero(t, r.Count(`SELECT COUNT(*) FROM stock_reservations WHERE token = ?`, o3.ID+".late"), "the refused re-reservation left nothing")
	require.EqualValues(t, 2, r.SKU("B").Reserved, "only o4 holds B")
	require.Equal(t, arbiter.Held, r.ReservationState(o4.ID, "B"))
	refunded, err := r.Orders.Refund(ctx, o3.ID)
	require.NoError(t, err)
	require.Equal(t, order.Refunded, refunded.Status)

	// order.Cancelled by the buyer, then paid: refunded, never re-reserved.
	o5, err := r.Orders.Create(ctx, "u5", "", testrig.Line("C", 1))
	require.NoError(t, err)
	_, err = r.Orders.Cancel(ctx, o5.ID)
	require.NoError(t, err)
	refund, err = r.Orders.Pay(ctx, o5.ID, "pay-5")
	require.NoError(t, err)
	require.Equal(t, order.RefundRequired, refund.Status)
	require.Zero(t, r.SKU("C").Reserved)
	require.EqualValues(t, 3, r.RedisAvailable("C"))
	require.Zero(t, r.Count(`SELECT COUNT(*) FROM stock_reservations WHERE token = ?`, o5.ID+".late"))
	refunded, err = r.Orders.Refund(ctx, o5.ID)
	require.NoError(t, err)
	require.Equal(t, order.Refunded, refunded.Status)

	require.Equal(t, []arbiter.StockMessage{{Token: o.ID, SKU: "A", Op: arbiter.OpDeduct, Qty: 3}, {Token: o2.ID + ".late", SKU: "A", Op: arbiter.OpDeduct, Qty: 2}},
		r.Outbox(), "only the paid orders deduct (the late one under its late token); a REFUND_REQUIRED refund restores nothing")

	// The late reservation is sold like any other, and a refund of the late
	// order restores under the token its deduction carried.
	redisApplied := r.RedisApplied()
	r.StartPipeline()
	r.WaitApplied()
	require.Equal(t, arbiter.Sold, r.ReservationState(o2.ID+".late", "A"))
	r.RequireQty("A", 0, 0)
	_, err = r.Orders.Refund(ctx, o2.ID)
	require.NoError(t, err)
	r.WaitApplied()
	redisApplied(1)
	require.Zero(t, r.Count(`SELECT COUNT(*) FROM stock_anomalies`))
	r.RequireQty("A", 2, 0)
	require.EqualValues(t, 2, r.RedisAvailable("A"))
	for _, sku := range []string{"A", "B", "C"} {
		r.CheckInvariant(sku)
	}
}

// endToEnd: many buyers order, most pay (some callbacks delivered three times
// at once), some cancel; the pipeline applies the payments to the database.
func endToEnd(t *testing.T, tr testrig.Transport) {
	r := testrig.New(t, tr)
	ctx := context.Background()
	const initial = 300
	r.AddSKU("HOT", initial)
	stop := r.StartPipeline()
	defer stop()

	var mu sync.Mutex
	paid := map[string]int64{}
	var wg sync.WaitGroup
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for a := 0; a < 12; a++ {
				o, err := r.Orders.Create(ctx, fmt.Sprintf("u%d", w), fmt.Sprintf("k%d", a), testrig.Line("HOT", 1+rand.Int64N(3)))
				if errors.Is(err, inventory.ErrInsufficientStock) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				if rand.IntN(5) == 0 {
					if _, err := r.Orders.Cancel(ctx, o.ID); err != nil {
						t.Error(err)
					}
					continue
				}
				copies := 1 + 2*rand.IntN(2) // 1 or 3 deliveries of the same callback
				var cw sync.WaitGroup
				for c := 0; c < copies; c++ {
					cw.Add(1)
					go func() {
						defer cw.Done()
						if _, err := r.Orders.Pay(ctx, o.ID, "pay-"+o.ID); err != nil {
							t.Error(err)
						}
					}()
				}
				cw.Wait()
				mu.Lock()
				paid[o.ID] = o.Items[0].Qty
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	r.WaitApplied()

	var sold int64
	for _, q := range paid {
		sold += q
	}
	require.Greater(t, sold, int64(0))
	r.RequireQty("HOT", initial-sold, 0) // on_hand = initial - paid; nothing left reserved
	var ledger []arbiter.LedgerRow
	require.NoError(t, r.DB.Find(&ledger).Error)
	got := map[string]int64{}
	for _, l := range ledger {
		require.Equal(t, arbiter.OpDeduct, l.Op)
		_, dup := got[l.Token]
		require.False(t, dup, "one ledger row per paid line")
		got[l.Token] = l.Qty
	}
	require.Equal(t, paid, got, "every paid line, exactly once, under its order's token")
	require.Zero(t, r.Count(`SELECT COUNT(*) FROM stock_anomalies`))
	require.EqualValues(t, len(paid), r.Count(`SELECT COUNT(*) FROM stock_reservations WHERE state = 'SOLD'`))
	require.Zero(t, r.Count(`SELECT COUNT(*) FROM stock_reservations WHERE state IN ('HELD', 'COMMITTED')`))
	r.CheckInvariant("HOT")
	t.Logf("end to end: %d paid orders, %d units sold, %d duplicate deliveries absorbed",
		len(paid), sold, r.Applier.Duplicate.Load())
}

func TestEndToEndMemory(t *testing.T) { endToEnd(t, testrig.MemoryTransport(t)) }

// Redis loses its keys with orders pending and payments unapplied: the cold
// init reads on_hand - reserved from the SKU's row, and both kinds of order
// are in reserved, so it gives exactly the units nobody holds. Nothing is
// created and nothing lost, and the later deduction leaves Redis alone.
func TestKeyLossWithPendingAndUnapplied(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	r.AddSKU("A", 10)
	pending, err := r.Orders.Create(ctx, "u1", "", testrig.Line("A", 2))
	require.NoError(t, err)
	p, err := r.Orders.Create(ctx, "u2", "", testrig.Line("A", 3))
	require.NoError(t, err)
	_, err = r.Orders.Pay(ctx, p.ID, "pay-1") // not applied: no relay
	require.NoError(t, err)
	r.RequireQty("A", 10, 5)
	require.NoError(t, r.RDB.FlushDB(ctx).Err()) // this package's Redis database loses every key
	lv, err := r.Stock.Levels(ctx, "A")
	require.NoError(t, err)
	require.False(t, lv.Initialised)

	_, err = r.Orders.Create(ctx, "u3", "", testrig.Line("A", 6))
	require.ErrorIs(t, err, inventory.ErrInsufficientStock, "Redis refuses: the cold init gave 10 - 3 paid-unapplied - 2 held")
	lv, err = r.Stock.Levels(ctx, "A")
	require.NoError(t, err)
	rec := r.SKU("A")
	require.Equal(t, stock.Levels{Initialised: true, Available: 5, Epoch: rec.RedisEpoch, Seq: rec.Seq, BuyersEpoch: rec.RedisEpoch}, lv,
		"initialised from the row: its available, seq and the epoch it recorded")
	require.NotZero(t, lv.Epoch)
	require.EqualValues(t, 2, r.Count(`SELECT COUNT(*) FROM orders`))
	r.CheckInvariant("A")

	last, err := r.Orders.Create(ctx, "u4", "", testrig.Line("A", 5))
	require.NoError(t, err, "exactly the units nobody holds can be taken")
	require.Zero(t, r.RedisAvailable("A"))
	r.RequireQty("A", 10, 10)
	c, err := r.Orders.Cancel(ctx, pending.ID)
	require.NoError(t, err)
	require.Equal(t, order.Cancelled, c.Status)
	require.EqualValues(t, 2, r.RedisAvailable("A"))
	r.StartPipeline()
	r.WaitApplied()
	r.RequireQty("A", 7, 5) // p sold; last still held
	require.EqualValues(t, 2, r.RedisAvailable("A"), "the deduction moved on_hand and reserved, not available")
	r.CheckInvariant("A")

	// Lost again after the deduction: the init still matches.
	require.NoError(t, r.RDB.FlushDB(ctx).Err())
	require.EqualValues(t, 2, r.RedisAvailable("A"))
	_, err = r.Orders.Cancel(ctx, last.ID)
	require.NoError(t, err)
	require.EqualValues(t, 7, r.RedisAvailable("A"))
	r.RequireQty("A", 7, 0)
	r.CheckInvariant("A")
}

// Redis is wrong upwards (it came back from an old snapshot, a replica lost
// writes): it admits what the database does not have. The database refuses
// the reservation, the buyer gets insufficient stock, nothing is written, and
// Redis is realigned from the database; concurrent checkouts cannot oversell.
func TestDatabaseRefusesWhatRedisOverAdmits(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	r.AddSKU("A", 5)
	first, err := r.Orders.Create(ctx, "u1", "", testrig.Line("A", 3))
	require.NoError(t, err)
	inflate := func(n int64) {
		lv, err := r.Stock.Levels(ctx, "A")
		require.NoError(t, err)
		// A change the init never saw (a seq beyond the database's): Redis gains n.
		require.NoError(t, r.Stock.Apply(ctx, inventory.Change{SKU: "A", Delta: n, Seq: lv.Seq + 1_000_000}))
	}
	inflate(10)
	require.EqualValues(t, 12, r.RedisAvailable("A"))

	_, err = r.Orders.Create(ctx, "u2", "", testrig.Line("A", 4))
	require.ErrorIs(t, err, inventory.ErrInsufficientStock, "Redis admitted, the database refused")
	require.EqualValues(t, 1, r.Count(`SELECT COUNT(*) FROM orders`))
	require.EqualValues(t, 1, r.Count(`SELECT COUNT(*) FROM stock_reservations`))
	r.RequireQty("A", 5, 3)
	require.EqualValues(t, 2, r.RedisAvailable("A"), "realigned from the database")
	r.CheckInvariant("A")

	inflate(20)
	var wg sync.WaitGroup
	var won, refused atomic.Int64
	for i := 0; i < 12; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := r.Orders.Create(ctx, fmt.Sprintf("b%d", i), "", testrig.Line("A", 1))
			switch {
			case err == nil:
				won.Add(1)
			case errors.Is(err, inventory.ErrInsufficientStock):
				refused.Add(1)
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	require.EqualValues(t, 2, won.Load(), "exactly the units the database had")
	require.EqualValues(t, 10, refused.Load())
	require.EqualValues(t, 3, r.Count(`SELECT COUNT(*) FROM orders`))
	r.RequireQty("A", 5, 5)
	require.Zero(t, r.RedisAvailable("A"))
	r.CheckInvariant("A")
	_, err = r.Orders.Cancel(ctx, first.ID)
	require.NoError(t, err)
	require.EqualValues(t, 3, r.RedisAvailable("A"))
	r.CheckInvariant("A")
}

// An order's Idempotency-Key is looked up in the database before Redis is
// asked, so a retry after Redis lost every key, with the SKU sold out
// meanwhile, still gets the first order (and another cart under the key is
// still a conflict); nothing is taken again.
func TestIdempotentRetryAfterRedisForgot(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	r.AddSKU("IK", 3)
	first, err := r.Orders.Create(ctx, "u1", "key-1", testrig.Line("IK", 2))
	require.NoError(t, err)
	_, err = r.Orders.Create(ctx, "u2", "", testrig.Line("IK", 1))
	require.NoError(t, err)
	require.NoError(t, r.RDB.FlushDB(ctx).Err())
	for range 3 {
		again, err := r.Orders.Create(ctx, "u1", "key-1", testrig.Line("IK", 2))
		require.NoError(t, err)
		require.Equal(t, first.ID, again.ID)
		require.Equal(t, first.Items, again.Items)
		_, err = r.Orders.Create(ctx, "u1", "key-1", testrig.Line("IK", 1))
		require.ErrorIs(t, err, inventory.ErrConflict)
	}
	_, err = r.Orders.Create(ctx, "u1", "key-2", testrig.Line("IK", 1))
	require.ErrorIs(t, err, inventory.ErrInsufficientStock)
	r.RequireQty("IK", 3, 3)
	require.EqualValues(t, 2, r.Count(`SELECT COUNT(*) FROM orders`))
	require.EqualValues(t, 0, r.RedisAvailable("IK"))
	r.CheckInvariant("IK")
}
