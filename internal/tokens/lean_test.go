package tokens_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/testkit/testrig"
)

// TestLeanContract runs the token suite again with every token's hold
// recorded as the lean sale does: replays, commits, releases, extensions
// and the sweep must find a hold the projector has not reached.
func TestLeanContract(t *testing.T) {
	testrig.RunLean(t,
		TestTokenAPISemantics,
		TestCommitRacesRelease,
		TestReserveRaceOneWinner,
		TestReserveScarceStockExactWinners,
		TestCommitRaceOneWinner,
		TestReleaseRaceOneWinner,
		TestReplaySemantics,
		TestReplayAfterRedisForgotTheToken,
		TestReplaysRaceAfterRedisForgot,
		TestReleaseExpiredReleasesExactlyTheExpired,
		TestReleaseExpiredRacesSweepsAndCommits,
		TestTokenHoldAndExtend,
		TestSweepDoesNotReleaseAnExtendedHold,
		TestTokenExtensionRacesTheSweep,
		TestLeanReleaseBeforeTheProjector,
	)
}

// A release that reaches a token's hold before the projector gives its
// units back: it must never take the hold for a token never seen (whose
// release leaves a tombstone and gives nothing). And a reconcile that
// repairs reserved meanwhile counts the holds the projector has not
// written.
func TestLeanReleaseBeforeTheProjector(t *testing.T) {
	was := testrig.Lean
	testrig.Lean = true // lean whether TestLeanContract runs it or not
	defer func() { testrig.Lean = was }()
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	r.AddSKU("LT", 10)
	_, err := r.Tokens.Reserve(ctx, "LT", 3, "tok-1")
	require.NoError(t, err)
	_, err = r.Tokens.Reserve(ctx, "LT", 2, "tok-2")
	require.NoError(t, err)
	var dirty int64
	require.NoError(t, r.DB.Raw(`SELECT COUNT(*) FROM stock_reservations`).Scan(&dirty).Error)
	require.Zero(t, dirty, "nothing projected yet")

	require.NoError(t, r.DB.Transaction(func(tx *gorm.DB) error { return arbiter.In(tx).FixReserved("LT") }))
	require.EqualValues(t, 5, r.SKU("LT").Reserved, "the unprojected holds are counted")

	n, err := r.Tokens.Release(ctx, "LT", "tok-1")
	require.NoError(t, err)
	require.EqualValues(t, 3, n, "the hold's units, given back")
	r.RequireQty("LT", 10, 2)
	n, err = r.Tokens.Release(ctx, "LT", "tok-1")
	require.NoError(t, err)
	require.Zero(t, n, "once")
	require.Equal(t, arbiter.Released, r.ReservationState("t.tok-1", "LT"))
	require.Equal(t, arbiter.Held, r.ReservationState("t.tok-2", "LT"))
	r.CheckInvariant("LT")

	// A hold past its deadline that the projector never reached is
	// released by the sweep all the same.
	_, err = r.Tokens.Reserve(ctx, "LT", 4, "tok-3")
	require.NoError(t, err)
	r.Clock.Advance(testrig.TTL + time.Second)
	released, err := r.Tokens.ReleaseExpired(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, 2, released, "tok-2 (projected) and tok-3 (not)")
	r.RequireQty("LT", 10, 0)
	r.CheckInvariant("LT")
}
