package listing_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/listing"
	"github.com/acme/inventory/order"
	"github.com/acme/inventory/testkit/testrig"
)

// Seven movements read three at a time: 3, 3, 1, each page's cursor its last
// position (the last page's too), positions 1 to 7, no movement twice; and
// the reader's argument errors.
func TestMovementsPagination(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	cat := r.Catalog
	_, err := cat.Put(ctx, "PG", 10, 0)
	require.NoError(t, err)
	for i := range 6 {
		delta := int64(i + 1)
		if i%2 == 1 {
			delta = -1
		}
		_, err := cat.Adjust(ctx, "PG", delta, fmt.Sprintf("r%d", i), "")
		require.NoError(t, err)
	}
	_, err = cat.Put(ctx, "OTHER", 1, 0) // another SKU's movement never shows
	require.NoError(t, err)

	var sizes []int
	var deltas, positions []int64
	seen := map[int64]bool{}
	var after int64
	for {
		p, err := r.Listing.Movements(ctx, "PG", after, 3)
		require.NoError(t, err)
		sizes = append(sizes, len(p.Items))
		for _, m := range p.Items {
			require.False(t, seen[m.ID], "movement %d twice", m.ID)
			seen[m.ID] = true
			deltas = append(deltas, m.OnHandDelta)
			positions = append(positions, m.Position)
		}
		require.Equal(t, p.Items[len(p.Items)-1].Position, p.Next)
		after = p.Next
		if !p.More {
			break
		}
	}
	require.Equal(t, []int{3, 3, 1}, sizes)
	require.Equal(t, []int64{10, 1, -1, 3, -1, 5, -1}, deltas)
	require.Equal(t, []int64{1, 2, 3, 4, 5, 6, 7}, positions)

	p, err := r.Listing.Movements(ctx, "PG", 0, 0)
	require.NoError(t, err)
	require.Len(t, p.Items, 7, "limit 0 is the default page")
	require.Equal(t, &listing.MovementPage{Items: p.Items, Next: 7}, p)
	p, err = r.Listing.Movements(ctx, "PG", 7, 3)
	require.NoError(t, err)
	require.Equal(t, &listing.MovementPage{Items: []arbiter.Movement{}, Next: 7}, p, "past the end: an empty page, read on from where it was asked")
	p, err = r.Listing.Movements(ctx, "PG", 6, 1)
	require.NoError(t, err)
	require.Equal(t, []int64{-1}, []int64{p.Items[0].OnHandDelta})
	require.Equal(t, int64(7), p.Next)
	require.False(t, p.More, "a full page with nothing after it")

	for _, c := range []struct {
		sku          string
		after        int64
		limit        int
		err          error
		wantContains string
	}{
		{"PG", 0, -1, inventory.ErrInvalidArgument, "limit must be between 1 and 500"},
		{"PG", 0, 501, inventory.ErrInvalidArgument, "limit must be between 1 and 500"},
		{"PG", -1, 3, inventory.ErrInvalidArgument, "after must be a movement position"},
		{"PG", 8, 3, inventory.ErrInvalidArgument, "after 8 is beyond PG's last movement (position 7)"},
		{"-PG", 0, 3, inventory.ErrInvalidArgument, "sku must be"},
		{"NOPE", 0, 3, inventory.ErrUnknownSKU, "NOPE"},
	} {
		_, err := r.Listing.Movements(ctx, c.sku, c.after, c.limit)
		require.ErrorIs(t, err, c.err, "%+v", c)
		require.ErrorContains(t, err, c.wantContains)
	}
}

// The SKU listing: SKU order, pages with cursors, the low-stock filter (never
// an unlimited SKU), values from the database row.
func TestListSKUs(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	cat := r.Catalog
	for _, s := range []struct {
		sku   string
		stock int64
	}{{"A1", 10}, {"A2", 3}, {"A3", inventory.Unlimited}, {"A4", 5}, {"A5", 0}} {
		_, err := cat.Put(ctx, s.sku, s.stock, 0)
		require.NoError(t, err)
	}
	_, err := cat.Put(ctx, "A1", 10, 2)
	require.NoError(t, err)
	_, err = r.Orders.Create(ctx, "u1", "", testrig.Line("A4", 3))
	require.NoError(t, err)
	a1 := listing.SKUListItem{SKU: "A1", OnHand: 10, Available: 10, PerUserLimit: 2}
	a2 := listing.SKUListItem{SKU: "A2", OnHand: 3, Available: 3}
	a3 := listing.SKUListItem{SKU: "A3", OnHand: -1, Available: -1, Unlimited: true}
	a4 := listing.SKUListItem{SKU: "A4", OnHand: 5, Reserved: 3, Available: 2}
	a5 := listing.SKUListItem{SKU: "A5"}

	list := func(q listing.SKUQuery) *listing.SKUPage {
		t.Helper()
		p, err := r.Listing.SKUs(ctx, q)
		require.NoError(t, err)
		return p
	}
	require.Equal(t, &listing.SKUPage{Items: []listing.SKUListItem{a1, a2, a3, a4, a5}}, list(listing.SKUQuery{}))
	require.Equal(t, &listing.SKUPage{Items: []listing.SKUListItem{a1, a2}, Next: "A2"}, list(listing.SKUQuery{Limit: 2}))
	require.Equal(t, &listing.SKUPage{Items: []listing.SKUListItem{a3, a4}, Next: "A4"}, list(listing.SKUQuery{Limit: 2, After: "A2"}))
	require.Equal(t, &listing.SKUPage{Items: []listing.SKUListItem{a5}}, list(listing.SKUQuery{Limit: 2, After: "A4"}))
	require.Equal(t, &listing.SKUPage{Items: []listing.SKUListItem{}}, list(listing.SKUQuery{After: "A5"}))

	low := func(n int64) *int64 { return &n }
	require.Equal(t, &listing.SKUPage{Items: []listing.SKUListItem{a4, a5}}, list(listing.SKUQuery{LowStock: low(2)}))
	require.Equal(t, &listing.SKUPage{Items: []listing.SKUListItem{a2, a4}, Next: "A4"}, list(listing.SKUQuery{LowStock: low(3), Limit: 2}))
	require.Equal(t, &listing.SKUPage{Items: []listing.SKUListItem{a5}}, list(listing.SKUQuery{LowStock: low(3), Limit: 2, After: "A4"}))
	require.Equal(t, &listing.SKUPage{Items: []listing.SKUListItem{a5}}, list(listing.SKUQuery{LowStock: low(0)}))

	for _, q := range []listing.SKUQuery{{Limit: -1}, {Limit: 501}, {After: "-A"}, {After: "a b"}, {LowStock: low(-1)}} {
		_, err := r.Listing.SKUs(ctx, q)
		require.ErrorIs(t, err, inventory.ErrInvalidArgument, "%+v", q)
	}
}

// The order listing: newest first, filters by user, status and a half-open
// time window, pages with cursors, items loaded; and its argument errors.
func TestListOrders(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	r.AddSKU("A", 100)
	r.AddSKU("B", 100)
	create := func(user string, lines ...inventory.Line) *order.Order {
		t.Helper()
		o, err := r.Orders.Create(ctx, user, "", lines)
		require.NoError(t, err)
		r.Clock.Advance(time.Minute)
		return o
	}
	o1 := create("u1", inventory.Line{SKU: "A", Qty: 1})
	o2 := create("u2", inventory.Line{SKU: "B", Qty: 2}, inventory.Line{SKU: "A", Qty: 3})
	o3 := create("u1", inventory.Line{SKU: "A", Qty: 4})
	o4 := create("u1", inventory.Line{SKU: "B", Qty: 5})
	o5 := create("u2", inventory.Line{SKU: "A", Qty: 6})
	_, err := r.Orders.Cancel(ctx, o3.ID)
	require.NoError(t, err)
	_, err = r.Orders.Pay(ctx, o4.ID, "pay-4")
	require.NoError(t, err)

	type row struct {
		id, user string
		status   order.Status
		items    []order.Item
	}
	want := map[string]row{}
	for o, st := range map[*order.Order]order.Status{o1: order.Pending, o2: order.Pending, o3: order.Cancelled, o4: order.Paid, o5: order.Pending} {
		want[o.ID] = row{o.ID, o.UserID, st, o.Items}
	}
	rows := func(os ...*order.Order) []row {
		out := []row{}
		for _, o := range os {
			out = append(out, want[o.ID])
		}
		return out
	}
	list := func(q listing.OrderQuery) ([]row, string) {
		t.Helper()
		p, err := r.Listing.Orders(ctx, q)
		require.NoError(t, err)
		out := []row{}
		for _, o := range p.Items {
			out = append(out, row{o.ID, o.UserID, o.Status, o.Items})
		}
		return out, p.Next
	}
	check := func(q listing.OrderQuery, next string, os ...*order.Order) {
		t.Helper()
		got, gotNext := list(q)
		require.Equal(t, rows(os...), got, "%+v", q)
		require.Equal(t, next, gotNext, "%+v: next cursor", q)
	}

	check(listing.OrderQuery{}, "", o5, o4, o3, o2, o1)
	check(listing.OrderQuery{Limit: 2}, o4.ID, o5, o4)
	check(listing.OrderQuery{Limit: 2, After: o4.ID}, o2.ID, o3, o2)
	check(listing.OrderQuery{Limit: 2, After: o2.ID}, "", o1)
	check(listing.OrderQuery{UserID: "u1"}, "", o4, o3, o1)
	check(listing.OrderQuery{UserID: "u1", Limit: 1, After: o4.ID}, o3.ID, o3)
	check(listing.OrderQuery{UserID: "nobody"}, "")
	check(listing.OrderQuery{Status: order.Pending}, "", o5, o2, o1)
	check(listing.OrderQuery{Status: order.Cancelled}, "", o3)
	check(listing.OrderQuery{Status: order.Paid, UserID: "u1"}, "", o4)
	check(listing.OrderQuery{Status: order.Paid, UserID: "u2"}, "")
	check(listing.OrderQuery{CreatedFrom: o2.CreatedAt, CreatedTo: o4.CreatedAt}, "", o3, o2) // [from, to)
	check(listing.OrderQuery{CreatedFrom: o4.CreatedAt}, "", o5, o4)
	check(listing.OrderQuery{CreatedTo: o2.CreatedAt.Add(time.Microsecond)}, "", o2, o1)
	check(listing.OrderQuery{CreatedFrom: o1.CreatedAt.In(time.FixedZone("X", 3600)), CreatedTo: o3.CreatedAt.In(time.FixedZone("Y", -7200))}, "", o2, o1)
	check(listing.OrderQuery{CreatedFrom: o1.CreatedAt, UserID: "u2", Status: order.Pending, Limit: 1}, o5.ID, o5)

	t0 := o1.CreatedAt
	for _, q := range []listing.OrderQuery{
		{Status: "NOPE"}, {Status: "pending"}, {Limit: -1}, {Limit: 501}, {After: "-x"}, {After: "a b"},
		{UserID: "bad user"}, {CreatedFrom: t0, CreatedTo: t0}, {CreatedFrom: t0.Add(time.Second), CreatedTo: t0},
	} {
		_, err := r.Listing.Orders(ctx, q)
		require.ErrorIs(t, err, inventory.ErrInvalidArgument, "%+v", q)
	}
}

// TestHistoryEmbedded runs this file's tests on the embedded default's
// stand-ins (SQLite, miniredis), as TestEmbeddedContract does for the suite.
func TestHistoryEmbedded(t *testing.T) {
	testrig.RunEmbedded(t,
		TestMovementsPagination,
		TestListSKUs,
		TestListOrders,
	)
}
