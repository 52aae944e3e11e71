package tokens_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/tokens"
	"github.com/acme/inventory/testkit/testrig"
)

// reservation is token's row for sku (the client's token, without "t.").
func (s *rig) reservation(token, sku string) arbiter.Reservation {
	s.T.Helper()
	var r arbiter.Reservation
	require.NoError(s.T, s.DB.Take(&r, "token = ? AND sku = ?", "t."+token, sku).Error)
	return r
}

// A token's hold is sized at its deduction and extended by its token: the
// same rules as an order's (bounds, never earlier, not past its end or the
// maximum, a replayed key answers the first end), and Redis remembers the
// token as long as the hold.
func TestTokenHoldAndExtend(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	sku := r.PutSKU("TX", 10, 0)
	now := r.Clock.Now().UTC().Truncate(time.Microsecond)

	h, err := r.Tokens.ReserveHold(ctx, sku, 2, "tok-1", 2*time.Minute)
	require.NoError(t, err)
	require.Equal(t, tokens.Held{Result: 8, ExpiresAt: now.Add(2 * time.Minute)}, h)
	ttl, err := r.RDB.PTTL(ctx, fmt.Sprintf("inv:{%s}:t:t.tok-1", sku)).Result()
	require.NoError(t, err)
	require.InDelta(t, (3 * time.Minute).Seconds(), ttl.Seconds(), 5, "Redis remembers the token for the hold and a minute")
	again, err := r.Tokens.ReserveHold(ctx, sku, 2, "tok-1", time.Hour)
	require.NoError(t, err)
	require.Equal(t, h, again, "a replay answers the first reservation and its end")
	for _, hold := range []time.Duration{time.Second, r.Tokens.Holds().Max + time.Second} {
		_, err := r.Tokens.ReserveHold(ctx, sku, 1, "tok-2", hold)
		require.ErrorIs(t, err, inventory.ErrInvalidArgument)
	}

	r.Clock.Advance(time.Minute)
	later := now.Add(time.Minute)
	end, err := r.Tokens.Extend(ctx, sku, "tok-1", "k1", 20*time.Minute)
	require.NoError(t, err)
	require.Equal(t, later.Add(20*time.Minute), end)
	require.Equal(t, end, r.reservation("tok-1", sku).ExpiresAt.UTC())
	ttl, err = r.RDB.PTTL(ctx, fmt.Sprintf("inv:{%s}:t:t.tok-1", sku)).Result()
	require.NoError(t, err)
	require.InDelta(t, (21 * time.Minute).Seconds(), ttl.Seconds(), 5, "Redis keeps the token as long as the new hold")

	r.Clock.Advance(time.Minute)
	replay, err := r.Tokens.Extend(ctx, sku, "tok-1", "k1", 20*time.Minute)
	require.NoError(t, err)
	require.Equal(t, end, replay, "a replayed key answers the first end")
	shorter, err := r.Tokens.Extend(ctx, sku, "tok-1", "", time.Minute)
	require.NoError(t, err)
	require.Equal(t, end, shorter, "never earlier")

	max := r.Tokens.Holds().Max
	_, err = r.Tokens.Extend(ctx, sku, "tok-1", "", max)
	require.ErrorIs(t, err, inventory.ErrConflict)
	require.EqualError(t, err, fmt.Sprintf("inventory: conflict: a hold can last at most %s from its creation (%s)", max, now.Add(max).Format(time.RFC3339)))
	_, err = r.Tokens.Extend(ctx, sku, "nobody", "", time.Hour)
	require.ErrorIs(t, err, inventory.ErrNotFound)
	_, err = r.Tokens.Extend(ctx, sku, "tok-1", "", 0)
	require.ErrorIs(t, err, inventory.ErrInvalidArgument)
	_, err = r.Tokens.Extend(ctx, sku, "tok-1", "bad key", time.Hour)
	require.ErrorIs(t, err, inventory.ErrInvalidArgument)

	// Committed: its hold is over. Released: ErrReleased.
	_, err = r.Tokens.Reserve(ctx, sku, 1, "tok-3")
	require.NoError(t, err)
	_, err = r.Tokens.Commit(ctx, sku, "tok-3")
	require.NoError(t, err)
	_, err = r.Tokens.Extend(ctx, sku, "tok-3", "", time.Hour)
	require.ErrorIs(t, err, inventory.ErrConflict)
	_, err = r.Tokens.Release(ctx, sku, "tok-1")
	require.NoError(t, err)
	_, err = r.Tokens.Extend(ctx, sku, "tok-1", "k9", time.Hour)
	require.ErrorIs(t, err, tokens.ErrReleased)
	require.Equal(t, arbiter.Released, r.reservation("tok-1", sku).State)
	r.RequireQty(sku, 10, 1)
	r.CheckInvariant(sku)
}

// The sweep releases only what is due when it releases, not what was due
// when it read: a hold extended between the sweep's read and its release
// keeps its units. (Deterministic: the stale read is the arbiter's input.)
func TestSweepDoesNotReleaseAnExtendedHold(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	sku := r.PutSKU("TSW", 5, 0)
	_, err := r.Tokens.Reserve(ctx, sku, 2, "tok")
	require.NoError(t, err)
	r.Clock.Advance(testrig.TTL - time.Second)
	_, err = r.Tokens.Extend(ctx, sku, "tok", "", 10*time.Minute)
	require.NoError(t, err)
	// What a sweep that read the row before the extension does next.
	due := r.Clock.Now().Add(2 * time.Second).UTC()
	var freed arbiter.Freed
	require.NoError(t, r.DB.Transaction(func(tx *gorm.DB) error {
		freed, err = arbiter.In(tx).ReleaseDue("t.tok", sku, due)
		return err
	}))
	require.Empty(t, freed.Changes)
	require.Equal(t, arbiter.Held, r.reservation("tok", sku).State)
	r.RequireQty(sku, 5, 2)
	r.CheckInvariant(sku)
}

// Extensions race the timeout sweep on many holds, with skewed clocks: the
// extending node's says each hold has a second left, the sweeping node's
// that it ended a second ago. Each hold is either extended (and keeps its
// units) or released (and the extension is refused): never both.
func TestTokenExtensionRacesTheSweep(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	const n = 60
	sku := r.PutSKU("TRACE", 2*n, 0)
	for i := range n {
		_, err := r.Tokens.Reserve(ctx, sku, 2, fmt.Sprintf("tok-%d", i))
		require.NoError(t, err)
	}
	base := r.Clock.Now()
	slow := tokens.New(r.DB, r.Stock, r.Commits, tokens.Config{TTL: testrig.TTL,
		Now: func() time.Time { return base.Add(testrig.TTL - time.Second) }})
	fast := tokens.New(r.DB, r.Stock, r.Commits, tokens.Config{TTL: testrig.TTL,
		Now: func() time.Time { return base.Add(testrig.TTL + time.Second) }})

	ends := make([]time.Time, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	wg.Add(n + 1)
	go func() { // small batches, so reads and releases interleave with the extensions
		defer wg.Done()
		for {
			released, err := fast.ReleaseExpired(ctx, 3)
			if err != nil {
				t.Error(err)
				return
			}
			if released == 0 && r.Count(`SELECT COUNT(*) FROM stock_reservations WHERE sku = ? AND state = 'HELD' AND expires_at <= ?`,
				sku, base.Add(testrig.TTL+time.Second).UTC()) == 0 {
				return
			}
		}
	}()
	for i := range n {
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * time.Millisecond) // spread over the sweep's batches
			ends[i], errs[i] = slow.Extend(ctx, sku, fmt.Sprintf("tok-%d", i), "", 10*time.Minute)
		}()
	}
	wg.Wait()

	var held int64
	wins := [2]int{}
	for i := range n {
		res := r.reservation(fmt.Sprintf("tok-%d", i), sku)
		switch {
		case errs[i] == nil:
			wins[0]++
			held++
			require.Equal(t, arbiter.Held, res.State, "hold %d was extended: it keeps its units", i)
			require.Equal(t, ends[i], res.ExpiresAt.UTC())
		case errs[i] == tokens.ErrReleased:
			wins[1]++
			require.Equal(t, arbiter.Released, res.State, "hold %d", i)
		default:
			t.Fatalf("hold %d: extension answered %v", i, errs[i])
		}
	}
	t.Logf("extension won %d, sweep won %d", wins[0], wins[1])
	r.RequireQty(sku, 2*n, 2*held)
	r.CheckInvariant(sku)
}

// A token hold's extension is one statement: the conditional UPDATE, whose
// answer (the new end) needs no read.
func TestTokenExtensionIsOneStatement(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	sku := r.PutSKU("TXN", 5, 0)
	_, err := r.Tokens.Reserve(ctx, sku, 1, "tok")
	require.NoError(t, err)
	n := testrig.CountStatements(t, r.DB, func() {
		_, err = r.Tokens.Extend(ctx, sku, "tok", "k", time.Hour)
	})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
}
