package order_test

import (
	"context"
	"testing"
	"time"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/listing"
	"github.com/acme/inventory/order"
	"github.com/acme/inventory/testkit/testrig"
	"github.com/stretchr/testify/require"
)

// An order's lines are its reservations: a cart writes no order_items rows,
// and Get and List answer its lines in SKU order, whatever order the cart
// listed them in; after a late payment moved the order to a new token, the
// lines are the same.
func TestItemsAreTheReservations(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	r.AddSKU("ITEM-B", 5)
	r.AddSKU("ITEM-A", 5)

	o, err := r.Orders.Create(ctx, "items-u", "", append(testrig.Line("ITEM-B", 2), testrig.Line("ITEM-A", 1)...))
	require.NoError(t, err)
	want := []order.Item{{OrderID: o.ID, SKU: "ITEM-A", Qty: 1}, {OrderID: o.ID, SKU: "ITEM-B", Qty: 2}}
	require.Zero(t, r.Count(`SELECT COUNT(*) FROM order_items WHERE order_id = ?`, o.ID), "no second row per line")
	got, err := r.Orders.Get(ctx, o.ID)
	require.NoError(t, err)
	require.Equal(t, want, got.Items)
	page, err := r.Listing.Orders(ctx, listing.OrderQuery{UserID: "items-u"})
	require.NoError(t, err)
	require.Len(t, page.Items, 1)
	require.Equal(t, want, page.Items[0].Items)

	// order.Expired, then paid late: re-reserved under a new token, same lines.
	r.Clock.Advance(16 * time.Minute)
	expired, err := r.Orders.Expire(ctx, o.ID)
	require.NoError(t, err)
	require.True(t, expired)
	paid, err := r.Orders.Pay(ctx, o.ID, "items-pay")
	require.NoError(t, err)
	require.Equal(t, order.Paid, paid.Status)
	require.NotEqual(t, o.ID, paid.ReservationToken)
	got, err = r.Orders.Get(ctx, o.ID)
	require.NoError(t, err)
	require.Equal(t, want, got.Items, "the old token's released reservations are not lines twice")
	page, err = r.Listing.Orders(ctx, listing.OrderQuery{UserID: "items-u"})
	require.NoError(t, err)
	require.Equal(t, want, page.Items[0].Items)
}

// Orders recorded before reservations existed have their lines only in
// order_items: they are still answered with them, beside new orders.
func TestItemsOfOrdersBeforeReservations(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	r.AddSKU("ITEM-C", 5)
	now := r.Clock.Now().UTC()
	require.NoError(t, r.DB.Exec(`INSERT INTO orders (id, user_id, status, reservation_token, expires_at, created_at, updated_at)
		VALUES ('legacy-1', 'legacy-u', 'PAID', 'legacy-1', ?, ?, ?)`, now, now, now).Error)
	require.NoError(t, r.DB.Exec(`INSERT INTO order_items (order_id, sku, qty) VALUES ('legacy-1', 'ITEM-Z', 4), ('legacy-1', 'ITEM-C', 3)`).Error)
	o, err := r.Orders.Create(ctx, "legacy-u", "", testrig.Line("ITEM-C", 1))
	require.NoError(t, err)

	legacy := []order.Item{{OrderID: "legacy-1", SKU: "ITEM-C", Qty: 3}, {OrderID: "legacy-1", SKU: "ITEM-Z", Qty: 4}}
	got, err := r.Orders.Get(ctx, "legacy-1")
	require.NoError(t, err)
	require.Equal(t, legacy, got.Items)
	page, err := r.Listing.Orders(ctx, listing.OrderQuery{UserID: "legacy-u"})
	require.NoError(t, err)
	require.Len(t, page.Items, 2)
	byID := map[string][]order.Item{}
	for _, p := range page.Items {
		byID[p.ID] = p.Items
	}
	require.Equal(t, map[string][]order.Item{"legacy-1": legacy, o.ID: {{OrderID: o.ID, SKU: "ITEM-C", Qty: 1}}}, byID)

	// An extension reads the order it refuses with its lines too.
	got, err = r.Orders.Extend(ctx, "legacy-1", "legacy-u", "", time.Hour)
	require.ErrorIs(t, err, inventory.ErrConflict)
	require.Equal(t, legacy, got.Items)
}
