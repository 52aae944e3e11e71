package order_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/maintenance"
	"github.com/acme/inventory/internal/testrig"
)

// Names are exact, byte for byte (docs/SPEC.md section 3): a SKU code that
// differs only in letter case is another SKU (unknown here), never the same
// row in the database and another key in Redis. Before the binary collation
// one buyer under a per-user limit of 1 took a unit per spelling.
func TestNamesAreExact(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	sku := r.PutSKU("PHONE-X", 10, 1)
	spellings := []string{strings.ToLower(sku), "Phone" + strings.TrimPrefix(sku, "PHONE")}

	_, err := r.Orders.Seckill(ctx, "u", sku, 1)
	require.NoError(t, err)
	for _, v := range spellings {
		_, err := r.Orders.Seckill(ctx, "u", v, 1)
		require.ErrorIs(t, err, inventory.ErrUnknownSKU, v)
		_, err = r.Orders.Create(ctx, "u", "", testrig.Line(v, 1))
		require.ErrorIs(t, err, inventory.ErrUnknownSKU, v)
		_, err = r.Tokens.Reserve(ctx, v, 1, "tok-"+v)
		require.ErrorIs(t, err, inventory.ErrUnknownSKU, v)
		_, err = r.Catalog.Get(ctx, v)
		require.ErrorIs(t, err, inventory.ErrUnknownSKU, v)
	}
	_, err = r.Orders.Seckill(ctx, "u", sku, 1)
	require.ErrorIs(t, err, inventory.ErrConflict, "the buyer's one unit is taken")
	r.RequireQty(sku, 10, 1)
	require.EqualValues(t, 1, r.Count(`SELECT COUNT(*) FROM stock_reservations`))

	// User ids: "U" is another buyer than "u".
	_, err = r.Orders.Seckill(ctx, "U", sku, 1)
	require.NoError(t, err)
	require.EqualValues(t, 2, r.Count(`SELECT COUNT(*) FROM buyer_quotas WHERE sku = ?`, sku))

	// Tokens: "Cart-1" and "cart-1" are two reservations; committing one
	// commits only its own units.
	plain := r.PutSKU("TOK", 10, 0)
	_, err = r.Tokens.Reserve(ctx, plain, 1, "Cart-1")
	require.NoError(t, err)
	_, err = r.Tokens.Reserve(ctx, plain, 2, "cart-1")
	require.NoError(t, err, "another token, not a replay with another quantity")
	r.RequireQty(plain, 10, 3)
	q, err := r.Tokens.Commit(ctx, plain, "cart-1")
	require.NoError(t, err)
	require.EqualValues(t, 2, q)
	require.Equal(t, arbiter.Held, r.ReservationState("t.Cart-1", plain))
	q, err = r.Tokens.Release(ctx, plain, "Cart-1")
	require.NoError(t, err)
	require.EqualValues(t, 1, q)
	r.RequireQty(plain, 10, 2)

	// Idempotency keys: "K-1" and "k-1" are two orders.
	a, err := r.Orders.Create(ctx, "buyer", "K-1", testrig.Line(plain, 1))
	require.NoError(t, err)
	b, err := r.Orders.Create(ctx, "buyer", "k-1", testrig.Line(plain, 2))
	require.NoError(t, err)
	require.NotEqual(t, a.ID, b.ID)
	r.RequireQty(plain, 10, 5)

	// Order ids: another spelling of an order id is no order.
	_, err = r.Orders.Get(ctx, strings.ToUpper(a.ID))
	require.ErrorIs(t, err, inventory.ErrNotFound)
	_, err = r.Orders.Cancel(ctx, strings.ToUpper(a.ID))
	require.ErrorIs(t, err, inventory.ErrNotFound)
	r.CheckInvariant(sku)
	r.CheckInvariant(plain)
}

// A refund long after the sale (the DEDUCT's ledger row pruned by
// retention) still brings its units back on hand, once: exactly once rests
// on the reservation's state, which is never pruned.
func TestRefundAfterRetention(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	sku := r.PutSKU("OLD", 10, 0)
	o, err := r.Orders.Create(ctx, "u", "", testrig.Line(sku, 3))
	require.NoError(t, err)
	_, err = r.Orders.Pay(ctx, o.ID, "pay-old")
	require.NoError(t, err)
	r.Deliver(arbiter.StockMessage{Token: o.ID, SKU: sku, Op: arbiter.OpDeduct, Qty: 3})
	r.RequireQty(sku, 7, 0)

	later := func() time.Time { return time.Now().Add(60 * 24 * time.Hour) }
	_, err = maintenance.NewRetention(r.DB, r.Stock.Locker(), maintenance.RetentionConfig{Now: later}).PruneOnce(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 0, r.Count(`SELECT COUNT(*) FROM stock_ledger WHERE sku = ?`, sku), "the ledger row is pruned")

	_, err = r.Orders.Refund(ctx, o.ID)
	require.NoError(t, err)
	restore := arbiter.StockMessage{Token: o.ID, SKU: sku, Op: arbiter.OpRestore, Qty: 3}
	r.Deliver(restore)
	r.RequireQty(sku, 10, 0)
	require.EqualValues(t, 0, r.Count(`SELECT COUNT(*) FROM stock_anomalies WHERE sku = ?`, sku))

	// Its duplicates, before and after the restore's own ledger row is
	// pruned, change nothing and are no anomaly; nor is a late duplicate of
	// the deduction.
	r.Deliver(restore)
	_, err = maintenance.NewRetention(r.DB, r.Stock.Locker(), maintenance.RetentionConfig{Now: func() time.Time { return later().Add(60 * 24 * time.Hour) }}).PruneOnce(ctx)
	require.NoError(t, err)
	r.Deliver(restore, arbiter.StockMessage{Token: o.ID, SKU: sku, Op: arbiter.OpDeduct, Qty: 3})
	r.RequireQty(sku, 10, 0)
	require.EqualValues(t, 0, r.Count(`SELECT COUNT(*) FROM stock_anomalies WHERE sku = ?`, sku))
	require.EqualValues(t, 10, r.RedisAvailable(sku))
	r.CheckInvariant(sku)
}

// An adjust carrying a reference already applied to the SKU is answered
// without applying again (an operator's retry after a time-out); another
// delta under the same reference is a conflict. The record of applied
// references is never pruned.
func TestAdjustByReferenceOnce(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	cat := r.Catalog
	sku := r.PutSKU("PO", 110, 0)
	other := r.PutSKU("PO", 5, 0)

	v, err := cat.Adjust(ctx, sku, 10, "restock", "po-99")
	require.NoError(t, err)
	require.EqualValues(t, 120, v.OnHand)
	v, err = cat.Adjust(ctx, sku, 10, "restock", "po-99")
	require.NoError(t, err, "a retry is answered")
	require.EqualValues(t, 120, v.OnHand, "and applied once")
	_, err = cat.Adjust(ctx, sku, 7, "restock", "po-99")
	require.ErrorIs(t, err, inventory.ErrConflict, "another delta under the same reference")
	_, err = cat.Adjust(ctx, sku, 10, "restock", "PO-99")
	require.NoError(t, err, "references are exact: another reference")
	_, err = cat.Adjust(ctx, other, 10, "restock", "po-99")
	require.NoError(t, err, "a reference is per SKU: a purchase order restocks many")
	r.RequireQty(sku, 130, 0)
	r.RequireQty(other, 15, 0)

	_, err = maintenance.NewRetention(r.DB, r.Stock.Locker(), maintenance.RetentionConfig{
		Now: func() time.Time { return time.Now().Add(365 * 24 * time.Hour) }}).PruneOnce(ctx)
	require.NoError(t, err)
	_, err = cat.Adjust(ctx, sku, 10, "restock", "po-99")
	require.NoError(t, err)
	_, err = cat.Adjust(ctx, sku, -3, "damaged", "po-99")
	require.ErrorIs(t, err, inventory.ErrConflict)
	r.RequireQty(sku, 130, 0)

	// Without a reference every adjust applies.
	_, err = cat.Adjust(ctx, other, 1, "found", "")
	require.NoError(t, err)
	_, err = cat.Adjust(ctx, other, 1, "found", "")
	require.NoError(t, err)
	r.RequireQty(other, 17, 0)
	require.Equal(t, [2]int64{130, 0}, r.MovementSums(sku), "one RESTOCK movement per applied reference")
	r.CheckInvariant(sku)
}

// Operators writing one SKU under the version they read (If-Match): of many
// racing under one version exactly one wins, the others fail their
// precondition and change nothing; reservations never move the version.
func TestSKUWritesUnderAVersionOneWinner(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	cat := r.Catalog
	sku := r.PutSKU("VER", 100, 0)
	v, err := cat.Get(ctx, sku)
	require.NoError(t, err)
	require.Equal(t, "100.0", v.Version)
	_, err = r.Orders.Create(ctx, "u", "", testrig.Line(sku, 3))
	require.NoError(t, err)
	v2, err := cat.Get(ctx, sku)
	require.NoError(t, err)
	require.Equal(t, v.Version, v2.Version, "a reservation does not move the version")

	var wins, lost atomic.Int64
	scenRace(16, func(i int) {
		var err error
		if i%2 == 0 {
			_, err = cat.Put(ctx, sku, int64(200+i), 0, v.Version)
		} else {
			_, err = cat.Adjust(ctx, sku, int64(i), "restock", "", v.Version)
		}
		switch {
		case err == nil:
			wins.Add(1)
		case errors.Is(err, inventory.ErrPrecondition):
			lost.Add(1)
		default:
			t.Errorf("write %d: %v", i, err)
		}
	})
	require.EqualValues(t, 1, wins.Load(), "one write under the version")
	require.EqualValues(t, 15, lost.Load())
	moves := r.Count(`SELECT COUNT(*) FROM stock_movements WHERE sku = ? AND kind IN ('SET', 'RESTOCK')`, sku)
	require.EqualValues(t, 2, moves, "the creation and the one winning write")
	_, err = cat.Put(ctx, sku, 1, 0, arbiter.AnyVersion)
	require.ErrorIs(t, err, inventory.ErrConflict, "a version check does not lift the reserved floor")
	_, err = cat.Put(ctx, "NO-SUCH-"+sku, 1, 0, arbiter.AnyVersion)
	require.ErrorIs(t, err, inventory.ErrPrecondition)
	require.EqualValues(t, 0, r.Count(`SELECT COUNT(*) FROM skus WHERE sku = ?`, "NO-SUCH-"+sku))
	r.CheckInvariant(sku)
}
