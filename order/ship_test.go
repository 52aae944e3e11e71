package order_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/order"
	"github.com/acme/inventory/testkit/testrig"
)

// shippingRow is a line's stock_shipping row (nil: none).
func shippingRow(t *testing.T, r *testrig.Rig, token, sku string) map[string]any {
	t.Helper()
	var rows []map[string]any
	require.NoError(t, r.DB.Raw(`SELECT qty, sold_at, shipped_at, restored_at FROM stock_shipping WHERE token = ? AND sku = ?`,
		token, sku).Scan(&rows).Error)
	if len(rows) == 0 {
		return nil
	}
	return rows[0]
}

// Only a paid order ships, once; its lines' rows say when they left on_hand
// and the warehouse, whichever came first; a shipped order refunds, a
// refunded one does not ship.
func TestShip(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	r.AddSKU("SHIP-A", 100)
	r.AddSKU("SHIP-B", 100)

	pending, err := r.Orders.Create(ctx, "u1", "", testrig.Line("SHIP-A", 1))
	require.NoError(t, err)
	_, err = r.Orders.Ship(ctx, pending.ID)
	require.ErrorIs(t, err, inventory.ErrConflict, "a PENDING order does not ship")
	_, err = r.Orders.Ship(ctx, "no-such-order")
	require.ErrorIs(t, err, inventory.ErrNotFound)
	_, err = r.Orders.Ship(ctx, "bad id")
	require.ErrorIs(t, err, inventory.ErrInvalidArgument)

	// Paid, deducted, then shipped: sold_at then shipped_at.
	o, err := r.Orders.Create(ctx, "u1", "", append(testrig.Line("SHIP-A", 2), testrig.Line("SHIP-B", 3)...))
	require.NoError(t, err)
	o, err = r.Orders.Pay(ctx, o.ID, "pay-o")
	require.NoError(t, err)
	for _, it := range o.Items {
		r.Deliver(arbiter.StockMessage{Token: o.ReservationToken, SKU: it.SKU, Op: arbiter.OpDeduct, Qty: it.Qty})
	}
	sold := shippingRow(t, r, o.ReservationToken, "SHIP-A")
	require.NotNil(t, sold["sold_at"])
	require.Nil(t, sold["shipped_at"])
	shipped, err := r.Orders.Ship(ctx, o.ID)
	require.NoError(t, err)
	require.Equal(t, order.Paid, shipped.Status)
	require.NotNil(t, shipped.ShippedAt)
	again, err := r.Orders.Ship(ctx, o.ID)
	require.NoError(t, err)
	require.Equal(t, shipped.ShippedAt.UTC(), again.ShippedAt.UTC(), "a replay keeps the first time")
	got, err := r.Orders.Get(ctx, o.ID)
	require.NoError(t, err)
	require.Equal(t, shipped.ShippedAt.UTC(), got.ShippedAt.UTC())
	for _, sku := range []string{"SHIP-A", "SHIP-B"} {
		row := shippingRow(t, r, o.ReservationToken, sku)
		require.NotNil(t, row["shipped_at"], sku)
		require.NotNil(t, row["sold_at"], sku)
	}

	// A shipped order refunds as today; the refund's restore stamps the row.
	refunded, err := r.Orders.Refund(ctx, o.ID)
	require.NoError(t, err)
	require.Equal(t, order.Refunded, refunded.Status)
	for _, it := range o.Items {
		r.Deliver(arbiter.StockMessage{Token: o.ReservationToken, SKU: it.SKU, Op: arbiter.OpRestore, Qty: it.Qty})
	}
	require.NotNil(t, shippingRow(t, r, o.ReservationToken, "SHIP-A")["restored_at"])
	r.RequireQty("SHIP-A", 100, 1)

	// Shipped before the consumer deducted it: the row says shipped first.
	early, err := r.Orders.Create(ctx, "u2", "", testrig.Line("SHIP-B", 1))
	require.NoError(t, err)
	_, err = r.Orders.Pay(ctx, early.ID, "pay-early")
	require.NoError(t, err)
	_, err = r.Orders.Ship(ctx, early.ID)
	require.NoError(t, err)
	row := shippingRow(t, r, early.ReservationToken, "SHIP-B")
	require.NotNil(t, row["shipped_at"])
	require.Nil(t, row["sold_at"])
	r.Deliver(arbiter.StockMessage{Token: early.ReservationToken, SKU: "SHIP-B", Op: arbiter.OpDeduct, Qty: 1})
	require.NotNil(t, shippingRow(t, r, early.ReservationToken, "SHIP-B")["sold_at"])

	// A refunded order cannot be shipped.
	gone, err := r.Orders.Create(ctx, "u3", "", testrig.Line("SHIP-A", 1))
	require.NoError(t, err)
	_, err = r.Orders.Pay(ctx, gone.ID, "pay-gone")
	require.NoError(t, err)
	_, err = r.Orders.Refund(ctx, gone.ID)
	require.NoError(t, err)
	_, err = r.Orders.Ship(ctx, gone.ID)
	require.ErrorIs(t, err, inventory.ErrConflict)
	require.ErrorContains(t, err, "a refunded order cannot be shipped")
	require.Nil(t, shippingRow(t, r, gone.ReservationToken, "SHIP-A"))

	// A token-API sale has no shipped signal: no row.
	_, err = r.Tokens.Reserve(ctx, "SHIP-A", 1, "tok-ship")
	require.NoError(t, err)
	_, err = r.Tokens.Commit(ctx, "SHIP-A", "tok-ship")
	require.NoError(t, err)
	r.Deliver(arbiter.StockMessage{Token: "t.tok-ship", SKU: "SHIP-A", Op: arbiter.OpDeduct, Qty: 1})
	require.Nil(t, shippingRow(t, r, "t.tok-ship", "SHIP-A"))
}

// A ship and a refund racing on one paid order: one order of the two, never
// a refunded order that shipped after its refund.
func TestShipRacesRefund(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	r.AddSKU("SHIP-R", 100)
	for i := range 10 {
		o, err := r.Orders.Create(ctx, "u", "", testrig.Line("SHIP-R", 1))
		require.NoError(t, err)
		_, err = r.Orders.Pay(ctx, o.ID, "pay-race-"+o.ID)
		require.NoError(t, err)
		var shipErr, refundErr error
		testrig.Race(2, func(k int) {
			if k == 0 {
				_, shipErr = r.Orders.Ship(ctx, o.ID)
			} else {
				_, refundErr = r.Orders.Refund(ctx, o.ID)
			}
		})
		require.NoError(t, refundErr, "a refund of a paid order, shipped or not, goes through (%d)", i)
		got, err := r.Orders.Get(ctx, o.ID)
		require.NoError(t, err)
		require.Equal(t, order.Refunded, got.Status)
		if shipErr != nil {
			require.True(t, errors.Is(shipErr, inventory.ErrConflict), "%v", shipErr)
			require.Nil(t, got.ShippedAt, "refused: not shipped")
		} else {
			require.NotNil(t, got.ShippedAt, "shipped before its refund")
		}
	}
}
