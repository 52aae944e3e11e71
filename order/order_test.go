package order

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
	"gorm.io/gorm"

	"github.com/acme/inventory/mq"
	"github.com/acme/inventory/stock"
)

// countStatements counts every statement GORM sends while fn runs.
func countStatements(t *testing.T, db *gorm.DB, fn func()) int64 {
	t.Helper()
	var n atomic.Int64
	name := fmt.Sprintf("count:%s", t.Name())
	count := func(*gorm.DB) { n.Add(1) }
	cb := db.Callback()
	require.NoError(t, cb.Query().Before("gorm:query").Register(name, count))
	require.NoError(t, cb.Create().Before("gorm:create").Register(name, count))
	require.NoError(t, cb.Update().Before("gorm:update").Register(name, count))
	require.NoError(t, cb.Raw().Before("gorm:raw").Register(name, count))
	require.NoError(t, cb.Row().Before("gorm:row").Register(name, count))
	defer func() {
		_ = cb.Query().Remove(name)
		_ = cb.Create().Remove(name)
		_ = cb.Update().Remove(name)
		_ = cb.Raw().Remove(name)
		_ = cb.Row().Remove(name)
	}()
	fn()
	return n.Load()
}

func TestCreateReservesFirst(t *testing.T) {
	r := newRig(t, memoryTransport(t))
	ctx := context.Background()
	r.addSKU("HOT", 3)

	o, err := r.svc.Create(ctx, "u1", "", line("HOT", 3))
	require.NoError(t, err)
	require.Equal(t, Pending, o.Status)
	require.Equal(t, r.clock.Now().Add(15*time.Minute).UTC().Truncate(time.Microsecond), o.ExpiresAt)
	stored, err := r.svc.Get(ctx, o.ID)
	require.NoError(t, err)
	require.Equal(t, []Item{{OrderID: o.ID, SKU: "HOT", Qty: 3}}, stored.Items)

	// Sold out: a burst of buyers never reaches the database.
	n := countStatements(t, r.db, func() {
		var wg sync.WaitGroup
		for i := 0; i < 50; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := r.svc.Create(ctx, fmt.Sprintf("u%d", i), "", line("HOT", 1))
				if !errors.Is(err, stock.ErrInsufficientStock) {
					t.Errorf("want insufficient stock, got %v", err)
				}
			}()
		}
		wg.Wait()
	})
	require.Zero(t, n, "no statement reached the database")
	require.EqualValues(t, 1, r.count(`SELECT COUNT(*) FROM orders`))

	_, err = r.svc.Create(ctx, "u1", "", line("NOPE", 1))
	require.ErrorIs(t, err, stock.ErrUnknownSKU)
	for _, bad := range [][]stock.Line{nil, line("HOT", 0), line("HOT", -2), line("HO T", 1), line("HOT", stock.DefaultMaxQty+1)} {
		_, err = r.svc.Create(ctx, "u1", "", bad)
		require.ErrorIs(t, err, stock.ErrInvalidArgument)
	}
	_, err = r.svc.Create(ctx, "bad user", "", line("HOT", 1))
	require.ErrorIs(t, err, stock.ErrInvalidArgument)
	require.EqualValues(t, 1, r.count(`SELECT COUNT(*) FROM orders`), "bad input wrote nothing")
	r.checkInvariant("HOT")
}

func TestIdempotentCreate(t *testing.T) {
	r := newRig(t, memoryTransport(t))
	ctx := context.Background()
	r.addSKU("A", 100)
	r.addSKU("B", 100)
	cart := []stock.Line{{SKU: "B", Qty: 1}, {SKU: "A", Qty: 2}}

	var wg sync.WaitGroup
	ids := make([]string, 16)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o, err := r.svc.Create(ctx, "u1", "key-1", cart)
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
	require.EqualValues(t, 1, r.count(`SELECT COUNT(*) FROM orders`))
	lv, err := r.st.Levels(ctx, "A")
	require.NoError(t, err)
	require.Equal(t, stock.Levels{Initialised: true, Available: 98, Held: 2}, lv, "reserved once")

	_, err = r.svc.Create(ctx, "u1", "key-1", line("A", 5))
	require.ErrorIs(t, err, ErrConflict, "same key, different order")
	o2, err := r.svc.Create(ctx, "u2", "key-1", cart)
	require.NoError(t, err, "keys are per user")
	require.NotEqual(t, ids[0], o2.ID)
	r.checkInvariant("A")
	r.checkInvariant("B")
}

func TestPayCancelRefund(t *testing.T) {
	r := newRig(t, memoryTransport(t))
	ctx := context.Background()
	r.addSKU("A", 10)
	stop := r.startPipeline()
	defer stop()

	o, err := r.svc.Create(ctx, "u1", "", line("A", 4))
	require.NoError(t, err)
	for i := 0; i < 3; i++ { // the provider delivers the callback three times
		paid, err := r.svc.Pay(ctx, o.ID, "pay-1")
		require.NoError(t, err)
		require.Equal(t, Paid, paid.Status)
		require.Equal(t, "pay-1", *paid.PaymentID)
	}
	_, err = r.svc.Pay(ctx, o.ID, "pay-2")
	require.ErrorIs(t, err, ErrConflict, "a second payment for a paid order")
	_, err = r.svc.Cancel(ctx, o.ID)
	require.ErrorIs(t, err, ErrConflict, "a paid order cannot be cancelled")
	require.EqualValues(t, 1, r.count(`SELECT COUNT(*) FROM stock_outbox`))

	r.waitApplied()
	require.EqualValues(t, 6, r.dbStock("A"))
	r.checkInvariant("A")

	refunded, err := r.svc.Refund(ctx, o.ID)
	require.NoError(t, err)
	require.Equal(t, Refunded, refunded.Status)
	_, err = r.svc.Refund(ctx, o.ID)
	require.ErrorIs(t, err, ErrConflict)
	r.waitApplied()
	require.EqualValues(t, 10, r.dbStock("A"))
	lv, err := r.st.Levels(ctx, "A")
	require.NoError(t, err)
	require.EqualValues(t, 10, lv.Available, "refund gave the units back in Redis")
	r.checkInvariant("A")

	c, err := r.svc.Create(ctx, "u1", "", line("A", 2))
	require.NoError(t, err)
	cancelled, err := r.svc.Cancel(ctx, c.ID)
	require.NoError(t, err)
	require.Equal(t, Cancelled, cancelled.Status)
	_, err = r.svc.Cancel(ctx, c.ID)
	require.ErrorIs(t, err, ErrConflict)
	_, err = r.svc.Refund(ctx, c.ID)
	require.ErrorIs(t, err, ErrConflict, "only paid orders are refunded")
	_, err = r.svc.Pay(ctx, "nope", "pay-9")
	require.ErrorIs(t, err, ErrNotFound)
	r.checkInvariant("A")
}

// Two nodes race a cancel and a payment on every order: each order has exactly
// one winner and the stock follows the winner.
func TestCancelPayRaceOneWinner(t *testing.T) {
	r := newRig(t, memoryTransport(t))
	ctx := context.Background()
	r.addSKU("A", 100)
	stop := r.startPipeline()
	defer stop()

	const orders = 40
	ids := make([]string, orders)
	for i := range ids {
		o, err := r.svc.Create(ctx, fmt.Sprintf("u%d", i), "", line("A", 2))
		require.NoError(t, err)
		ids[i] = o.ID
	}
	var paidWins, cancelWins atomic.Int64
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(2)
		go func() {
			defer wg.Done()
			if _, err := r.svc.Pay(ctx, id, fmt.Sprintf("pay-%d", i)); err == nil {
				paidWins.Add(1)
			} else if !errors.Is(err, ErrConflict) {
				t.Error(err)
			}
		}()
		go func() {
			defer wg.Done()
			if _, err := r.svc.Cancel(ctx, id); err == nil {
				cancelWins.Add(1)
			} else if !errors.Is(err, ErrConflict) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	// A payment that lost to a cancel pays late: it re-reserves (stock is
	// there) and wins after all, so count final states, not call results.
	paid := r.count(`SELECT COUNT(*) FROM orders WHERE status = 'PAID'`)
	cancelled := r.count(`SELECT COUNT(*) FROM orders WHERE status = 'CANCELLED'`)
	require.EqualValues(t, orders, paid+cancelled)
	require.EqualValues(t, paidWins.Load(), paid, "every successful payment left a paid order")
	r.waitApplied()
	require.EqualValues(t, 100-2*paid, r.dbStock("A"))
	require.EqualValues(t, paid, r.count(`SELECT COUNT(*) FROM stock_ledger`), "one ledger row per paid line")
	r.checkInvariant("A")
}

func TestLatePayment(t *testing.T) {
	r := newRig(t, memoryTransport(t))
	ctx := context.Background()
	r.addSKU("A", 5)

	o, err := r.svc.Create(ctx, "u1", "", line("A", 3))
	require.NoError(t, err)
	r.clock.Advance(16 * time.Minute)
	paid, err := r.svc.Pay(ctx, o.ID, "pay-late")
	require.NoError(t, err, "stock is still there: the late payment re-reserves it")
	require.Equal(t, Paid, paid.Status)
	require.Equal(t, o.ID+".late", paid.ReservationToken)
	lv, err := r.st.Levels(ctx, "A")
	require.NoError(t, err)
	require.Equal(t, stock.Levels{Initialised: true, Available: 2}, lv)

	o2, err := r.svc.Create(ctx, "u2", "", line("A", 2))
	require.NoError(t, err)
	expired, err := r.svc.Expire(ctx, o2.ID)
	require.NoError(t, err)
	require.False(t, expired, "not past its deadline yet")
	r.clock.Advance(16 * time.Minute)
	expired, err = r.svc.Expire(ctx, o2.ID)
	require.NoError(t, err)
	require.True(t, expired)
	expired, err = r.svc.Expire(ctx, o2.ID)
	require.NoError(t, err)
	require.False(t, expired, "expires once")
	_, err = r.svc.Create(ctx, "u3", "", line("A", 2)) // takes what o2 gave back
	require.NoError(t, err)
	late, err := r.svc.Pay(ctx, o2.ID, "pay-late-2")
	require.NoError(t, err)
	require.Equal(t, RefundRequired, late.Status, "the stock is gone: the payment must be refunded")
	again, err := r.svc.Pay(ctx, o2.ID, "pay-late-2")
	require.NoError(t, err)
	require.Equal(t, RefundRequired, again.Status, "replayed callback")
	refunded, err := r.svc.Refund(ctx, o2.ID)
	require.NoError(t, err)
	require.Equal(t, Refunded, refunded.Status)
	require.EqualValues(t, 1, r.count(`SELECT COUNT(*) FROM stock_outbox`), "only the paid order deducts")
	r.checkInvariant("A")
}

// endToEnd: many buyers order, most pay (some callbacks delivered three times
// at once), some cancel; the pipeline applies the payments to the database.
func endToEnd(t *testing.T, tr transport) {
	r := newRig(t, tr)
	ctx := context.Background()
	const initial = 300
	r.addSKU("HOT", initial)
	stop := r.startPipeline()
	defer stop()

	var mu sync.Mutex
	paid := map[string]int64{}
	var wg sync.WaitGroup
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for a := 0; a < 12; a++ {
				o, err := r.svc.Create(ctx, fmt.Sprintf("u%d", w), fmt.Sprintf("k%d", a), line("HOT", 1+rand.Int64N(3)))
				if errors.Is(err, stock.ErrInsufficientStock) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				if rand.IntN(5) == 0 {
					if _, err := r.svc.Cancel(ctx, o.ID); err != nil {
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
						if _, err := r.svc.Pay(ctx, o.ID, "pay-"+o.ID); err != nil {
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
	r.waitApplied()

	var sold int64
	for _, q := range paid {
		sold += q
	}
	require.Greater(t, sold, int64(0))
	require.EqualValues(t, initial-sold, r.dbStock("HOT"), "database stock = initial - paid")
	var ledger []LedgerRow
	require.NoError(t, r.db.Find(&ledger).Error)
	got := map[string]int64{}
	for _, l := range ledger {
		require.Equal(t, OpDeduct, l.Op)
		_, dup := got[l.OrderID]
		require.False(t, dup, "one ledger row per paid line")
		got[l.OrderID] = l.Qty
	}
	require.Equal(t, paid, got, "every paid line, exactly once")
	require.Zero(t, r.count(`SELECT COUNT(*) FROM stock_anomalies`))
	r.checkInvariant("HOT")
	t.Logf("end to end: %d paid orders, %d units sold, %d duplicate deliveries absorbed",
		len(paid), sold, r.applier.Duplicate.Load())
}

func TestEndToEndMemory(t *testing.T) { endToEnd(t, memoryTransport(t)) }

// The same operation published again (a redelivery, a duplicate send) changes
// nothing; consecutive operations of a SKU are merged into one UPDATE.
func TestApplyExactlyOnce(t *testing.T) {
	r := newRig(t, memoryTransport(t))
	ctx := context.Background()
	r.addSKU("A", 10)
	r.addSKU("B", 10)
	msg := func(order, sku string, op Op, q int64) mq.Message {
		return mq.Message{Key: sku, Body: []byte(fmt.Sprintf(`{"order_id":%q,"sku":%q,"op":%q,"qty":%d}`, order, sku, op, q))}
	}
	batch := []mq.Message{msg("o1", "A", OpDeduct, 2), msg("o2", "A", OpDeduct, 3), msg("o1", "A", OpDeduct, 2), msg("o3", "B", OpDeduct, 1)}
	var updates int64
	require.NoError(t, r.db.Callback().Raw().Before("gorm:raw").Register("count-updates", func(db *gorm.DB) {
		if len(db.Statement.SQL.String()) >= 6 && db.Statement.SQL.String()[:6] == "UPDATE" {
			updates++
		}
	}))
	require.NoError(t, r.applier.Handle(ctx, batch))
	require.NoError(t, r.db.Callback().Raw().Remove("count-updates"))
	require.EqualValues(t, 2, updates, "one UPDATE per SKU for the whole delivery")
	require.NoError(t, r.applier.Handle(ctx, batch))
	require.EqualValues(t, 5, r.dbStock("A"))
	require.EqualValues(t, 9, r.dbStock("B"))
	require.EqualValues(t, 3, r.count(`SELECT COUNT(*) FROM stock_ledger`))
	require.EqualValues(t, 3, r.applier.Applied.Load())
	require.EqualValues(t, 5, r.applier.Duplicate.Load(), "one in-batch duplicate, then the whole batch again")

	// A deduction the database cannot cover is recorded, and the queue moves on.
	require.NoError(t, r.applier.Handle(ctx, []mq.Message{msg("o4", "A", OpDeduct, 9), msg("o5", "A", OpDeduct, 5), msg("o6", "A", OpRestore, 1)}))
	require.EqualValues(t, 1, r.dbStock("A"), "o5 applied, o4 refused, o6 restored")
	var an AnomalyRow
	require.NoError(t, r.db.Take(&an).Error)
	require.Equal(t, AnomalyRow{ID: an.ID, OrderID: "o4", SKU: "A", Op: OpDeduct, Qty: 9, DBStock: 5,
		Reason: "deduction would take database stock below zero"}, an)
	require.NoError(t, r.applier.Handle(ctx, []mq.Message{msg("o4", "A", OpDeduct, 9)}))
	require.EqualValues(t, 1, r.count(`SELECT COUNT(*) FROM stock_anomalies`), "an anomaly is recorded once")

	require.NoError(t, r.applier.Handle(ctx, []mq.Message{{Key: "A", Body: []byte("not json")}, msg("o7", "A", OpDeduct, 1)}))
	require.EqualValues(t, 1, r.applier.Malformed.Load())
	require.EqualValues(t, 0, r.dbStock("A"), "a malformed message does not block the queue")
}

// The process dies after the payment committed and before anything was sent:
// the outbox row waits, and the next relay sends it; it is applied once.
func TestCrashBetweenCommitAndSend(t *testing.T) {
	r := newRig(t, memoryTransport(t))
	ctx := context.Background()
	r.addSKU("A", 10)
	o, err := r.svc.Create(ctx, "u1", "", line("A", 3))
	require.NoError(t, err)
	_, err = r.svc.Pay(ctx, o.ID, "pay-1") // no relay runs: "crashed"
	require.NoError(t, err)
	require.EqualValues(t, 10, r.dbStock("A"))
	r.checkInvariant("A") // paid-unapplied is counted

	r.startPipeline() // the restarted node
	r.waitApplied()
	require.EqualValues(t, 7, r.dbStock("A"))
	r.checkInvariant("A")
}

// The relay dies after sending and before marking the rows sent: the next
// relay sends them again, and the ledger absorbs the duplicates.
func TestCrashBetweenSendAndMark(t *testing.T) {
	r := newRig(t, memoryTransport(t))
	ctx := context.Background()
	r.addSKU("A", 20)
	for i := 0; i < 4; i++ {
		o, err := r.svc.Create(ctx, fmt.Sprintf("u%d", i), "", line("A", 2))
		require.NoError(t, err)
		_, err = r.svc.Pay(ctx, o.ID, fmt.Sprintf("pay-%d", i))
		require.NoError(t, err)
	}
	crashing := NewRelay(r.db, r.tr.producer, r.st.Locker(), RelayConfig{afterSend: func(row OutboxRow) error {
		return errors.New("killed")
	}})
	n, err := crashing.RelayOnce(ctx)
	require.Error(t, err)
	require.Zero(t, n)
	require.EqualValues(t, 4, r.count(`SELECT COUNT(*) FROM stock_outbox WHERE sent_at IS NULL`), "nothing marked sent")

	r.startPipeline()
	r.waitApplied()
	// The crashed send already carried all four rows, so the ledger may be
	// complete before the new relay's resend arrives; wait for it to be absorbed.
	require.Eventually(t, func() bool { return r.applier.Duplicate.Load() == 4 }, 30*time.Second, 10*time.Millisecond,
		"the first send (all four rows of A) was delivered twice and applied once")
	require.EqualValues(t, 0, r.count(`SELECT COUNT(*) FROM stock_outbox WHERE sent_at IS NULL`))
	require.EqualValues(t, 12, r.dbStock("A"))
	require.EqualValues(t, 4, r.count(`SELECT COUNT(*) FROM stock_ledger`))
	r.checkInvariant("A")
}

// The consumer dies in the middle of a delivery (after its UPDATEs, before the
// commit), twice: the delivery comes back and is applied once.
func TestConsumerCrashMidBatch(t *testing.T) {
	r := newRig(t, memoryTransport(t))
	ctx := context.Background()
	r.addSKU("A", 50)
	var crashes atomic.Int64
	r.applier.beforeCommit = func() error {
		if crashes.Add(1) <= 2 {
			return errors.New("killed before commit")
		}
		return nil
	}
	for i := 0; i < 10; i++ {
		o, err := r.svc.Create(ctx, fmt.Sprintf("u%d", i), "", line("A", 1))
		require.NoError(t, err)
		_, err = r.svc.Pay(ctx, o.ID, fmt.Sprintf("pay-%d", i))
		require.NoError(t, err)
	}
	r.startPipeline()
	r.waitApplied()
	require.GreaterOrEqual(t, crashes.Load(), int64(3))
	require.EqualValues(t, 40, r.dbStock("A"))
	require.EqualValues(t, 10, r.count(`SELECT COUNT(*) FROM stock_ledger`))
	r.checkInvariant("A")
}

// Redis loses its keys with orders pending and payments unapplied: the cold
// init counts both, so nothing is created and nothing lost.
func TestKeyLossWithPendingAndUnapplied(t *testing.T) {
	r := newRig(t, memoryTransport(t))
	ctx := context.Background()
	r.addSKU("A", 10)
	pending, err := r.svc.Create(ctx, "u1", "", line("A", 2))
	require.NoError(t, err)
	p, err := r.svc.Create(ctx, "u2", "", line("A", 3))
	require.NoError(t, err)
	_, err = r.svc.Pay(ctx, p.ID, "pay-1") // not applied: no relay
	require.NoError(t, err)
	require.NoError(t, r.rdb.FlushDB(ctx).Err())

	n, err := r.st.Deduct(ctx, "A", 2, pending.ID)
	require.NoError(t, err, "the pending order's token is recognised after the loss")
	require.EqualValues(t, 5, n, "10 - 3 paid-unapplied - 2 held")
	_, err = r.svc.Create(ctx, "u3", "", line("A", 6))
	require.ErrorIs(t, err, stock.ErrInsufficientStock)
	r.checkInvariant("A")
	c, err := r.svc.Cancel(ctx, pending.ID)
	require.NoError(t, err)
	require.Equal(t, Cancelled, c.Status)
	lv, err := r.st.Levels(ctx, "A")
	require.NoError(t, err)
	require.EqualValues(t, 7, lv.Available)
	r.startPipeline()
	r.waitApplied()
	require.EqualValues(t, 7, r.dbStock("A"))
	r.checkInvariant("A")
}
