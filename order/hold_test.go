package order_test

// Holds a checkout can size and extend: hold_seconds at creation, and an
// extension that is one conditional UPDATE of the order's deadline, decided
// against the timeout by the order's row.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/order"
	"github.com/acme/inventory/testkit/testrig"
)

// A hold asked at creation sets the deadline; one outside the bounds is
// refused before anything is taken.
func TestCreateHold(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	sku := r.PutSKU("HOLD", 10, 0)
	now := r.Clock.Now().UTC().Truncate(time.Microsecond)

	o, err := r.Orders.CreateHold(ctx, "u1", "", testrig.Line(sku, 1), 2*time.Minute)
	require.NoError(t, err)
	require.True(t, o.ExpiresAt.Equal(now.Add(2*time.Minute)), "expires_at %s", o.ExpiresAt)
	got, err := r.Orders.Get(ctx, o.ID)
	require.NoError(t, err)
	require.True(t, got.ExpiresAt.Equal(o.ExpiresAt), "the database holds the deadline answered")

	o, err = r.Orders.SeckillHold(ctx, "u2", sku, 1, 90*time.Second)
	require.NoError(t, err)
	require.True(t, o.ExpiresAt.Equal(now.Add(90*time.Second)))

	o, err = r.Orders.Create(ctx, "u3", "", testrig.Line(sku, 1))
	require.NoError(t, err)
	require.True(t, o.ExpiresAt.Equal(now.Add(testrig.TTL)), "no hold asked: the default")

	max := r.Orders.Holds().Max
	for _, hold := range []time.Duration{time.Second, inventory.MinHold - time.Second, max + time.Second, inventory.Seconds(1 << 62)} {
		_, err := r.Orders.CreateHold(ctx, "u4", "", testrig.Line(sku, 1), hold)
		require.ErrorIs(t, err, inventory.ErrInvalidArgument, "hold %s", hold)
		require.EqualError(t, err, fmt.Sprintf("inventory: invalid argument: hold_seconds must be between 10 and %d", int64(max/time.Second)))
		_, err = r.Orders.SeckillHold(ctx, "u4", sku, 1, hold)
		require.ErrorIs(t, err, inventory.ErrInvalidArgument, "hold %s", hold)
	}
	r.RequireQty(sku, 10, 3)
	require.Equal(t, int64(7), r.RedisAvailable(sku), "a refused hold took nothing")
	require.Equal(t, int64(3), r.Count(`SELECT COUNT(*) FROM orders`))
}

// Each rule of an extension: the deadline moves to the asked length from
// now, never earlier; another buyer, a finished order, a passed deadline and
// the maximum hold are refused and change nothing; a retry with the same key
// answers the deadline the first call set.
func TestExtendRules(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	sku := r.PutSKU("EXT", 10, 0)
	o, err := r.Orders.Create(ctx, "u1", "", testrig.Line(sku, 2))
	require.NoError(t, err)
	created := o.CreatedAt

	r.Clock.Advance(time.Minute)
	now := r.Clock.Now().UTC().Truncate(time.Microsecond)
	ext, err := r.Orders.Extend(ctx, o.ID, "u1", "k1", 30*time.Minute)
	require.NoError(t, err)
	require.True(t, ext.ExpiresAt.Equal(now.Add(30*time.Minute)), "expires_at %s", ext.ExpiresAt)
	require.Equal(t, order.Pending, ext.Status)
	require.Equal(t, []order.Item{{OrderID: o.ID, SKU: sku, Qty: 2}}, ext.Items)
	first := ext.ExpiresAt

	// A retry of k1 later answers the same deadline; another key moves it.
	r.Clock.Advance(time.Minute)
	again, err := r.Orders.Extend(ctx, o.ID, "u1", "k1", 30*time.Minute)
	require.NoError(t, err)
	require.True(t, again.ExpiresAt.Equal(first), "a replay answers the first deadline, got %s", again.ExpiresAt)
	// A shorter hold than the order has leaves it as it is.
	short, err := r.Orders.Extend(ctx, o.ID, "u1", "", time.Minute)
	require.NoError(t, err)
	require.True(t, short.ExpiresAt.Equal(first))

	_, err = r.Orders.Extend(ctx, o.ID, "u2", "", 40*time.Minute)
	require.ErrorIs(t, err, inventory.ErrForbidden)
	require.EqualError(t, err, "inventory: forbidden: the order belongs to another buyer")

	// Past the maximum counted from creation.
	max := r.Orders.Holds().Max
	_, err = r.Orders.Extend(ctx, o.ID, "u1", "", max)
	require.ErrorIs(t, err, inventory.ErrConflict)
	require.EqualError(t, err, fmt.Sprintf("inventory: conflict: a hold can last at most %s from the order's creation (%s)",
		max, created.Add(max).Format(time.RFC3339)))
	got, err := r.Orders.Get(ctx, o.ID)
	require.NoError(t, err)
	require.True(t, got.ExpiresAt.Equal(first), "refusals change nothing")

	// An admin ("" buyer) may extend; bounds are checked first.
	for _, by := range []time.Duration{0, inventory.MinHold - 1, max + 1} {
		_, err = r.Orders.Extend(ctx, o.ID, "", "", by)
		require.ErrorIs(t, err, inventory.ErrInvalidArgument)
	}
	_, err = r.Orders.Extend(ctx, "no-such-order", "u1", "", time.Hour)
	require.ErrorIs(t, err, inventory.ErrNotFound)

	// Past its deadline (not swept yet): refused, and the timeout takes it.
	r.Clock.Advance(first.Sub(r.Clock.Now()))
	_, err = r.Orders.Extend(ctx, o.ID, "u1", "k2", 30*time.Minute)
	require.ErrorIs(t, err, inventory.ErrConflict)
	require.EqualError(t, err, fmt.Sprintf("inventory: conflict: order %s's hold ended at %s", o.ID, first.Format(time.RFC3339)))
	ok, err := r.Orders.Expire(ctx, o.ID)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = r.Orders.Extend(ctx, o.ID, "u1", "k1", 30*time.Minute)
	require.ErrorIs(t, err, inventory.ErrConflict, "an expired order is not extended, even by a replayed key")
	require.EqualError(t, err, fmt.Sprintf("inventory: conflict: order %s is EXPIRED", o.ID))
	r.RequireQty(sku, 10, 0)
	r.CheckInvariant(sku)
}

// An extension races the timeout on every order: the extending node's clock
// says the deadline has not passed, the expiring node's clock says it has
// (skewed clocks, the worst case), so each statement alone would win. The
// order's row decides: exactly one wins per order, an extended order keeps
// its units, an expired one gives them back once, and no extension revives a
// released hold.
func TestExtensionRacesTheTimeout(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	const n = 60
	sku := r.PutSKU("RACE", 2*n, 0)
	ids := make([]string, n)
	for i := range ids {
		o, err := r.Orders.Create(ctx, fmt.Sprintf("u%d", i), "", testrig.Line(sku, 2))
		require.NoError(t, err)
		ids[i] = o.ID
	}
	base := r.Clock.Now()
	slow := order.NewService(r.DB, r.Stock, order.Config{TTL: testrig.TTL, Writer: r.Commits, MultiStatements: r.MultiStatements,
		Now: func() time.Time { return base.Add(testrig.TTL - time.Second) }})
	fast := order.NewService(r.DB, r.Stock, order.Config{TTL: testrig.TTL, Writer: r.Commits, MultiStatements: r.MultiStatements,
		Now: func() time.Time { return base.Add(testrig.TTL + time.Second) }})

	extended := make([]error, n)
	expired := make([]bool, n)
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, extended[i] = slow.Extend(ctx, id, fmt.Sprintf("u%d", i), "", 10*time.Minute)
		}()
		go func() {
			defer wg.Done()
			ok, err := fast.Expire(ctx, id)
			if err != nil {
				t.Error(err)
			}
			expired[i] = ok
		}()
	}
	wg.Wait()

	var pending int64
	wins := [2]int{}
	for i, id := range ids {
		o, err := r.Orders.Get(ctx, id)
		require.NoError(t, err)
		state := r.ReservationState(id, sku)
		switch {
		case extended[i] == nil && !expired[i]:
			wins[0]++
			pending++
			require.Equal(t, order.Pending, o.Status, "order %d", i)
			require.True(t, o.ExpiresAt.Equal(base.Add(testrig.TTL-time.Second+10*time.Minute).UTC().Truncate(time.Microsecond)), "order %d: %s", i, o.ExpiresAt)
			require.Equal(t, arbiter.Held, state, "order %d keeps its hold", i)
		case expired[i] && errors.Is(extended[i], inventory.ErrConflict):
			wins[1]++
			require.Equal(t, order.Expired, o.Status, "order %d", i)
			require.Equal(t, arbiter.Released, state, "order %d", i)
		default:
			t.Fatalf("order %d: extension %v, expiry %v: exactly one must win", i, extended[i], expired[i])
		}
	}
	t.Logf("extension won %d, expiry won %d", wins[0], wins[1])
	r.RequireQty(sku, 2*n, 2*pending)
	r.CheckInvariant(sku)
}

// What an extension costs the database: one conditional UPDATE decides it
// (the only write, no transaction), and the answer (the whole order with
// its lines, as the UPDATE left it) is read in the same text: one round
// trip on the wire, the hot path. A replay and a refusal read why from the
// same round trip. On the embedded SQLite (no multi-statement pool) the
// UPDATE, then the order and its lines: three statements.
func TestExtensionIsOneRoundTrip(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	sku, other := r.PutSKU("EXTN", 10, 0), r.PutSKU("EXTM", 10, 0)
	o, err := r.Orders.Create(ctx, "u1", "", []inventory.Line{{SKU: sku, Qty: 1}, {SKU: other, Qty: 2}})
	require.NoError(t, err)
	warm, err := r.Orders.Create(ctx, "u2", "", testrig.Line(sku, 1))
	require.NoError(t, err)
	// The rig runs no background job: what the wire counts is the call's.
	// A connection's first use costs its handshake and session settings:
	// one extension first, so the pool has a connection, as a serving
	// node's has.
	_, err = r.Orders.Extend(ctx, warm.ID, "u2", "", time.Hour)
	require.NoError(t, err)
	cost := func(fn func()) int64 {
		if r.Wire == nil { // the embedded stand-ins: statements
			return testrig.CountStatements(t, r.DB, fn)
		}
		before := r.Wire.Read()
		statements := testrig.CountStatements(t, r.DB, fn)
		require.EqualValues(t, 1, statements, "one text (the UPDATE and the SELECT), one statement to GORM")
		return r.Wire.Read().Since(before).RoundTrips()
	}
	want, what := int64(1), "round trips"
	if r.Wire == nil {
		want, what = 3, "statements (SQLite: the UPDATE, then the order and its lines)"
	}

	r.Clock.Advance(time.Minute)
	now := r.Clock.Now().UTC().Truncate(time.Microsecond)
	var ext *order.Order
	require.Equal(t, want, cost(func() { ext, err = r.Orders.Extend(ctx, o.ID, "u1", "k", time.Hour) }), "an extension: %s", what)
	require.NoError(t, err)
	require.True(t, ext.ExpiresAt.Equal(now.Add(time.Hour)), "expires_at %s", ext.ExpiresAt)
	got, err := r.Orders.Get(ctx, o.ID)
	require.NoError(t, err)
	require.Equal(t, got, ext, "the answer is the order as a read after it finds it")
	require.Len(t, ext.Items, 2)

	r.Clock.Advance(time.Minute)
	var again *order.Order
	require.Equal(t, want, cost(func() { again, err = r.Orders.Extend(ctx, o.ID, "u1", "k", time.Hour) }), "a replay: %s", what)
	require.NoError(t, err)
	require.Equal(t, ext, again, "a replay answers the order as the first call left it")
	require.Equal(t, want, cost(func() { _, err = r.Orders.Extend(ctx, o.ID, "u9", "", time.Hour) }), "a refusal: %s", what)
	require.ErrorIs(t, err, inventory.ErrForbidden)
}
