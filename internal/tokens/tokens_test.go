package tokens_test

// The token API on the real MariaDB and Redis (testkit/testrig): a client's
// own token names a raw reservation, which it reserves, commits or releases,
// each exactly once however many calls race, and which the timeout sweep
// releases when its hold ends.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/tokens"
	"github.com/acme/inventory/stock"
	"github.com/acme/inventory/testkit/testrig"
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
	if s.IsLean() {
		s.Catch()
	}
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
	testrig.Race(n, func(i int) { vals[i], errs[i] = s.Tokens.Reserve(ctx, "RAW", 2, "c1") })
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

	testrig.Race(n, func(i int) { vals[i], errs[i] = s.Tokens.Reserve(ctx, "RAW", 2, "c1") })
	for i := range n {
		require.NoError(t, errs[i])
		require.EqualValues(t, 8, vals[i], "a replay returns the first result")
	}
	_, err = s.Tokens.Reserve(ctx, "RAW", 5, "c1")
	require.ErrorIs(t, err, inventory.ErrConflict, "a replay with another qty")
	require.EqualValues(t, arbiter.SKU{SKU: "RAW", OnHand: 10, Reserved: 2}, qtys(s.SKU("RAW")), "replays took nothing")
	require.EqualValues(t, 8, s.levels("RAW").Available)

	testrig.Race(n, func(i int) { vals[i], errs[i] = s.Tokens.Release(ctx, "RAW", "c1") })
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
	testrig.Race(2*pairs, func(i int) {
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
	testrig.Race(n, func(i int) { vals[i], errs[i] = s.Tokens.Commit(ctx, "RAW", "c3") })
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
		testrig.Race(2, func(i int) {
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

// Many callers reserve under one token at once (a client's retries racing
// each other): one admission is taken and recorded, every caller answered
// gets that first answer, the others are told it is in progress. Exactly
// the token's units are gone, in the database and in Redis.
func TestReserveRaceOneWinner(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.AddSKU("ONE", 50)
	const n = 32
	vals, errs := make([]int64, n), make([]error, n)
	testrig.Race(n, func(i int) { vals[i], errs[i] = r.Tokens.Reserve(ctx, "ONE", 3, "tok") })
	answered := 0
	for i := range n {
		if errs[i] != nil {
			require.ErrorIs(t, errs[i], inventory.ErrConflict, "in progress")
			continue
		}
		require.EqualValues(t, 47, vals[i], "the first answer")
		answered++
	}
	require.Positive(t, answered)
	require.Equal(t, []resRow{{"ONE", 3, arbiter.Held}}, r.resRows("t.tok"))
	r.RequireQty("ONE", 50, 3)
	require.EqualValues(t, 47, r.levels("ONE").Available)
	require.EqualValues(t, 1, r.movements("ONE", arbiter.MoveReserve))

	// Once the first is recorded every replay is answered, and takes nothing.
	testrig.Race(n, func(i int) { vals[i], errs[i] = r.Tokens.Reserve(ctx, "ONE", 3, "tok") })
	for i := range n {
		require.NoError(t, errs[i])
		require.EqualValues(t, 47, vals[i])
	}
	r.RequireQty("ONE", 50, 3)
	require.EqualValues(t, 47, r.levels("ONE").Available)
	r.CheckInvariant("ONE")
}

// More tokens than units race for a SKU: exactly as many win as there are
// units, each answered with a distinct remainder, and the rest are refused
// without a row.
func TestReserveScarceStockExactWinners(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.AddSKU("FEW", 10)
	const n = 40
	vals, errs := make([]int64, n), make([]error, n)
	testrig.Race(n, func(i int) { vals[i], errs[i] = r.Tokens.Reserve(ctx, "FEW", 1, fmt.Sprintf("k%d", i)) })
	var left []int64
	for i := range n {
		if errs[i] != nil {
			require.ErrorIs(t, errs[i], inventory.ErrInsufficientStock)
			require.Empty(t, r.resRows(fmt.Sprintf("t.k%d", i)), "a refused token has no row")
			continue
		}
		left = append(left, vals[i])
		require.Equal(t, []resRow{{"FEW", 1, arbiter.Held}}, r.resRows(fmt.Sprintf("t.k%d", i)))
	}
	require.ElementsMatch(t, []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, left, "ten winners, each took one of the ten units")
	r.RequireQty("FEW", 10, 10)
	require.Zero(t, r.levels("FEW").Available)
	require.EqualValues(t, 10, r.movements("FEW", arbiter.MoveReserve))
	r.CheckInvariant("FEW")
}

// Many callers commit one held token at once: one sale is queued (one
// DEDUCT outbox row), every caller is told the quantity or a conflict, and
// the sale is applied once.
func TestCommitRaceOneWinner(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.AddSKU("C", 20)
	left, err := r.Tokens.Reserve(ctx, "C", 5, "tok")
	require.NoError(t, err)
	require.EqualValues(t, 15, left)

	const n = 32
	vals, errs := make([]int64, n), make([]error, n)
	testrig.Race(n, func(i int) { vals[i], errs[i] = r.Tokens.Commit(ctx, "C", "tok") })
	committed := 0
	for i := range n {
		if errs[i] != nil {
			require.ErrorIs(t, errs[i], inventory.ErrConflict)
			continue
		}
		require.EqualValues(t, 5, vals[i])
		committed++
	}
	require.Positive(t, committed)
	require.Equal(t, []arbiter.StockMessage{{Token: "t.tok", SKU: "C", Op: arbiter.OpDeduct, Qty: 5}}, r.Outbox(), "one sale queued")
	require.Equal(t, []resRow{{"C", 5, arbiter.Committed}}, r.resRows("t.tok"))
	r.RequireQty("C", 20, 5)
	require.EqualValues(t, 15, r.levels("C").Available)

	r.StartPipeline()
	r.WaitApplied()
	require.Equal(t, []resRow{{"C", 5, arbiter.Sold}}, r.resRows("t.tok"))
	r.RequireQty("C", 15, 0)
	require.EqualValues(t, 1, r.Count(`SELECT COUNT(*) FROM stock_ledger WHERE token = 't.tok'`))
	require.EqualValues(t, 15, r.levels("C").Available, "a sale moves on_hand and reserved together")

	// A sold reservation: a commit is answered again, a release is refused,
	// a reservation's replay gets the first answer.
	q, err := r.Tokens.Commit(ctx, "C", "tok")
	require.NoError(t, err)
	require.EqualValues(t, 5, q)
	_, err = r.Tokens.Release(ctx, "C", "tok")
	require.ErrorIs(t, err, inventory.ErrConflict)
	left, err = r.Tokens.Reserve(ctx, "C", 5, "tok")
	require.NoError(t, err)
	require.EqualValues(t, 15, left)
	require.Len(t, r.Outbox(), 1)
	r.RequireQty("C", 15, 0)
	r.CheckInvariant("C")
}

// Many callers release one held token at once: one gives the units back
// (it answers the quantity, the others 0), once in the database and once
// in Redis; the token can take nothing after.
func TestReleaseRaceOneWinner(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.AddSKU("R", 20)
	left, err := r.Tokens.Reserve(ctx, "R", 4, "tok")
	require.NoError(t, err)
	require.EqualValues(t, 16, left)

	const n = 32
	vals, errs := make([]int64, n), make([]error, n)
	testrig.Race(n, func(i int) { vals[i], errs[i] = r.Tokens.Release(ctx, "R", "tok") })
	winners := 0
	for i := range n {
		require.NoError(t, errs[i])
		switch vals[i] {
		case 4:
			winners++
		case 0:
		default:
			t.Fatalf("release %d answered %d", i, vals[i])
		}
	}
	require.Equal(t, 1, winners, "one release gave the units back")
	require.Equal(t, []resRow{{"R", 4, arbiter.Released}}, r.resRows("t.tok"))
	r.RequireQty("R", 20, 0)
	require.EqualValues(t, 20, r.levels("R").Available, "Redis got the units back once")
	require.EqualValues(t, 1, r.movements("R", arbiter.MoveRelease))

	_, err = r.Tokens.Reserve(ctx, "R", 4, "tok")
	require.ErrorIs(t, err, tokens.ErrReleased)
	_, err = r.Tokens.Commit(ctx, "R", "tok")
	require.ErrorIs(t, err, tokens.ErrReleased)
	require.Empty(t, r.Outbox())
	r.RequireQty("R", 20, 0)
	require.EqualValues(t, 20, r.levels("R").Available)
	r.CheckInvariant("R")
}

// Replays: the same quantity gets the first answer (whatever Redis holds
// now, and whatever the reservation became since), another quantity is a
// conflict, and after a release nothing: ErrReleased. Redis forgetting the
// tokens (losing every key) changes none of it: the database remembers, and
// the admission a replay takes again is given back.
func TestReplaySemantics(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.AddSKU("RP", 10)
	reserve := func(qty int64, token string) (int64, error) { return r.Tokens.Reserve(ctx, "RP", qty, token) }

	left, err := reserve(2, "a")
	require.NoError(t, err)
	require.EqualValues(t, 8, left)
	left, err = reserve(3, "b")
	require.NoError(t, err)
	require.EqualValues(t, 5, left)
	left, err = reserve(2, "a")
	require.NoError(t, err)
	require.EqualValues(t, 8, left, "the first answer, not what Redis holds now")
	_, err = reserve(1, "a")
	require.ErrorIs(t, err, inventory.ErrConflict)
	_, err = reserve(3, "a")
	require.ErrorIs(t, err, inventory.ErrConflict)
	r.RequireQty("RP", 10, 5)
	require.EqualValues(t, 5, r.levels("RP").Available)

	n, err := r.Tokens.Release(ctx, "RP", "a")
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	for _, q := range []int64{2, 7} {
		_, err = reserve(q, "a")
		require.ErrorIs(t, err, tokens.ErrReleased, "qty %d after the release", q)
	}
	q, err := r.Tokens.Commit(ctx, "RP", "b")
	require.NoError(t, err)
	require.EqualValues(t, 3, q)
	left, err = reserve(3, "b")
	require.NoError(t, err)
	require.EqualValues(t, 5, left, "a committed reservation's replay: the first answer")
	_, err = reserve(4, "b")
	require.ErrorIs(t, err, inventory.ErrConflict)
	r.RequireQty("RP", 10, 3)
	require.EqualValues(t, 7, r.levels("RP").Available)

	// Redis loses every key, the remembered tokens with them.
	require.NoError(t, r.RDB.FlushDB(ctx).Err())
	left, err = reserve(3, "b")
	require.NoError(t, err)
	require.EqualValues(t, 5, left)
	_, err = reserve(4, "b")
	require.ErrorIs(t, err, inventory.ErrConflict)
	for _, q := range []int64{2, 1} {
		_, err = reserve(q, "a")
		require.ErrorIs(t, err, tokens.ErrReleased)
	}
	require.EqualValues(t, 7, r.levels("RP").Available, "the re-taken admissions were given back")
	r.RequireQty("RP", 10, 3)
	require.Equal(t, []resRow{{"RP", 2, arbiter.Released}}, r.resRows("t.a"))
	require.Equal(t, []resRow{{"RP", 3, arbiter.Committed}}, r.resRows("t.b"))
	require.EqualValues(t, 2, r.movements("RP", arbiter.MoveReserve))
	require.EqualValues(t, 1, r.movements("RP", arbiter.MoveRelease))
	require.Len(t, r.Outbox(), 1)
	r.CheckInvariant("RP")
}

// The timeout sweep releases exactly the token holds past their deadline,
// oldest first and at most limit of them: not a hold still in time, not a
// committed one, not an order's (orders expire through the order
// lifecycle); each once.
func TestReleaseExpiredReleasesExactlyTheExpired(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.AddSKU("EXP", 30)
	reserve := func(qty int64, token string) {
		t.Helper()
		_, err := r.Tokens.Reserve(ctx, "EXP", qty, token)
		require.NoError(t, err)
	}
	reserve(1, "a") // deadline T+15m
	reserve(4, "d") // committed below
	_, err := r.Tokens.Commit(ctx, "EXP", "d")
	require.NoError(t, err)
	o, err := r.Orders.Create(ctx, "u", "", testrig.Line("EXP", 5)) // an order's hold, deadline T+15m
	require.NoError(t, err)
	r.Clock.Advance(time.Minute)
	reserve(2, "b") // deadline T+16m
	r.Clock.Advance(9 * time.Minute)
	reserve(3, "c") // deadline T+25m
	r.RequireQty("EXP", 30, 15)
	require.EqualValues(t, 15, r.levels("EXP").Available)

	n, err := r.Tokens.ReleaseExpired(ctx, 100)
	require.NoError(t, err)
	require.Zero(t, n, "nothing is past its deadline at T+10m")

	r.Clock.Advance(6 * time.Minute) // T+16m: a and b are due
	n, err = r.Tokens.ReleaseExpired(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, arbiter.Released, r.ReservationState("t.a", "EXP"), "the oldest deadline first")
	require.Equal(t, arbiter.Held, r.ReservationState("t.b", "EXP"))
	n, err = r.Tokens.ReleaseExpired(ctx, 100)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = r.Tokens.ReleaseExpired(ctx, 100)
	require.NoError(t, err)
	require.Zero(t, n, "each once")
	for token, want := range map[string]arbiter.ResState{"t.a": arbiter.Released, "t.b": arbiter.Released,
		"t.c": arbiter.Held, "t.d": arbiter.Committed, o.ID: arbiter.Held} {
		require.Equal(t, want, r.ReservationState(token, "EXP"), token)
	}
	r.RequireQty("EXP", 30, 12) // c 3, d 4, the order 5
	require.EqualValues(t, 18, r.levels("EXP").Available)
	_, err = r.Tokens.Reserve(ctx, "EXP", 1, "a")
	require.ErrorIs(t, err, tokens.ErrReleased, "an expired token takes nothing")

	r.Clock.Advance(9 * time.Minute) // T+25m: c is due
	n, err = r.Tokens.ReleaseExpired(ctx, 100)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, arbiter.Released, r.ReservationState("t.c", "EXP"))
	require.Equal(t, arbiter.Held, r.ReservationState(o.ID, "EXP"))
	r.RequireQty("EXP", 30, 9)
	require.EqualValues(t, 21, r.levels("EXP").Available)
	var refs []string
	require.NoError(t, r.DB.Raw(`SELECT reference FROM stock_movements WHERE sku = 'EXP' AND kind = 'RELEASE' ORDER BY id`).
		Scan(&refs).Error)
	require.Equal(t, []string{"token:a", "token:b", "token:c"}, refs, "one RELEASE per expired hold")
	r.CheckInvariant("EXP")
}

// Sweeps on many nodes race each other and the clients' commits over the
// same expired holds: each hold ends exactly once, committed (a sale
// queued, the sweep leaves it) or released (by one sweep), and the sweeps'
// counts add up to the releases.
func TestReleaseExpiredRacesSweepsAndCommits(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	const holds = 24
	r.AddSKU("SW", 100)
	for k := range holds {
		_, err := r.Tokens.Reserve(ctx, "SW", 2, fmt.Sprintf("h%d", k))
		require.NoError(t, err)
	}
	r.Clock.Advance(tokensTTL + time.Second)

	var swept atomic.Int64
	commitErr := make([]error, holds)
	testrig.Race(8+holds/2, func(i int) {
		if i < 8 {
			n, err := r.Tokens.ReleaseExpired(ctx, 100)
			if err != nil {
				t.Errorf("sweep: %v", err)
			}
			swept.Add(int64(n))
			return
		}
		k := 2 * (i - 8) // every other hold's client commits
		_, commitErr[k] = r.Tokens.Commit(ctx, "SW", fmt.Sprintf("h%d", k))
	})
	var committed, released int64
	for k := range holds {
		tok := fmt.Sprintf("t.h%d", k)
		switch st := r.ReservationState(tok, "SW"); st {
		case arbiter.Committed:
			committed++
			require.NoError(t, commitErr[k], tok)
		case arbiter.Released:
			released++
			if k%2 == 0 && !errors.Is(commitErr[k], tokens.ErrReleased) {
				require.ErrorIs(t, commitErr[k], inventory.ErrConflict, tok)
			}
		default:
			t.Fatalf("%s is %s", tok, st)
		}
	}
	t.Logf("%d committed, %d released", committed, released)
	require.Equal(t, released, swept.Load(), "the sweeps counted each release once")
	require.EqualValues(t, holds, committed+released)
	require.EqualValues(t, committed, r.Count(`SELECT COUNT(*) FROM stock_outbox WHERE op = 'DEDUCT'`))
	require.Equal(t, released, r.movements("SW", arbiter.MoveRelease))
	r.RequireQty("SW", 100, 2*committed)
	require.EqualValues(t, 100-2*committed, r.levels("SW").Available)
	n, err := r.Tokens.ReleaseExpired(ctx, 100)
	require.NoError(t, err)
	require.Zero(t, n)
	r.CheckInvariant("SW")
}

// tokensTTL is how long the rig's token reservations hold.
const tokensTTL = testrig.TTL

// Names are exact and checked: a SKU spelled in another case is another
// (unknown) SKU for every call; a token differing in case is another
// reservation; malformed arguments are refused before anything is taken.
func TestTokenArguments(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	sku := r.PutSKU("Phone-X", 10, 0)
	for _, v := range []string{strings.ToLower(sku), strings.ToUpper(sku)} {
		_, err := r.Tokens.Reserve(ctx, v, 1, "tok")
		require.ErrorIs(t, err, inventory.ErrUnknownSKU, v)
		_, err = r.Tokens.Release(ctx, v, "tok")
		require.ErrorIs(t, err, inventory.ErrUnknownSKU, v)
		_, err = r.Tokens.Commit(ctx, v, "tok")
		require.ErrorIs(t, err, inventory.ErrNotFound, v)
	}
	for _, bad := range []struct {
		sku, token string
		qty        int64
	}{
		{sku, "", 1}, {sku, "a b", 1}, {sku, strings.Repeat("t", 129), 1}, {sku, "tok", 0}, {sku, "tok", -1},
		{sku, "tok", inventory.DefaultMaxQty + 1}, {"", "tok", 1}, {"A{b}", "tok", 1},
	} {
		_, err := r.Tokens.Reserve(ctx, bad.sku, bad.qty, bad.token)
		require.ErrorIs(t, err, inventory.ErrInvalidArgument, "%+v", bad)
		if bad.qty == 1 {
			_, err = r.Tokens.Release(ctx, bad.sku, bad.token)
			require.ErrorIs(t, err, inventory.ErrInvalidArgument, "%+v", bad)
			_, err = r.Tokens.Commit(ctx, bad.sku, bad.token)
			require.ErrorIs(t, err, inventory.ErrInvalidArgument, "%+v", bad)
		}
	}
	require.Zero(t, r.Count(`SELECT COUNT(*) FROM stock_reservations`), "nothing was recorded")
	require.EqualValues(t, 10, r.levels(sku).Available)

	left, err := r.Tokens.Reserve(ctx, sku, 1, "Cart-1")
	require.NoError(t, err)
	require.EqualValues(t, 9, left)
	left, err = r.Tokens.Reserve(ctx, sku, 2, "cart-1")
	require.NoError(t, err, "another token, not a replay with another quantity")
	require.EqualValues(t, 7, left)
	q, err := r.Tokens.Commit(ctx, sku, "cart-1")
	require.NoError(t, err)
	require.EqualValues(t, 2, q)
	require.Equal(t, []resRow{{sku, 1, arbiter.Held}}, r.resRows("t.Cart-1"))
	require.Equal(t, []resRow{{sku, 2, arbiter.Committed}}, r.resRows("t.cart-1"))
	q, err = r.Tokens.Release(ctx, sku, "Cart-1")
	require.NoError(t, err)
	require.EqualValues(t, 1, q)
	r.RequireQty(sku, 10, 2)
	require.EqualValues(t, 8, r.levels(sku).Available)
	r.CheckInvariant(sku)
}

// TestEmbeddedContract runs the token API's tests again on the embedded
// default's stand-ins (SQLite, miniredis, the in-process queue).
func TestEmbeddedContract(t *testing.T) {
	testrig.RunEmbedded(t,
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
		TestTokenArguments,
		TestLeanContract,
	)
}
