package order

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An order's lines are its reservations: a cart writes no order_items rows,
// and Get and List answer its lines in SKU order, whatever order the cart
// listed them in; after a late payment moved the order to a new token, the
// lines are the same.
func TestItemsAreTheReservations(t *testing.T) {
	r := newRig(t, memoryTransport(t))
	ctx := context.Background()
	r.addSKU("ITEM-B", 5)
	r.addSKU("ITEM-A", 5)

	o, err := r.svc.Create(ctx, "items-u", "", append(line("ITEM-B", 2), line("ITEM-A", 1)...))
	require.NoError(t, err)
	want := []Item{{OrderID: o.ID, SKU: "ITEM-A", Qty: 1}, {OrderID: o.ID, SKU: "ITEM-B", Qty: 2}}
	require.Zero(t, r.count(`SELECT COUNT(*) FROM order_items WHERE order_id = ?`, o.ID), "no second row per line")
	got, err := r.svc.Get(ctx, o.ID)
	require.NoError(t, err)
	require.Equal(t, want, got.Items)
	page, err := r.svc.List(ctx, OrderQuery{UserID: "items-u"})
	require.NoError(t, err)
	require.Len(t, page.Items, 1)
	require.Equal(t, want, page.Items[0].Items)

	// Expired, then paid late: re-reserved under a new token, same lines.
	r.clock.Advance(16 * time.Minute)
	expired, err := r.svc.Expire(ctx, o.ID)
	require.NoError(t, err)
	require.True(t, expired)
	paid, err := r.svc.Pay(ctx, o.ID, "items-pay")
	require.NoError(t, err)
	require.Equal(t, Paid, paid.Status)
	require.NotEqual(t, o.ID, paid.ReservationToken)
	got, err = r.svc.Get(ctx, o.ID)
	require.NoError(t, err)
	require.Equal(t, want, got.Items, "the old token's released reservations are not lines twice")
	page, err = r.svc.List(ctx, OrderQuery{UserID: "items-u"})
	require.NoError(t, err)
	require.Equal(t, want, page.Items[0].Items)
}

// Orders recorded before reservations existed have their lines only in
// order_items: they are still answered with them, beside new orders.
func TestItemsOfOrdersBeforeReservations(t *testing.T) {
	r := newRig(t, memoryTransport(t))
	ctx := context.Background()
	r.addSKU("ITEM-C", 5)
	now := r.clock.Now().UTC()
	require.NoError(t, r.db.Exec(`INSERT INTO orders (id, user_id, status, reservation_token, expires_at, created_at, updated_at)
		VALUES ('legacy-1', 'legacy-u', 'PAID', 'legacy-1', ?, ?, ?)`, now, now, now).Error)
	require.NoError(t, r.db.Exec(`INSERT INTO order_items (order_id, sku, qty) VALUES ('legacy-1', 'ITEM-Z', 4), ('legacy-1', 'ITEM-C', 3)`).Error)
	o, err := r.svc.Create(ctx, "legacy-u", "", line("ITEM-C", 1))
	require.NoError(t, err)

	legacy := []Item{{OrderID: "legacy-1", SKU: "ITEM-C", Qty: 3}, {OrderID: "legacy-1", SKU: "ITEM-Z", Qty: 4}}
	got, err := r.svc.Get(ctx, "legacy-1")
	require.NoError(t, err)
	require.Equal(t, legacy, got.Items)
	page, err := r.svc.List(ctx, OrderQuery{UserID: "legacy-u"})
	require.NoError(t, err)
	require.Len(t, page.Items, 2)
	byID := map[string][]Item{}
	for _, p := range page.Items {
		byID[p.ID] = p.Items
	}
	require.Equal(t, map[string][]Item{"legacy-1": legacy, o.ID: {{OrderID: o.ID, SKU: "ITEM-C", Qty: 1}}}, byID)
}
