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
