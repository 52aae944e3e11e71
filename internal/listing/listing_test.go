package listing_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/catalog"
	"github.com/acme/inventory/internal/groupcommit"
	"github.com/acme/inventory/internal/listing"
	"github.com/acme/inventory/internal/testrig"
	"github.com/acme/inventory/order"
)

// move is a movement without its id and time (asserted separately).
type move struct {
	Kind             arbiter.MovementKind
	OnHand, Reserved int64
	Reason, Ref      string
}

// history reads sku's whole history through Movements, a page at a time,
// checks ids strictly increase and every movement has a time, and returns it.
func history(t *testing.T, l *listing.Reader, sku string) []move {
	t.Helper()
	var out []move
	var after int64
	for {
		p, err := l.Movements(context.Background(), sku, after, listing.MaxPageSize)
		require.NoError(t, err)
		for _, m := range p.Items {
			require.Greater(t, m.ID, after, "ids increase")
			require.Equal(t, sku, m.SKU)
			require.False(t, m.CreatedAt.IsZero(), "movement %d has a time", m.ID)
			after = m.ID
			out = append(out, move{m.Kind, m.OnHandDelta, m.ReservedDelta, m.Reason, m.Reference})
		}
		if p.Next == 0 {
			return out
		}
		require.Equal(t, after, p.Next)
	}
}

// requireSums asserts the history adds up to the SKU's record.
func requireSums(t *testing.T, r *testrig.Rig, cat *catalog.Catalog, sku string) {
	t.Helper()
	var onHand, reserved int64
	for _, m := range history(t, r.Listing, sku) {
		onHand += m.OnHand
		reserved += m.Reserved
	}
	rec := r.SKU(sku)
	require.Equal(t, [2]int64{rec.OnHand, rec.Reserved}, [2]int64{onHand, reserved}, "%s: the movements sum to [on_hand, reserved]", sku)
}

// A SKU's whole life, each change one movement in order, with the sums equal
// to on_hand and reserved at the end.
func TestMovementsFullLife(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	cat := r.Catalog
	redisApplied := r.RedisApplied()
	r.StartPipeline()

	_, err := cat.Put(ctx, "LIFE", 10, 0)
	require.NoError(t, err)
	_, err = cat.Put(ctx, "LIFE", 10, 3) // the limit alone: on_hand does not move, no movement
	require.NoError(t, err)
	_, err = cat.Adjust(ctx, "LIFE", 5, " restock ", "po-17")
	require.NoError(t, err)
	cancelled, err := r.Orders.Create(ctx, "u1", "", testrig.Line("LIFE", 3))
	require.NoError(t, err)
	_, err = r.Orders.Cancel(ctx, cancelled.ID)
	require.NoError(t, err)
	paid, err := r.Orders.Create(ctx, "u2", "", testrig.Line("LIFE", 2))
	require.NoError(t, err)
	_, err = r.Orders.Pay(ctx, paid.ID, "pay-1")
	require.NoError(t, err)
	r.WaitApplied()
	r.RequireQty("LIFE", 13, 0)
	_, err = r.Orders.Refund(ctx, paid.ID)
	require.NoError(t, err)
	r.WaitApplied()
	redisApplied(1)
	_, err = r.Tokens.Reserve(ctx, "LIFE", 1, "tok-1")
	require.NoError(t, err)
	released, err := r.Tokens.Release(ctx, "LIFE", "tok-1")
	require.NoError(t, err)
	require.EqualValues(t, 1, released)
	released, err = r.Tokens.Release(ctx, "LIFE", "tok-1") // gives back nothing: no movement
	require.NoError(t, err)
	require.EqualValues(t, 0, released)
	_, err = cat.Adjust(ctx, "LIFE", -4, "shrinkage", "")
	require.NoError(t, err)
	_, err = cat.Put(ctx, "LIFE", 20, 3)
	require.NoError(t, err)

	require.Equal(t, []move{
		{arbiter.MoveSet, 10, 0, "", ""},
		{arbiter.MoveRestock, 5, 0, "restock", "po-17"},
		{arbiter.MoveReserve, 0, 3, "", cancelled.ID},
		{arbiter.MoveRelease, 0, -3, "", cancelled.ID},
		{arbiter.MoveReserve, 0, 2, "", paid.ID},
		{arbiter.MoveSale, -2, -2, "", paid.ID},
		{arbiter.MoveRefund, 2, 0, "", paid.ID},
		{arbiter.MoveReserve, 0, 1, "", "token:tok-1"},
		{arbiter.MoveRelease, 0, -1, "", "token:tok-1"},
		{arbiter.MoveCorrection, -4, 0, "shrinkage", ""},
		{arbiter.MoveSet, 9, 0, "", ""},
	}, history(t, r.Listing, "LIFE"))
	r.RequireQty("LIFE", 20, 0)
	requireSums(t, r, cat, "LIFE")
	r.CheckInvariant("LIFE")
}

// A late payment re-reserves (RESERVE) under the order's ".late" token; the
// sale names the order. An unlimited SKU's sale moves reserved only.
func TestMovementsLatePaymentAndUnlimited(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	cat := r.Catalog
	r.StartPipeline()
	_, err := cat.Put(ctx, "LATE", 5, 0)
	require.NoError(t, err)
	_, err = cat.Put(ctx, "UNL", inventory.Unlimited, 0)
	require.NoError(t, err)

	o, err := r.Orders.Create(ctx, "u1", "", []inventory.Line{{SKU: "LATE", Qty: 2}, {SKU: "UNL", Qty: 4}})
	require.NoError(t, err)
	r.Clock.Advance(16 * time.Minute)
	expired, err := r.Orders.Expire(ctx, o.ID)
	require.NoError(t, err)
	require.True(t, expired)
	late, err := r.Orders.Pay(ctx, o.ID, "pay-late")
	require.NoError(t, err)
	require.Equal(t, o.ID+".late", late.ReservationToken)
	r.WaitApplied()

	require.Equal(t, []move{
		{arbiter.MoveSet, 5, 0, "", ""},
		{arbiter.MoveReserve, 0, 2, "", o.ID},
		{arbiter.MoveRelease, 0, -2, "", o.ID},
		{arbiter.MoveReserve, 0, 2, "", o.ID},
		{arbiter.MoveSale, -2, -2, "", o.ID},
	}, history(t, r.Listing, "LATE"))
	require.Equal(t, []move{
		{arbiter.MoveSet, -1, 0, "", ""},
		{arbiter.MoveReserve, 0, 4, "", o.ID},
		{arbiter.MoveRelease, 0, -4, "", o.ID},
		{arbiter.MoveReserve, 0, 4, "", o.ID},
		{arbiter.MoveSale, 0, -4, "", o.ID},
	}, history(t, r.Listing, "UNL"))
	requireSums(t, r, cat, "LATE")
	requireSums(t, r, cat, "UNL")
	r.RequireQty("LATE", 3, 0)
	r.RequireQty("UNL", -1, 0)
}

// Reconcile's repair of reserved is recorded as a CORRECTION of reserved.
func TestMovementsReconcileCorrection(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	cat := r.Catalog
	_, err := cat.Put(ctx, "FIX", 10, 0)
	require.NoError(t, err)
	o, err := r.Orders.Create(ctx, "u1", "", testrig.Line("FIX", 3))
	require.NoError(t, err)
	require.NoError(t, r.DB.Exec(`UPDATE skus SET reserved = 5 WHERE sku = 'FIX'`).Error) // drift outside the service
	_, err = r.Reconciler().Reconcile(ctx, true)
	require.NoError(t, err)
	r.RequireQty("FIX", 10, 3)
	require.Equal(t, []move{
		{arbiter.MoveSet, 10, 0, "", ""},
		{arbiter.MoveReserve, 0, 3, "", o.ID},
		{arbiter.MoveCorrection, 0, -2, "reconcile: reserved set to the sum of live reservations", ""},
	}, history(t, r.Listing, "FIX"))
	_, err = r.Reconciler().Reconcile(ctx, true) // nothing to repair: no movement
	require.NoError(t, err)
	require.Len(t, history(t, r.Listing, "FIX"), 3)
}

// Many orders and token reservations on one SKU at once (group commit
// batches them): the movements add up to reserved, with one RESERVE per
// reservation that succeeded and one RELEASE per release that gave units back.
func TestMovementsConserveUnderRace(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	cat := r.Catalog
	_, err := cat.Put(ctx, "HOT", 40, 0)
	require.NoError(t, err)

	var reserved, releases, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o, err := r.Orders.Create(ctx, fmt.Sprintf("u%d", i), "", testrig.Line("HOT", 2))
			switch {
			case errors.Is(err, inventory.ErrInsufficientStock):
				refused.Add(1)
			case err != nil:
				t.Error(err)
			default:
				reserved.Add(1)
				if i%2 == 0 {
					if _, err := r.Orders.Cancel(ctx, o.ID); err != nil {
						t.Error(err)
					}
					releases.Add(1)
				}
			}
			tok := fmt.Sprintf("tok-%d", i)
			_, err = r.Tokens.Reserve(ctx, "HOT", 1, tok)
			switch {
			case errors.Is(err, inventory.ErrInsufficientStock):
				refused.Add(1)
			case err != nil:
				t.Error(err)
			default:
				reserved.Add(1)
				if i%3 == 0 {
					n, err := r.Tokens.Release(ctx, "HOT", tok)
					if err != nil {
						t.Error(err)
					}
					if n == 1 {
						releases.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	require.Positive(t, reserved.Load())
	require.Positive(t, refused.Load(), "more is asked than there is, even net of what goes back")

	counts := map[arbiter.MovementKind]int64{}
	var sumReserved int64
	for _, m := range history(t, r.Listing, "HOT") {
		counts[m.Kind]++
		sumReserved += m.Reserved
	}
	require.Equal(t, r.SKU("HOT").Reserved, sumReserved, "the movements sum to reserved")
	require.Equal(t, map[arbiter.MovementKind]int64{arbiter.MoveSet: 1, arbiter.MoveReserve: reserved.Load(), arbiter.MoveRelease: releases.Load()}, counts)
	require.EqualValues(t, reserved.Load(), r.Count(`SELECT COUNT(*) FROM stock_reservations WHERE sku = 'HOT' AND qty > 0`))
	requireSums(t, r, cat, "HOT")
	r.CheckInvariant("HOT")
}

// A reservation the database refuses (Redis admitted it wrongly) rolls back
// with its movement: alone, and inside a group-committed batch that is then
// written request by request.
func TestMovementsRolledBackReservation(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	cat := r.Catalog
	_, err := cat.Put(ctx, "R", 5, 0)
	require.NoError(t, err)
	first, err := r.Orders.Create(ctx, "u1", "", testrig.Line("R", 3))
	require.NoError(t, err)
	inflate := func(n int64) {
		lv, err := r.Stock.Levels(ctx, "R")
		require.NoError(t, err)
		// A change the init never saw: Redis gains n units the database lacks.
		require.NoError(t, r.Stock.Apply(ctx, inventory.Change{SKU: "R", Delta: n, Seq: lv.Seq + 1_000_000}))
	}
	inflate(10)
	_, err = r.Orders.Create(ctx, "u2", "", testrig.Line("R", 4))
	require.ErrorIs(t, err, inventory.ErrInsufficientStock, "Redis admitted, the database refused")
	inflate(10)
	_, err = r.Tokens.Reserve(ctx, "R", 3, "tok-r")
	require.ErrorIs(t, err, inventory.ErrInsufficientStock)
	require.Equal(t, []move{
		{arbiter.MoveSet, 5, 0, "", ""},
		{arbiter.MoveReserve, 0, 3, "", first.ID},
	}, history(t, r.Listing, "R"))

	// A batch that does not fit: 12 requests for the 2 units left.
	b := r.Commits
	now := time.Now().UTC().Truncate(time.Microsecond)
	var wg sync.WaitGroup
	var ok atomic.Int64
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := b.Write(ctx, &groupcommit.Request{Rows: []arbiter.Reservation{{Token: fmt.Sprintf("t.k%d", i), SKU: "R", Qty: 1,
				State: arbiter.Held, ExpiresAt: now.Add(time.Minute), CreatedAt: now, UpdatedAt: now}}})
			var ref arbiter.RefusedError
			switch {
			case err == nil:
				ok.Add(1)
			case !errors.As(err, &ref):
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	require.EqualValues(t, 2, ok.Load())
	h := history(t, r.Listing, "R")
	require.Len(t, h, 4)
	for _, m := range h[2:] {
		require.Equal(t, arbiter.MoveReserve, m.Kind)
		require.EqualValues(t, 1, m.Reserved)
		require.Regexp(t, `^token:k\d+$`, m.Ref)
	}
	r.RequireQty("R", 5, 5)
	requireSums(t, r, cat, "R")
}

// Seven movements read three at a time: 3, 3, 1, each page's cursor its last
// id, no movement twice; and the reader's argument errors.
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
	var deltas []int64
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
		}
		if p.Next == 0 {
			break
		}
		require.Equal(t, p.Items[len(p.Items)-1].ID, p.Next)
		after = p.Next
	}
	require.Equal(t, []int{3, 3, 1}, sizes)
	require.Equal(t, []int64{10, 1, -1, 3, -1, 5, -1}, deltas)

	p, err := r.Listing.Movements(ctx, "PG", 0, 0)
	require.NoError(t, err)
	require.Len(t, p.Items, 7, "limit 0 is the default page")
	require.Zero(t, p.Next)
	p, err = r.Listing.Movements(ctx, "PG", p.Items[6].ID, 3)
	require.NoError(t, err)
	require.Equal(t, &listing.MovementPage{Items: []arbiter.Movement{}}, p, "past the end: an empty page")

	for _, c := range []struct {
		sku          string
		after        int64
		limit        int
		err          error
		wantContains string
	}{
		{"PG", 0, -1, inventory.ErrInvalidArgument, "limit must be between 1 and 500"},
		{"PG", 0, 501, inventory.ErrInvalidArgument, "limit must be between 1 and 500"},
		{"PG", -1, 3, inventory.ErrInvalidArgument, "cursor"},
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
	testrig.Embedded = true
	defer func() { testrig.Embedded = false }()
	for _, tc := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"MovementsFullLife", TestMovementsFullLife},
		{"MovementsLatePaymentAndUnlimited", TestMovementsLatePaymentAndUnlimited},
		{"MovementsReconcileCorrection", TestMovementsReconcileCorrection},
		{"MovementsConserveUnderRace", TestMovementsConserveUnderRace},
		{"MovementsRolledBackReservation", TestMovementsRolledBackReservation},
		{"MovementsPagination", TestMovementsPagination},
		{"ListSKUs", TestListSKUs},
		{"ListOrders", TestListOrders},
	} {
		t.Run(tc.name, tc.fn)
	}
}
