package tokens_test

// The token API on the real MariaDB and Redis (internal/testrig): a client's
// own token names a raw reservation, which it reserves, commits or releases,
// each exactly once however many calls race, and which the timeout sweep
// releases when its hold ends.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/testrig"
	"github.com/acme/inventory/internal/tokens"
	"github.com/acme/inventory/stock"
)

// rig is one node (testrig) with the readings these tests compare.
type rig struct{ *testrig.Rig }

func newRig(t *testing.T) *rig { return &rig{testrig.New(t, testrig.MemoryTransport(t))} }

// levels is what Redis holds for sku, without initialising it.
func (s *rig) levels(sku string) stock.Levels {
	s.T.Helper()
	lv, err := s.Stock.Levels(context.Background(), sku)
	require.NoError(s.T, err)
	return lv
}

type resRow struct {
	SKU   string
	Qty   int64
	State arbiter.ResState
}

// resRows are token's reservation rows (the database's key: "t." + the
// client's token), by SKU.
func (s *rig) resRows(token string) []resRow {
	s.T.Helper()
	var rows []arbiter.Reservation
	require.NoError(s.T, s.DB.Where("token = ?", token).Order("sku").Find(&rows).Error)
	var out []resRow
	for _, r := range rows {
		out = append(out, resRow{r.SKU, r.Qty, r.State})
	}
	return out
}

// movements counts sku's movements of kind.
func (s *rig) movements(sku string, kind arbiter.MovementKind) int64 {
	s.T.Helper()
	return s.Count(`SELECT COUNT(*) FROM stock_movements WHERE sku = ? AND kind = ?`, sku, kind)
}

// qtys keeps a SKU record's quantities (seq and epoch vary).
func qtys(r arbiter.SKU) arbiter.SKU {
	return arbiter.SKU{SKU: r.SKU, OnHand: r.OnHand, Reserved: r.Reserved, PerUserLimit: r.PerUserLimit}
}

// race runs fn(i) for i in [0, n) in n goroutines released together.
func race(n int, fn func(i int)) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			fn(i)
		}()
	}
	close(start)
	wg.Wait()
}

// The token API's own semantics under races (the end of what was order's
// scenario "the token API cannot touch an order's reservation"): replays of
// a first reservation, releases racing each other and racing their own
// reservation, commits racing each other.
func TestTokenAPISemantics(t *testing.T) {
	s := newRig(t)
	ctx := context.Background()
	s.AddSKU("RAW", 10)
	s.AddSKU("PAIR", 100)
	s.StartPipeline()
	const n = 16
	errs := make([]error, n)
	vals := make([]int64, n)
	var err error

	// A first reservation racing its replays: one takes, the others see its
	// answer or "in progress".
	race(n, func(i int) { vals[i], errs[i] = s.Tokens.Reserve(ctx, "RAW", 2, "c1") })
	took := 0
	for i := range n {
		if errs[i] != nil {
			require.ErrorIs(t, errs[i], inventory.ErrConflict)
			continue
		}
		require.EqualValues(t, 8, vals[i])
		took++
	}
	require.Positive(t, took)
	require.Equal(t, []resRow{{"RAW", 2, arbiter.Held}}, s.resRows("t.c1"))
	require.EqualValues(t, arbiter.SKU{SKU: "RAW", OnHand: 10, Reserved: 2}, qtys(s.SKU("RAW")))
	require.EqualValues(t, 8, s.levels("RAW").Available)

	race(n, func(i int) { vals[i], errs[i] = s.Tokens.Reserve(ctx, "RAW", 2, "c1") })
	for i := range n {
		require.NoError(t, errs[i])
		require.EqualValues(t, 8, vals[i], "a replay returns the first result")
	}
	_, err = s.Tokens.Reserve(ctx, "RAW", 5, "c1")
	require.ErrorIs(t, err, inventory.ErrConflict, "a replay with another qty")
	require.EqualValues(t, arbiter.SKU{SKU: "RAW", OnHand: 10, Reserved: 2}, qtys(s.SKU("RAW")), "replays took nothing")
	require.EqualValues(t, 8, s.levels("RAW").Available)

	race(n, func(i int) { vals[i], errs[i] = s.Tokens.Release(ctx, "RAW", "c1") })
	var released int64
	for i := range n {
		require.NoError(t, errs[i])
		released += vals[i]
		require.Contains(t, []int64{0, 2}, vals[i])
	}
	require.EqualValues(t, 2, released, "released once")
	require.EqualValues(t, arbiter.SKU{SKU: "RAW", OnHand: 10}, qtys(s.SKU("RAW")))
	require.EqualValues(t, 10, s.levels("RAW").Available)

	_, err = s.Tokens.Reserve(ctx, "RAW", 2, "c1")
	require.ErrorIs(t, err, tokens.ErrReleased, "a deduct after its release")
	_, err = s.Tokens.Commit(ctx, "RAW", "c1")
	require.ErrorIs(t, err, tokens.ErrReleased)
	n0, err := s.Tokens.Release(ctx, "RAW", "c2") // released before it was ever reserved
	require.NoError(t, err)
	require.Zero(t, n0)
	_, err = s.Tokens.Reserve(ctx, "RAW", 1, "c2")
	require.ErrorIs(t, err, tokens.ErrReleased, "a deduct arriving after its release takes nothing")
	require.EqualValues(t, arbiter.SKU{SKU: "RAW", OnHand: 10}, qtys(s.SKU("RAW")))
	require.EqualValues(t, 10, s.levels("RAW").Available)

	// A reservation races its own release, for 16 fresh tokens: whichever
	// lands first, nothing stays held. For odd tokens the release starts once
	// Redis has admitted the reservation (its database write in flight), for
	// every fourth once the reservation returned.
	const pairs = 16
	reserved := make([]int64, pairs)
	reserveErr := make([]error, pairs)
	releasedQty := make([]int64, pairs)
	reserveDone := make([]chan struct{}, pairs)
	for k := range reserveDone {
		reserveDone[k] = make(chan struct{})
	}
	race(2*pairs, func(i int) {
		k := i / 2
		tok := fmt.Sprintf("x%d", k)
		if i%2 == 0 {
			reserved[k], reserveErr[k] = s.Tokens.Reserve(ctx, "PAIR", 1, tok)
			close(reserveDone[k])
			return
		}
		if k%4 == 0 {
			<-reserveDone[k] // and some releases come after their reservation
		}
		if k%2 == 1 {
		wait:
			for {
				if n, err := s.RDB.Exists(ctx, "inv:{PAIR}:t:t."+tok).Result(); err != nil || n == 1 {
					break
				}
				select {
				case <-reserveDone[k]:
					break wait
				default:
				}
			}
		}
		var err error
		releasedQty[i/2], err = s.Tokens.Release(ctx, "PAIR", tok)
		if err != nil {
			t.Errorf("release %s: %v", tok, err)
		}
	})
	var tookUnits, gaveBack int64
	var leaked []string // reserved, the release answered 0, the reservation stayed HELD
	for k := range pairs {
		if reserveErr[k] != nil {
			require.ErrorIs(t, reserveErr[k], tokens.ErrReleased)
			require.Zero(t, releasedQty[k])
			require.NotZero(t, k%4, "x%d: released after its reservation returned", k)
			continue
		}
		tookUnits++
		gaveBack += releasedQty[k]
		if releasedQty[k] != 1 {
			leaked = append(leaked, fmt.Sprintf("x%d: release returned %d, row %v", k, releasedQty[k], s.resRows(fmt.Sprintf("t.x%d", k))))
		}
	}
	t.Logf("reserve/release race: %d reserved first, %d released first", tookUnits, pairs-tookUnits)
	require.Empty(t, leaked, "a release racing its reservation answered 0 and left it held")
	require.Equal(t, tookUnits, gaveBack)
	require.EqualValues(t, 0, s.Count(`SELECT COUNT(*) FROM stock_reservations WHERE token LIKE 't.x%' AND sku = 'PAIR' AND state <> 'RELEASED'`))
	require.EqualValues(t, pairs, s.Count(`SELECT COUNT(*) FROM stock_reservations WHERE token LIKE 't.x%' AND sku = 'PAIR'`))
	require.EqualValues(t, arbiter.SKU{SKU: "PAIR", OnHand: 100}, qtys(s.SKU("PAIR")))
	require.EqualValues(t, 100, s.levels("PAIR").Available)
	s.CheckInvariant("PAIR")

	// Commit races itself; a committed reservation cannot be released.
	left, err := s.Tokens.Reserve(ctx, "RAW", 4, "c3")
	require.NoError(t, err)
	require.EqualValues(t, 6, left)
	race(n, func(i int) { vals[i], errs[i] = s.Tokens.Commit(ctx, "RAW", "c3") })
	for i := range n {
		if errs[i] != nil {
			require.ErrorIs(t, errs[i], inventory.ErrConflict)
			continue
		}
		require.EqualValues(t, 4, vals[i])
	}
	require.EqualValues(t, 1, s.Count(`SELECT COUNT(*) FROM stock_outbox WHERE token = 't.c3'`))
	_, err = s.Tokens.Release(ctx, "RAW", "c3")
	require.ErrorIs(t, err, inventory.ErrConflict)
	s.WaitApplied()
	_, err = s.Tokens.Release(ctx, "RAW", "c3")
	require.ErrorIs(t, err, inventory.ErrConflict, "sold")
	require.EqualValues(t, arbiter.SKU{SKU: "RAW", OnHand: 6}, qtys(s.SKU("RAW")))
	require.Equal(t, []resRow{{"RAW", 4, arbiter.Sold}}, s.resRows("t.c3"))
	s.CheckInvariant("RAW")
	require.EqualValues(t, 0, s.Count(`SELECT COUNT(*) FROM stock_anomalies`))
}

// A commit races a release of the same token reservation (a regression
// found by order's scenarios). Exactly one takes effect, and the loser must
// say so: a release that finds the reservation committed is ErrConflict ("a
// committed reservation cannot be released"), never "released 0" (a second
// release), which ReleaseToken used to answer from its stale snapshot.
func TestCommitRacesRelease(t *testing.T) {
	s := newRig(t)
	ctx := context.Background()
	s.AddSKU("CR", 1000)
	s.StartPipeline()
	const rounds = 40
	var committed, released int64
	var silentRelease []string
	for k := range rounds {
		tok := fmt.Sprintf("cr%d", k)
		_, err := s.Tokens.Reserve(ctx, "CR", 1, tok)
		require.NoError(t, err)
		var cq, rq int64
		var cerr, rerr error
		race(2, func(i int) {
			if i == 0 {
				cq, cerr = s.Tokens.Commit(ctx, "CR", tok)
			} else {
				rq, rerr = s.Tokens.Release(ctx, "CR", tok)
			}
		})
		rows := s.resRows("t." + tok)
		require.Len(t, rows, 1)
		switch rows[0].State {
		case arbiter.Committed, arbiter.Sold:
			committed++
			require.NoError(t, cerr)
			require.EqualValues(t, 1, cq)
			require.Zero(t, rq)
			if rerr == nil {
				silentRelease = append(silentRelease, tok)
				continue
			}
			require.ErrorIs(t, rerr, inventory.ErrConflict)
		case arbiter.Released:
			released++
			require.NoError(t, rerr)
			require.EqualValues(t, 1, rq)
			require.Zero(t, cq)
			if !errors.Is(cerr, tokens.ErrReleased) {
				require.ErrorIs(t, cerr, inventory.ErrConflict)
			}
		default:
			t.Fatalf("%s: %v", tok, rows[0].State)
		}
	}
	t.Logf("%d committed, %d released", committed, released)
	// The stock is right whatever the answers were.
	s.WaitApplied()
	require.EqualValues(t, committed, s.Count(`SELECT COUNT(*) FROM stock_outbox WHERE op = 'DEDUCT'`))
	require.EqualValues(t, arbiter.SKU{SKU: "CR", OnHand: 1000 - committed}, qtys(s.SKU("CR")))
	s.CheckInvariant("CR")
	// The answers.
	require.Empty(t, silentRelease, "ReleaseToken returned (0, nil) for reservations a concurrent CommitToken committed")
}

