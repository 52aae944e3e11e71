package tokens_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/groupcommit"
	"github.com/acme/inventory/internal/tokens"
	"github.com/acme/inventory/testkit/testrig"
)

// A token's reservation whose commit's answer was lost while the database
// recorded it: its units are not given back to Redis, so Redis holds
// on_hand - reserved, never more; the SKU is realigned to make sure, and
// Redis forgets the token, so the client's retry is answered from the
// database (the first answer, nothing taken twice) rather than told the
// first call is still in progress.
func TestReserveOfUnknownOutcomeKeepsItsAdmission(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	u := r.UnansweredCommits()
	svc := tokens.New(r.DB, r.Stock, u.Writer, tokens.Config{TTL: testrig.TTL, Now: r.Clock.Now})
	sku := r.PutSKU("TOK", 10, 0)
	require.EqualValues(t, 10, r.RedisAvailable(sku))
	realigns := r.Stock.Stats().Realigns.Load()

	ctx, cancel := u.AnswerLost(context.Background())
	_, err := svc.ReserveHold(ctx, sku, 3, "order-77", 0)
	cancel()
	require.ErrorIs(t, err, groupcommit.ErrUnknownOutcome)
	require.ErrorIs(t, err, inventory.ErrUnavailable)
	require.NoError(t, u.Heal())
	r.RequireQty(sku, 10, 3)
	require.Equal(t, arbiter.Held, r.ReservationState("t.order-77", sku), "the database recorded the reservation")
	require.EqualValues(t, 7, r.RedisAvailable(sku), "Redis holds on_hand - reserved, not the units given back")
	require.Eventually(t, func() bool { return r.Stock.Stats().Realigns.Load() > realigns },
		10*time.Second, 5*time.Millisecond, "the SKU was realigned")
	r.CheckInvariant(sku)

	h, err := svc.ReserveHold(context.Background(), sku, 3, "order-77", 0)
	require.NoError(t, err, "the retry is answered from the database")
	require.EqualValues(t, 7, h.Result, "the first call's answer")
	r.RequireQty(sku, 10, 3)
	r.CheckInvariant(sku)
}

// A node killed between a token's admission and its write leaves Redis
// remembering the token with nothing in the database. A live node answers
// a replay "in progress" while such a write could still be on its way
// (Config.InFlight); past that, the admission's node is gone: Redis
// forgets the token and the replay is admitted again and recorded, once,
// instead of being told "in progress" until the token key expires with
// the hold. The units the dead admission took stay out of Redis until the
// SKU is realigned; the database holds the one reservation.
func TestReserveAfterItsAdmittingNodeDied(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	sku := r.PutSKU("TOKDEAD", 10, 0)
	require.EqualValues(t, 10, r.RedisAvailable(sku))
	// The dead node's admission: Redis took 3 units for the token and
	// remembers it for the hold; nothing reached the database.
	_, err := r.Stock.AdmitFor(ctx, sku, 3, "t.cart-9", time.Hour)
	require.NoError(t, err)
	require.EqualValues(t, 7, r.RedisAvailable(sku))

	patient := tokens.New(r.DB, r.Stock, r.Commits, tokens.Config{TTL: testrig.TTL, Now: r.Clock.Now, InFlight: time.Hour})
	_, err = patient.ReserveHold(ctx, sku, 3, "cart-9", 0)
	require.ErrorIs(t, err, inventory.ErrConflict, "within InFlight the first call may still be writing")
	require.ErrorContains(t, err, "in progress")
	r.RequireQty(sku, 10, 0)

	svc := tokens.New(r.DB, r.Stock, r.Commits, tokens.Config{TTL: testrig.TTL, Now: r.Clock.Now, InFlight: time.Millisecond})
	time.Sleep(5 * time.Millisecond) // the admission is older than InFlight by Redis's clock
	h, err := svc.ReserveHold(ctx, sku, 3, "cart-9", 0)
	require.NoError(t, err, "past InFlight the token is admitted again and recorded")
	require.EqualValues(t, 4, h.Result, "taken again from what Redis had left")
	r.RequireQty(sku, 10, 3)
	require.Equal(t, arbiter.Held, r.ReservationState("t.cart-9", sku))

	again, err := svc.ReserveHold(ctx, sku, 3, "cart-9", 0)
	require.NoError(t, err, "a replay now is answered from the database")
	require.Equal(t, h, again)
	r.RequireQty(sku, 10, 3)

	require.EqualValues(t, 4, r.RedisAvailable(sku), "the dead admission's units are out of Redis until the realign")
	require.NoError(t, r.Stock.Realign(ctx, sku))
	r.CheckInvariant(sku)
}
