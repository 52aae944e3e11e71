package arbiter_test

// The arbiter's statements, each inside a transaction (arbiter.In(tx) in
// db.Transaction, as every caller uses them), on the real MariaDB: what
// each writes, what each refuses, and that a refused transaction leaves
// nothing; raced with many goroutines where a claim is about concurrency.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/testkit/testrig"
)

// stmts is a rig with each arbiter statement run in a transaction of its own.
type stmts struct{ *testrig.Rig }

func newStmts(t *testing.T) *stmts { return &stmts{testrig.New(t, testrig.MemoryTransport(t))} }

// in runs fn on the arbiter of one transaction (arbiter.Transact: run again
// when the database rolled it back as a deadlock victim); fn's error rolls
// everything back.
func (s *stmts) in(fn func(a arbiter.Arbiter) error) error {
	return arbiter.Transact(context.Background(), s.DB, func(tx *gorm.DB) error { return fn(arbiter.In(tx)) })
}

// put creates sku (or sets it) through the arbiter.
func (s *stmts) put(sku string, onHand, limit int64) {
	s.T.Helper()
	require.NoError(s.T, s.in(func(a arbiter.Arbiter) error {
		return a.Set(sku, arbiter.Settings{OnHand: onHand, PerUserLimit: limit}, nil)
	}))
}

var stamp = time.Now().UTC().Truncate(time.Microsecond)

// hold is a HELD reservation of qty of sku under token, for no buyer.
func hold(token, sku string, qty int64) arbiter.Hold { return holdBy(token, sku, qty, "") }

// holdBy is hold counting against buyer.
func holdBy(token, sku string, qty int64, buyer string) arbiter.Hold {
	return arbiter.Hold{Row: arbiter.Reservation{Token: token, SKU: sku, Qty: qty, State: arbiter.Held,
		ExpiresAt: stamp.Add(time.Hour), CreatedAt: stamp, UpdatedAt: stamp}, Buyer: buyer}
}

func (s *stmts) reserve(holds ...arbiter.Hold) (map[string]arbiter.Fence, error) {
	var fences map[string]arbiter.Fence
	err := s.in(func(a arbiter.Arbiter) error {
		var err error
		fences, err = a.Reserve(holds)
		return err
	})
	return fences, err
}

func (s *stmts) release(token, sku string) arbiter.Freed {
	s.T.Helper()
	var freed arbiter.Freed
	require.NoError(s.T, s.in(func(a arbiter.Arbiter) error {
		var err error
		freed, err = a.Release(token, sku)
		return err
	}))
	return freed
}

func (s *stmts) commit(token string, lines ...inventory.Line) error {
	return s.in(func(a arbiter.Arbiter) error { return a.Commit(token, lines) })
}

type row struct {
	SKU   string
	Qty   int64
	State arbiter.ResState
	Buyer string
}

// rows are token's reservations, by SKU.
func (s *stmts) rows(token string) []row {
	s.T.Helper()
	var rs []arbiter.Reservation
	require.NoError(s.T, s.DB.Where("token = ?", token).Order("sku").Find(&rs).Error)
	var out []row
	for _, r := range rs {
		b := ""
		if r.Buyer != nil {
			b = *r.Buyer
		}
		out = append(out, row{r.SKU, r.Qty, r.State, b})
	}
	return out
}

// moves are sku's movements as [kind, on_hand delta, reserved delta], in order.
func (s *stmts) moves(sku string) []string {
	s.T.Helper()
	var ms []arbiter.Movement
	require.NoError(s.T, s.DB.Where("sku = ?", sku).Order("id").Find(&ms).Error)
	out := []string{}
	for _, m := range ms {
		out = append(out, fmt.Sprintf("%s %+d %+d", m.Kind, m.OnHandDelta, m.ReservedDelta))
	}
	return out
}

// Reserve takes what on_hand - reserved covers and refuses the rest
// (RefusedError), exactly up to on_hand; a refused transaction, a cart's
// other lines with it, writes nothing. An unlimited SKU is never refused; a
// SKU with no record is unknown.
func TestReserveRefusesPastOnHand(t *testing.T) {
	s := newStmts(t)
	s.put("A", 5, 0)
	s.put("B", 5, 0)
	s.put("U", inventory.Unlimited, 0)

	fences, err := s.reserve(hold("t1", "A", 3))
	require.NoError(t, err)
	rec := s.SKU("A")
	require.Equal(t, map[string]arbiter.Fence{"A": {Seq: rec.Seq, Epoch: rec.RedisEpoch}}, fences, "the fence after the write")
	s.RequireQty("A", 5, 3)

	_, err = s.reserve(hold("t2", "A", 3))
	require.Equal(t, arbiter.RefusedError{SKU: "A"}, err)
	_, err = s.reserve(hold("t3", "B", 2), hold("t3", "A", 3))
	require.Equal(t, arbiter.RefusedError{SKU: "A"}, err)
	require.Empty(t, s.rows("t2"))
	require.Empty(t, s.rows("t3"), "the cart's line of B went with it")
	s.RequireQty("A", 5, 3)
	s.RequireQty("B", 5, 0)
	require.Equal(t, rec.Seq, s.SKU("A").Seq)
	require.Equal(t, []string{"SET +5 +0", "RESERVE +0 +3"}, s.moves("A"))
	require.Equal(t, []string{"SET +5 +0"}, s.moves("B"))

	_, err = s.reserve(hold("t4", "A", 2), hold("t4", "B", 5))
	require.NoError(t, err, "exactly what is left")
	s.RequireQty("A", 5, 5)
	s.RequireQty("B", 5, 5)
	require.Equal(t, []row{{"A", 2, arbiter.Held, ""}, {"B", 5, arbiter.Held, ""}}, s.rows("t4"))

	_, err = s.reserve(hold("t5", "U", 1_000_000))
	require.NoError(t, err)
	s.RequireQty("U", inventory.Unlimited, 1_000_000)
	_, err = s.reserve(hold("t6", "NOPE", 1))
	require.ErrorIs(t, err, inventory.ErrUnknownSKU)
	require.Empty(t, s.rows("t6"))
	require.Empty(t, s.moves("NOPE"))
}

// Many transactions reserve one unit each of a SKU at once: exactly on_hand
// of them commit, every other is refused, and nothing is oversold.
func TestReserveRaceNeverOversells(t *testing.T) {
	s := newStmts(t)
	s.put("HOT", 10, 0)
	const n = 40
	errs := make([]error, n)
	testrig.Race(n, func(i int) { _, errs[i] = s.reserve(hold(fmt.Sprintf("k%d", i), "HOT", 1)) })
	won := 0
	for i := range n {
		if errs[i] == nil {
			won++
			continue
		}
		require.Equal(t, arbiter.RefusedError{SKU: "HOT"}, errs[i])
		require.Empty(t, s.rows(fmt.Sprintf("k%d", i)))
	}
	require.Equal(t, 10, won)
	s.RequireQty("HOT", 10, 10)
	require.EqualValues(t, 10, s.Count(`SELECT COUNT(*) FROM stock_reservations WHERE sku = 'HOT'`))
	require.Equal(t, [2]int64{10, 10}, s.MovementSums("HOT"))
}

// A buyer's holds of a SKU with a per-user limit count in buyer_quotas, in
// the reservation's transaction: past the limit, OverLimitError (a
// conflict) and nothing written. Holds without a buyer (the token API) and
// SKUs without a limit do not count; a release gives the units back.
func TestReservePerUserQuota(t *testing.T) {
	s := newStmts(t)
	s.put("L", 10, 2)
	s.put("N", 10, 0)

	_, err := s.reserve(holdBy("a", "L", 2, "u"))
	require.NoError(t, err)
	require.EqualValues(t, 2, s.Quota("L", "u"))
	require.Equal(t, []row{{"L", 2, arbiter.Held, "u"}}, s.rows("a"))

	_, err = s.reserve(holdBy("b", "L", 1, "u"))
	require.Equal(t, arbiter.OverLimitError{SKU: "L", User: "u", Limit: 2}, err)
	require.ErrorIs(t, err, inventory.ErrConflict)
	_, err = s.reserve(holdBy("c", "L", 3, "v"))
	require.Equal(t, arbiter.OverLimitError{SKU: "L", User: "v", Limit: 2}, err, "more than the limit at once")
	_, err = s.reserve(holdBy("d", "L", 1, "w"), holdBy("d2", "L", 2, "w"))
	require.Equal(t, arbiter.OverLimitError{SKU: "L", User: "w", Limit: 2}, err, "one buyer's holds count together")
	for _, tok := range []string{"b", "c", "d", "d2"} {
		require.Empty(t, s.rows(tok))
	}
	require.EqualValues(t, 2, s.Quota("L", "u"))
	require.Zero(t, s.Count(`SELECT COUNT(*) FROM buyer_quotas WHERE user_id IN ('v', 'w')`), "a refused first purchase leaves no quota row")
	s.RequireQty("L", 10, 2)

	_, err = s.reserve(hold("e", "L", 3))
	require.NoError(t, err, "no buyer: the token API")
	_, err = s.reserve(holdBy("f", "N", 5, "u"))
	require.NoError(t, err, "no limit on N")
	require.Equal(t, []row{{"N", 5, arbiter.Held, ""}}, s.rows("f"), "a reservation of a SKU without a limit counts against nobody")
	require.Zero(t, s.Count(`SELECT COUNT(*) FROM buyer_quotas WHERE sku = 'N'`))

	freed := s.release("a", "")
	require.Equal(t, []arbiter.BuyerUnits{{SKU: "L", User: "u", Qty: 2}}, freed.Quotas)
	require.Zero(t, s.Quota("L", "u"))
	_, err = s.reserve(holdBy("g", "L", 2, "u"))
	require.NoError(t, err, "the units given back can be bought again")
	require.EqualValues(t, 2, s.Quota("L", "u"))
	s.RequireQty("L", 10, 5)
}

// One buyer's reservations race under a limit of 3: exactly three commit.
func TestReservePerUserQuotaRace(t *testing.T) {
	s := newStmts(t)
	s.put("Q", 100, 3)
	const n = 24
	errs := make([]error, n)
	testrig.Race(n, func(i int) { _, errs[i] = s.reserve(holdBy(fmt.Sprintf("q%d", i), "Q", 1, "u")) })
	won := 0
	for i := range n {
		if errs[i] == nil {
			won++
			continue
		}
		require.Equal(t, arbiter.OverLimitError{SKU: "Q", User: "u", Limit: 3}, errs[i])
	}
	require.Equal(t, 3, won)
	require.EqualValues(t, 3, s.Quota("Q", "u"))
	s.RequireQty("Q", 100, 3)
	require.EqualValues(t, 3, s.Count(`SELECT COUNT(*) FROM stock_reservations WHERE sku = 'Q'`))
}

// Release gives a token's HELD units back once: reserved, a RELEASE
// movement each, and the changes for Redis at the SKUs' new fences; a
// second release gives nothing. Only the named SKU with one; a reservation
// that is not HELD is left alone.
func TestReleaseGivesBackOnce(t *testing.T) {
	s := newStmts(t)
	s.put("A", 10, 0)
	s.put("B", 10, 0)
	_, err := s.reserve(hold("t", "A", 2), hold("t", "B", 3))
	require.NoError(t, err)

	freed := s.release("t", "")
	a, b := s.SKU("A"), s.SKU("B")
	require.Equal(t, arbiter.Freed{
		Changes: []inventory.Change{{SKU: "A", Delta: 2, Seq: a.Seq}, {SKU: "B", Delta: 3, Seq: b.Seq}},
		Units:   map[string]int64{"A": 2, "B": 3},
	}, freed)
	require.Equal(t, arbiter.Freed{Units: map[string]int64{}}, s.release("t", ""), "released before: nothing")
	require.Equal(t, []row{{"A", 2, arbiter.Released, ""}, {"B", 3, arbiter.Released, ""}}, s.rows("t"))
	s.RequireQty("A", 10, 0)
	s.RequireQty("B", 10, 0)
	require.Equal(t, []string{"SET +10 +0", "RESERVE +0 +2", "RELEASE +0 -2"}, s.moves("A"))
	require.Equal(t, a.Seq, s.SKU("A").Seq, "a release that gave nothing moves no seq")

	_, err = s.reserve(hold("u", "A", 1), hold("u", "B", 1))
	require.NoError(t, err)
	require.NoError(t, s.commit("u", inventory.Line{SKU: "A", Qty: 1}))
	require.Equal(t, map[string]int64{"B": 1}, s.release("u", "B").Units)
	require.Equal(t, map[string]int64{}, s.release("u", "").Units, "COMMITTED is not released")
	require.Equal(t, []row{{"A", 1, arbiter.Committed, ""}, {"B", 1, arbiter.Released, ""}}, s.rows("u"))
	s.RequireQty("A", 10, 1)
	s.RequireQty("B", 10, 0)
}

// Many transactions release one reservation at once: one gives the units
// back, the others nothing.
func TestReleaseRaceGivesBackOnce(t *testing.T) {
	s := newStmts(t)
	s.put("A", 10, 4)
	_, err := s.reserve(holdBy("t", "A", 4, "u"))
	require.NoError(t, err)
	const n = 16
	got := make([]arbiter.Freed, n)
	testrig.Race(n, func(i int) { got[i] = s.release("t", "") })
	var units int64
	givers := 0
	for i := range n {
		if len(got[i].Changes) > 0 {
			givers++
			require.Equal(t, []arbiter.BuyerUnits{{SKU: "A", User: "u", Qty: 4}}, got[i].Quotas)
		}
		units += got[i].Units["A"]
	}
	require.Equal(t, 1, givers)
	require.EqualValues(t, 4, units)
	s.RequireQty("A", 10, 0)
	require.Zero(t, s.Quota("A", "u"))
	require.Equal(t, []string{"SET +10 +0", "RESERVE +0 +4", "RELEASE +0 -4"}, s.moves("A"))
}

// Commit turns HELD reservations COMMITTED and queues one DEDUCT per line;
// every line must have been HELD, or nothing commits (ErrConflict).
func TestCommitRequiresHeld(t *testing.T) {
	s := newStmts(t)
	s.put("A", 10, 0)
	s.put("B", 10, 0)
	_, err := s.reserve(hold("t", "A", 2), hold("t", "B", 1))
	require.NoError(t, err)
	require.NoError(t, s.commit("t", inventory.Line{SKU: "A", Qty: 2}, inventory.Line{SKU: "B", Qty: 1}))
	require.Equal(t, []row{{"A", 2, arbiter.Committed, ""}, {"B", 1, arbiter.Committed, ""}}, s.rows("t"))
	deducts := []arbiter.StockMessage{{Token: "t", SKU: "A", Op: arbiter.OpDeduct, Qty: 2}, {Token: "t", SKU: "B", Op: arbiter.OpDeduct, Qty: 1}}
	require.Equal(t, deducts, s.Outbox())
	s.RequireQty("A", 10, 2)

	err = s.commit("t", inventory.Line{SKU: "A", Qty: 2})
	require.ErrorIs(t, err, inventory.ErrConflict)
	require.EqualError(t, err, "inventory: conflict: 0 of 1 reservations of t were held")

	_, err = s.reserve(hold("r", "A", 1))
	require.NoError(t, err)
	s.release("r", "")
	require.ErrorIs(t, s.commit("r", inventory.Line{SKU: "A", Qty: 1}), inventory.ErrConflict, "released")

	_, err = s.reserve(hold("p", "A", 1))
	require.NoError(t, err)
	err = s.commit("p", inventory.Line{SKU: "A", Qty: 1}, inventory.Line{SKU: "B", Qty: 1})
	require.EqualError(t, err, "inventory: conflict: 1 of 2 reservations of p were held")
	require.Equal(t, []row{{"A", 1, arbiter.Held, ""}}, s.rows("p"), "the held line did not commit alone")
	require.ErrorIs(t, s.commit("never", inventory.Line{SKU: "A", Qty: 1}), inventory.ErrConflict)
	require.Equal(t, deducts, s.Outbox(), "no refused commit queued a deduction")
	s.RequireQty("A", 10, 3)
}

// A tombstone (a release that came before its reservation) takes the
// reservation's key: the later reservation collides with it and writes
// nothing; the tombstone gives nothing back.
func TestTombstoneCollidesWithALaterReservation(t *testing.T) {
	s := newStmts(t)
	s.put("A", 10, 0)
	s.put("B", 10, 0)
	tomb := func(token, sku string) error {
		return s.in(func(a arbiter.Arbiter) error {
			return a.Tombstone(token, sku, arbiter.Reservation{Qty: 5, State: arbiter.Held, ExpiresAt: stamp, CreatedAt: stamp, UpdatedAt: stamp})
		})
	}
	require.NoError(t, tomb("t", "A"))
	require.Equal(t, []row{{"A", 0, arbiter.Released, ""}}, s.rows("t"), "released, of nothing")

	_, err := s.reserve(hold("t", "A", 2))
	require.True(t, arbiter.IsDuplicate(err), "%v", err)
	require.Equal(t, []row{{"A", 0, arbiter.Released, ""}}, s.rows("t"))
	s.RequireQty("A", 10, 0)
	require.Equal(t, []string{"SET +10 +0"}, s.moves("A"))
	require.True(t, arbiter.IsDuplicate(tomb("t", "A")))
	require.Equal(t, arbiter.Freed{Units: map[string]int64{}}, s.release("t", ""))

	_, err = s.reserve(hold("t", "B", 1))
	require.NoError(t, err, "the tombstone is of A only")
	s.RequireQty("B", 10, 1)
}

// Set creates a SKU with its stock (a SET movement of it), sets on_hand
// (a SET movement of the change; none when only the limit moves) never
// below what is reserved, and checks the caller's version if given.
func TestSet(t *testing.T) {
	s := newStmts(t)
	set := func(sku string, onHand, limit int64, ifMatch ...string) error {
		return s.in(func(a arbiter.Arbiter) error {
			return a.Set(sku, arbiter.Settings{OnHand: onHand, PerUserLimit: limit}, ifMatch)
		})
	}
	require.NoError(t, set("S", 10, 2))
	require.Equal(t, arbiter.SKU{SKU: "S", OnHand: 10, PerUserLimit: 2}, s.SKU("S"))
	seq := s.SKU("S").Seq
	require.NoError(t, set("S", 10, 5))
	require.Equal(t, arbiter.SKU{SKU: "S", OnHand: 10, PerUserLimit: 5, Seq: seq + 1}, s.SKU("S"))
	require.NoError(t, set("S", 7, 5))
	require.Equal(t, []string{"SET +10 +0", "SET -3 +0"}, s.moves("S"))

	_, err := s.reserve(hold("t", "S", 4))
	require.NoError(t, err)
	err = set("S", 3, 5)
	require.ErrorIs(t, err, inventory.ErrConflict)
	require.EqualError(t, err, "inventory: conflict: 4 units are reserved; stock cannot go to 3")
	require.NoError(t, set("S", 4, 5), "down to what is reserved")
	require.NoError(t, set("S", inventory.Unlimited, 0))
	s.RequireQty("S", inventory.Unlimited, 4)
	require.Equal(t, [2]int64{-1, 4}, s.MovementSums("S"), "the movements sum to on_hand and reserved")

	require.ErrorIs(t, set("S", 8, 0, "4.5"), inventory.ErrPrecondition)
	require.NoError(t, set("S", 8, 0, "7.0", "-1.0"))
	require.NoError(t, set("S", 9, 0, arbiter.AnyVersion))
	require.ErrorIs(t, set("NEW", 1, 0, arbiter.AnyVersion), inventory.ErrPrecondition)
	require.Zero(t, s.Count(`SELECT COUNT(*) FROM skus WHERE sku = 'NEW'`))
	require.Equal(t, [2]int64{9, 4}, s.MovementSums("S"))
}

// Many transactions set one new SKU at once: each insert that loses the race
// runs again and sets the row the winner created; one SKU, and its SET
// movements sum to its stock.
func TestSetCreateRace(t *testing.T) {
	s := newStmts(t)
	const n = 16
	errs := make([]error, n)
	testrig.Race(n, func(i int) {
		errs[i] = s.in(func(a arbiter.Arbiter) error { return a.Set("NEW", arbiter.Settings{OnHand: int64(10 + i)}, nil) })
	})
	for i := range n {
		require.NoError(t, errs[i])
	}
	require.EqualValues(t, 1, s.Count(`SELECT COUNT(*) FROM skus WHERE sku = 'NEW'`))
	onHand := s.OnHand("NEW")
	require.GreaterOrEqual(t, onHand, int64(10))
	require.Less(t, onHand, int64(10+n))
	require.Equal(t, [2]int64{onHand, 0}, s.MovementSums("NEW"))
	require.LessOrEqual(t, s.Count(`SELECT COUNT(*) FROM stock_movements WHERE sku = 'NEW'`), int64(n))
}

// Restock adds to a limited SKU's on_hand (RESTOCK; CORRECTION when
// negative), never below what is reserved nor past MaxStock; with a
// reference, once: a retry is a replay, another delta a conflict; a refused
// restock records no reference.
func TestRestock(t *testing.T) {
	s := newStmts(t)
	s.put("R", 10, 0)
	s.put("UN", inventory.Unlimited, 0)
	restock := func(sku string, delta int64, reason, ref string, ifMatch ...string) (map[string]arbiter.Fence, bool, error) {
		var fences map[string]arbiter.Fence
		var replay bool
		err := s.in(func(a arbiter.Arbiter) error {
			var err error
			fences, replay, err = a.Restock(sku, delta, reason, ref, ifMatch)
			return err
		})
		return fences, replay, err
	}

	fences, replay, err := restock("R", 5, "restock", "po-1")
	require.NoError(t, err)
	require.False(t, replay)
	rec := s.SKU("R")
	require.Equal(t, map[string]arbiter.Fence{"R": {Seq: rec.Seq, Epoch: rec.RedisEpoch}}, fences)
	fences, replay, err = restock("R", 5, "restock", "po-1")
	require.NoError(t, err)
	require.True(t, replay)
	require.Nil(t, fences)
	_, _, err = restock("R", 6, "restock", "po-1")
	require.ErrorIs(t, err, inventory.ErrConflict)
	s.RequireQty("R", 15, 0)

	_, _, err = restock("R", -3, "damaged", "")
	require.NoError(t, err)
	_, err = s.reserve(hold("t", "R", 10))
	require.NoError(t, err)
	_, _, err = restock("R", -3, "lost", "po-2")
	require.ErrorIs(t, err, inventory.ErrConflict)
	require.EqualError(t, err, "inventory: conflict: 10 units are reserved; stock cannot go to 9")
	_, _, err = restock("R", 1, "found", "po-2")
	require.NoError(t, err, "the refused restock recorded no reference")
	_, _, err = restock("R", arbiter.MaxStock, "", "")
	require.ErrorIs(t, err, inventory.ErrInvalidArgument)
	_, _, err = restock("UN", 1, "", "")
	require.ErrorIs(t, err, inventory.ErrConflict, "an unlimited SKU has no stock to add to")
	_, _, err = restock("NOPE", 1, "", "")
	require.ErrorIs(t, err, inventory.ErrUnknownSKU)
	_, _, err = restock("R", 1, "", "", "1.0")
	require.ErrorIs(t, err, inventory.ErrPrecondition)
	_, _, err = restock("R", 1, "", "", "13.0")
	require.NoError(t, err)
	s.RequireQty("R", 14, 10)

	var ms []arbiter.Movement
	require.NoError(t, s.DB.Where("sku = 'R'").Order("id").Find(&ms).Error)
	type mv struct {
		Kind             arbiter.MovementKind
		OnHand, Reserved int64
		Reason, Ref      string
	}
	var got []mv
	for _, m := range ms {
		got = append(got, mv{m.Kind, m.OnHandDelta, m.ReservedDelta, m.Reason, m.Reference})
	}
	require.Equal(t, []mv{
		{arbiter.MoveSet, 10, 0, "", ""},
		{arbiter.MoveRestock, 5, 0, "restock", "po-1"},
		{arbiter.MoveCorrection, -3, 0, "damaged", ""},
		{arbiter.MoveReserve, 0, 10, "", "t"},
		{arbiter.MoveRestock, 1, 0, "found", "po-2"},
		{arbiter.MoveRestock, 1, 0, "", ""},
	}, got)
	require.Equal(t, [2]int64{14, 10}, s.MovementSums("R"))
}

// FixReserved sets reserved to the sum of the live (HELD, COMMITTED)
// reservations, with a CORRECTION of the difference (none when there is
// none); the CHECK refuses a sum on_hand cannot cover.
func TestFixReserved(t *testing.T) {
	s := newStmts(t)
	s.put("F", 10, 0)
	_, err := s.reserve(hold("a", "F", 3))
	require.NoError(t, err)
	_, err = s.reserve(hold("b", "F", 2))
	require.NoError(t, err)
	require.NoError(t, s.commit("b", inventory.Line{SKU: "F", Qty: 2}))
	_, err = s.reserve(hold("c", "F", 4))
	require.NoError(t, err)
	s.release("c", "")
	fix := func(sku string) error { return s.in(func(a arbiter.Arbiter) error { return a.FixReserved(sku) }) }

	require.NoError(t, s.DB.Exec(`UPDATE skus SET reserved = 9 WHERE sku = 'F'`).Error) // drift outside the service
	seq := s.SKU("F").Seq
	require.NoError(t, fix("F"))
	s.RequireQty("F", 10, 5)
	require.Equal(t, seq+1, s.SKU("F").Seq)
	var last arbiter.Movement
	require.NoError(t, s.DB.Where("sku = 'F'").Order("id DESC").Take(&last).Error)
	require.Equal(t, arbiter.Movement{ID: last.ID, SKU: "F", Position: 6, Kind: arbiter.MoveCorrection, ReservedDelta: -4,
		Reason: "reconcile: reserved set to the sum of live reservations", CreatedAt: last.CreatedAt}, last)
	moves := len(s.moves("F"))
	require.NoError(t, fix("F"))
	require.Len(t, s.moves("F"), moves, "nothing to repair: no movement")
	require.Equal(t, [2]int64{10, 5 - 4}, s.MovementSums("F"), "the hand edit (+4) wrote no movement; the CORRECTION records its repair")
	require.NoError(t, fix("NOPE"))

	// Live reservations on_hand cannot cover (written outside the arbiter).
	require.NoError(t, s.DB.Exec(`INSERT INTO stock_reservations (token, sku, qty, state, result, expires_at, created_at, updated_at)
		VALUES ('x', 'F', 6, 'HELD', 0, ?, ?, ?)`, stamp, stamp, stamp).Error)
	require.Error(t, fix("F"), "the CHECK refuses reserved > on_hand")
	s.RequireQty("F", 10, 5)
	require.Len(t, s.moves("F"), moves)
}

// NewEpoch numbers a new Redis initialisation and returns the level Redis
// starts from; the number is kept only if the transaction commits. InitFunc
// writes Redis inside that transaction and commits the epoch even when the
// write fails.
func TestNewEpochAndInitFunc(t *testing.T) {
	s := newStmts(t)
	ctx := context.Background()
	s.put("E", 10, 0)
	s.put("EU", inventory.Unlimited, 0)
	_, err := s.reserve(hold("t", "E", 4))
	require.NoError(t, err)
	epoch := func(sku string) (inventory.Baseline, error) {
		var b inventory.Baseline
		err := s.in(func(a arbiter.Arbiter) error {
			var err error
			b, err = a.NewEpoch(sku)
			return err
		})
		return b, err
	}

	b1, err := epoch("E")
	require.NoError(t, err)
	rec := s.SKU("E")
	require.Equal(t, inventory.Baseline{Available: 6, Epoch: rec.RedisEpoch, Seq: rec.Seq}, b1)
	require.Positive(t, b1.Epoch)
	require.LessOrEqual(t, b1.Epoch, int64(1<<52), "exact in a Lua number")
	b2, err := epoch("E")
	require.NoError(t, err)
	require.NotEqual(t, b1.Epoch, b2.Epoch)
	require.Equal(t, b1.Seq, b2.Seq, "a new epoch changes no quantity")
	bu, err := epoch("EU")
	require.NoError(t, err)
	require.EqualValues(t, inventory.Unlimited, bu.Available)
	_, err = epoch("NOPE")
	require.ErrorIs(t, err, inventory.ErrUnknownSKU)
	require.Error(t, s.in(func(a arbiter.Arbiter) error {
		_, err := a.NewEpoch("E")
		require.NoError(t, err)
		return errors.New("rolled back")
	}))
	require.Equal(t, b2.Epoch, s.SKU("E").RedisEpoch, "a rolled-back epoch is not kept")

	init := arbiter.InitFunc(s.DB)
	var got inventory.Baseline
	require.NoError(t, init(ctx, "E", func(b inventory.Baseline) error { got = b; return nil }))
	require.Equal(t, inventory.Baseline{Available: 6, Epoch: s.SKU("E").RedisEpoch, Seq: rec.Seq}, got)
	down := errors.New("redis down")
	var failed inventory.Baseline
	require.ErrorIs(t, init(ctx, "E", func(b inventory.Baseline) error { failed = b; return down }), down)
	require.NotEqual(t, got.Epoch, failed.Epoch)
	require.Equal(t, failed.Epoch, s.SKU("E").RedisEpoch, "the epoch is committed although the write failed: never used twice")
	called := false
	require.ErrorIs(t, init(ctx, "NOPE", func(inventory.Baseline) error { called = true; return nil }), inventory.ErrUnknownSKU)
	require.False(t, called)
}

// Two transactions restock two SKUs in opposite orders, each waiting for
// the other's row: a real deadlock (1213). InnoDB rolls one back whole;
// Transact runs it again, and both land once.
func TestTransactRetriesADeadlockVictim(t *testing.T) {
	if testrig.Embedded {
		t.Fatal("a deadlock needs two connections: MariaDB only")
	}
	s := newStmts(t)
	s.put("X", 10, 0)
	s.put("Y", 10, 0)
	var calls, victims atomic.Int64
	holding := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	run := func(i int, first, second string) error {
		holds := sync.OnceFunc(func() { close(holding[i]) })
		defer holds() // never leave the other waiting
		attempt := 0
		return arbiter.Transact(context.Background(), s.DB, func(tx *gorm.DB) error {
			calls.Add(1)
			attempt++
			a := arbiter.In(tx)
			if _, _, err := a.Restock(first, 1, "deadlock", "", nil); err != nil {
				return err
			}
			if attempt == 1 {
				holds()        // this transaction holds first's row
				<-holding[1-i] // and the other holds its own
			}
			_, _, err := a.Restock(second, 1, "deadlock", "", nil)
			var me *mysql.MySQLError
			if errors.As(err, &me) && me.Number == 1213 {
				victims.Add(1)
				if !arbiter.Retryable(err) {
					t.Errorf("a deadlock victim is not retryable: %v", err)
				}
			}
			return err
		})
	}
	errs := make([]error, 2)
	testrig.Race(2, func(i int) {
		if i == 0 {
			errs[0] = run(0, "X", "Y")
		} else {
			errs[1] = run(1, "Y", "X")
		}
	})
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.EqualValues(t, 1, victims.Load(), "InnoDB chose one victim")
	require.EqualValues(t, 3, calls.Load(), "the victim ran again, once")
	s.RequireQty("X", 12, 0)
	s.RequireQty("Y", 12, 0)
	require.Equal(t, []string{"SET +10 +0", "RESTOCK +1 +0", "RESTOCK +1 +0"}, s.moves("X"), "the victim's first run left no movement")
	require.Equal(t, []string{"SET +10 +0", "RESTOCK +1 +0", "RESTOCK +1 +0"}, s.moves("Y"))
}

// RetryDeadlock runs again only what the database rolled back whole, at
// most ten times more, and returns the last answer.
func TestRetryDeadlockRetriesWhatWasRolledBack(t *testing.T) {
	ctx := context.Background()
	deadlock := &mysql.MySQLError{Number: 1213, Message: "Deadlock found when trying to get lock"}
	for _, c := range []struct {
		err   error
		retry bool
	}{
		{deadlock, true},
		{fmt.Errorf("write: %w", deadlock), true},
		{&mysql.MySQLError{Number: 1205}, true},
		{&mysql.MySQLError{Number: 1020}, true},
		{&mysql.MySQLError{Number: 1062}, false},
		{gorm.ErrDuplicatedKey, false},
		{arbiter.RefusedError{SKU: "A"}, false},
		{context.DeadlineExceeded, false},
		{nil, false},
	} {
		require.Equal(t, c.retry, arbiter.Retryable(c.err), "%v", c.err)
	}
	require.True(t, arbiter.IsDuplicate(&mysql.MySQLError{Number: 1062}))
	require.True(t, arbiter.IsDuplicate(fmt.Errorf("x: %w", gorm.ErrDuplicatedKey)))
	require.False(t, arbiter.IsDuplicate(deadlock))

	calls := 0
	v, err := arbiter.RetryDeadlock(ctx, func() (int, error) {
		calls++
		if calls < 3 {
			return 0, deadlock
		}
		return 7, nil
	})
	require.NoError(t, err)
	require.Equal(t, 7, v)
	require.Equal(t, 3, calls)

	calls = 0
	v, err = arbiter.RetryDeadlock(ctx, func() (int, error) {
		calls++
		return calls, &mysql.MySQLError{Number: 1213, Message: fmt.Sprint(calls)}
	})
	require.Equal(t, 11, calls, "ten retries")
	require.Equal(t, 11, v)
	require.Equal(t, &mysql.MySQLError{Number: 1213, Message: "11"}, err, "the last answer")

	calls = 0
	_, err = arbiter.RetryDeadlock(ctx, func() (int, error) { calls++; return 0, arbiter.RefusedError{SKU: "A"} })
	require.Equal(t, arbiter.RefusedError{SKU: "A"}, err)
	require.Equal(t, 1, calls, "not rolled back by the database: not retried")
}

// The pauses between retries end with the context: a caller whose deadline
// passes (or who leaves) mid-pause gets the last error then, not after the
// remaining retries.
func TestRetryDeadlockPausesEndWithTheContext(t *testing.T) {
	deadlock := &mysql.MySQLError{Number: 1213}

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	calls := 0
	_, err := arbiter.RetryDeadlock(ctx, func() (struct{}, error) { calls++; return struct{}{}, deadlock })
	require.Equal(t, deadlock, err)
	require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded, "it returned when the deadline passed")
	require.Less(t, calls, 11, "the pauses ended at the deadline, not after ten retries")

	// Leaving during the longest pause (after the tenth run: 25-75 ms): no
	// eleventh run.
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	calls = 0
	_, err = arbiter.RetryDeadlock(ctx, func() (struct{}, error) {
		calls++
		if calls == 10 {
			cancel()
		}
		return struct{}{}, deadlock
	})
	require.Equal(t, deadlock, err)
	require.Equal(t, 10, calls)
}
