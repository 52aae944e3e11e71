package systemtest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/maintenance"
	"github.com/acme/inventory/testkit/testrig"
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
