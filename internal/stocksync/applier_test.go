package stocksync_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/mq"
	"github.com/acme/inventory/testkit/testrig"
)

// The same operation published again (a redelivery, a duplicate send) changes
// nothing; consecutive operations of a SKU are merged into one UPDATE. A
// DEDUCT needs a COMMITTED reservation of its quantity, a RESTORE its applied
// DEDUCT; anything else is recorded as an anomaly and the queue moves on.
func TestApplyExactlyOnce(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	r.AddSKU("A", 10)
	r.AddSKU("B", 10)
	users := 0
	create := func(sku string, q int64) string {
		users++
		o, err := r.Orders.Create(ctx, fmt.Sprintf("u%d", users), "", testrig.Line(sku, q))
		require.NoError(t, err)
		return o.ID
	}
	pay := func(sku string, q int64) string {
		id := create(sku, q)
		_, err := r.Orders.Pay(ctx, id, "pay-"+id) // no relay runs: the test delivers
		require.NoError(t, err)
		return id
	}
	msg := func(token, sku string, op arbiter.Op, q int64) mq.Message {
		return mq.Message{Key: sku, Body: []byte(fmt.Sprintf(`{"token":%q,"sku":%q,"op":%q,"qty":%d}`, token, sku, op, q))}
	}
	o1, o2, o3 := pay("A", 2), pay("A", 3), pay("B", 1)
	r.RequireQty("A", 10, 5)
	r.RequireQty("B", 10, 1)

	batch := []mq.Message{msg(o1, "A", arbiter.OpDeduct, 2), msg(o2, "A", arbiter.OpDeduct, 3), msg(o1, "A", arbiter.OpDeduct, 2), msg(o3, "B", arbiter.OpDeduct, 1)}
	var skuUpdates, resUpdates int64
	require.NoError(t, r.DB.Callback().Raw().Before("gorm:raw").Register("count-updates", func(db *gorm.DB) {
		if strings.HasPrefix(strings.TrimSpace(db.Statement.SQL.String()), "UPDATE skus") {
			skuUpdates++
		}
	}))
	require.NoError(t, r.DB.Callback().Update().Before("gorm:update").Register("count-updates", func(db *gorm.DB) {
		if db.Statement.Table == "stock_reservations" {
			resUpdates++
		}
	}))
	require.NoError(t, r.Applier.Handle(ctx, batch))
	require.NoError(t, r.DB.Callback().Raw().Remove("count-updates"))
	require.NoError(t, r.DB.Callback().Update().Remove("count-updates"))
	require.EqualValues(t, 2, skuUpdates, "one UPDATE of skus per SKU for the whole delivery")
	require.EqualValues(t, 2, resUpdates, "one UPDATE of the reservations per SKU")
	require.NoError(t, r.Applier.Handle(ctx, batch))
	r.RequireQty("A", 5, 0)
	r.RequireQty("B", 9, 0)
	for _, id := range []string{o1, o2} {
		require.Equal(t, arbiter.Sold, r.ReservationState(id, "A"))
	}
	require.Equal(t, arbiter.Sold, r.ReservationState(o3, "B"))
	require.EqualValues(t, 3, r.Count(`SELECT COUNT(*) FROM stock_ledger`))
	require.EqualValues(t, 3, r.Applier.Applied.Load())
	require.EqualValues(t, 5, r.Applier.Duplicate.Load(), "one in-batch duplicate, then the whole batch again")
	require.EqualValues(t, 5, r.RedisAvailable("A"), "a deduction moves on_hand and reserved together: available stays")
	r.CheckInvariant("A")
	r.CheckInvariant("B")

	// A deduction without a committed reservation (unknown, or only held) and
	// a restore without its deduction are recorded, not applied; a restore
	// after its deduction gives the units back, to the database and Redis.
	o7 := create("A", 1) // held, not paid
	require.NoError(t, r.Applier.Handle(ctx, []mq.Message{msg("o4", "A", arbiter.OpDeduct, 9), msg(o7, "A", arbiter.OpDeduct, 1),
		msg("o6", "A", arbiter.OpRestore, 1), msg(o1, "A", arbiter.OpRestore, 2)}))
	r.RequireQty("A", 7, 1)
	require.Equal(t, arbiter.Held, r.ReservationState(o7, "A"), "an unpaid reservation is not sold")
	require.EqualValues(t, 6, r.RedisAvailable("A"), "the restore reached Redis")
	var an []arbiter.AnomalyRow
	require.NoError(t, r.DB.Order("id").Find(&an).Error)
	require.Len(t, an, 3)
	const noCommitted = "no committed reservation of this quantity"
	require.Equal(t, []arbiter.AnomalyRow{
		{ID: an[0].ID, Token: "o4", SKU: "A", Op: arbiter.OpDeduct, Qty: 9, OnHand: 5, Reason: noCommitted},
		{ID: an[1].ID, Token: o7, SKU: "A", Op: arbiter.OpDeduct, Qty: 1, OnHand: 5, Reason: noCommitted},
		{ID: an[2].ID, Token: "o6", SKU: "A", Op: arbiter.OpRestore, Qty: 1, OnHand: 5, Reason: "restore without its deduction"},
	}, an)
	require.NoError(t, r.Applier.Handle(ctx, []mq.Message{msg("o4", "A", arbiter.OpDeduct, 9)}))
	require.EqualValues(t, 3, r.Count(`SELECT COUNT(*) FROM stock_anomalies`), "an anomaly is recorded once")
	require.EqualValues(t, 3, r.Applier.Anomalies.Load())
	require.EqualValues(t, 4, r.Applier.Applied.Load())

	o8 := pay("A", 1)
	require.NoError(t, r.Applier.Handle(ctx, []mq.Message{{Key: "A", Body: []byte("not json")}, msg(o8, "A", arbiter.OpDeduct, 1)}))
	require.EqualValues(t, 1, r.Applier.Malformed.Load())
	r.RequireQty("A", 6, 1) // o8 sold; o7 still held
	require.Equal(t, arbiter.Sold, r.ReservationState(o8, "A"), "a malformed message does not block the queue")
	r.CheckInvariant("A")
}

// The consumer dies in the middle of a delivery (after its UPDATEs, before the
// commit), twice: the delivery comes back and is applied once.
func TestConsumerCrashMidBatch(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	r.AddSKU("A", 50)
	var crashes atomic.Int64
	r.Applier.BeforeCommit = func() error {
		if crashes.Add(1) <= 2 {
			return errors.New("killed before commit")
		}
		return nil
	}
	for i := 0; i < 10; i++ {
		o, err := r.Orders.Create(ctx, fmt.Sprintf("u%d", i), "", testrig.Line("A", 1))
		require.NoError(t, err)
		_, err = r.Orders.Pay(ctx, o.ID, fmt.Sprintf("pay-%d", i))
		require.NoError(t, err)
	}
	r.StartPipeline()
	r.WaitApplied()
	require.GreaterOrEqual(t, crashes.Load(), int64(3))
	r.RequireQty("A", 40, 0)
	require.EqualValues(t, 10, r.Count(`SELECT COUNT(*) FROM stock_reservations WHERE state = 'SOLD'`))
	require.EqualValues(t, 10, r.Count(`SELECT COUNT(*) FROM stock_ledger`))
	r.CheckInvariant("A")
}

// A consumer stopping (its ctx cancelled) right after a delivery committed
// does not cut short the delivery's follow-up into Redis: the restore the
// database applied reaches Redis too.
func TestApplyFollowUpOutlivesShutdown(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	r.AddSKU("A", 10)
	bg := context.Background()
	o, err := r.Orders.Create(bg, "u", "", testrig.Line("A", 2))
	require.NoError(t, err)
	_, err = r.Orders.Pay(bg, o.ID, "pay-1")
	require.NoError(t, err)
	r.Deliver(arbiter.StockMessage{Token: o.ID, SKU: "A", Op: arbiter.OpDeduct, Qty: 2})
	require.EqualValues(t, 8, r.RedisAvailable("A"))

	ctx, cancel := context.WithCancel(bg)
	next := r.Applier.OnApplied
	r.Applier.OnApplied = func(ctx context.Context, chs []inventory.Change) {
		cancel() // the consumer stops between the commit and the follow-up
		next(ctx, chs)
	}
	body, err := json.Marshal(arbiter.StockMessage{Token: o.ID, SKU: "A", Op: arbiter.OpRestore, Qty: 2})
	require.NoError(t, err)
	require.NoError(t, r.Applier.Handle(ctx, []mq.Message{{Key: "A", Body: body}}))
	r.RequireQty("A", 10, 0)
	require.EqualValues(t, 10, r.RedisAvailable("A"), "the restore reached Redis")
}

// A stock message that cannot be decoded is not applied and not dropped: it
// is an anomaly row (once, however often it is redelivered), which reconcile
// reports.
func TestMalformedMessageIsRecorded(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	sku := r.PutSKU("MAL", 10, 0)
	bad := []mq.Message{
		{ID: "m1", Key: sku, Body: []byte("not json")},
		{ID: "m2", Key: sku, Body: []byte(`{"token":"x","sku":"` + sku + `","op":"STEAL","qty":1}`)},
		{ID: "m3", Key: "??", Body: []byte(`{"token":"x","sku":"no such sku!","op":"DEDUCT","qty":1}`)},
	}
	require.NoError(t, r.Applier.Handle(ctx, bad))
	require.NoError(t, r.Applier.Handle(ctx, bad[:1]), "redelivered")
	require.EqualValues(t, 3, r.Count(`SELECT COUNT(*) FROM stock_anomalies`), "one row per malformed message")
	require.EqualValues(t, 3, r.Count(`SELECT COUNT(*) FROM stock_anomalies WHERE op = 'MALFORMED' AND reason LIKE 'malformed%'`))
	r.RequireQty(sku, 10, 0)

	reports, err := r.Reconciler().Reconcile(ctx, false)
	require.NoError(t, err)
	var anomalies int64
	for _, rep := range reports {
		anomalies += rep.Anomalies
	}
	require.EqualValues(t, 3, anomalies, "reconcile reports every one: %+v", reports)
}

// TestEmbeddedContract runs the applier's and the relay's tests again on the embedded
// default's stand-ins (SQLite, miniredis, the in-process queue).
func TestEmbeddedContract(t *testing.T) {
	testrig.RunEmbedded(t,
		TestApplyExactlyOnce,
		TestConsumerCrashMidBatch,
		TestApplyFollowUpOutlivesShutdown,
		TestMalformedMessageIsRecorded,
		TestCrashBetweenCommitAndSend,
		TestCrashBetweenSendAndMark,
	)
}
