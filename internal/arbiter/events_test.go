package arbiter_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/testkit/testenv"
	"github.com/acme/inventory/testkit/testrig"
)

// ev is an event as these tests compare it: its type and the levels it
// carries.
type ev struct {
	Type                        string
	OnHand, Reserved, Available int64
}

// events reads sku's events in seq order, checking their seqs run 1, 2,
// 3, ... with no gap, and returns them from the from-th on.
func (s *stmts) events(sku string, from int) []ev {
	s.T.Helper()
	rows, err := arbiter.EventsOf(s.DB).OfSKU(sku)
	require.NoError(s.T, err)
	out := []ev{}
	for i, e := range rows {
		require.EqualValues(s.T, i+1, e.Seq, "%s: seq %d is the %d-th event", sku, e.Seq, i+1)
		if i >= from {
			out = append(out, ev{e.Type, e.OnHand, e.Reserved, e.Available})
		}
	}
	return out
}

func (s *stmts) setSKU(sku string, set arbiter.Settings) {
	s.T.Helper()
	require.NoError(s.T, s.in(func(a arbiter.Arbiter) error { return a.Set(sku, set, nil) }))
}

func (s *stmts) restock(sku string, delta int64) {
	s.T.Helper()
	require.NoError(s.T, s.in(func(a arbiter.Arbiter) error {
		_, _, err := a.Restock(sku, delta, "test", "", nil)
		return err
	}))
}

// Every path that moves a SKU's available units announces the threshold it
// crosses, once, with the levels the database has after the change; a
// change that crosses nothing writes nothing. Each step is one path: a
// reservation, a release (cancel, timeout and the token API's all go
// through it), a timeout's conditional release, an adjust either way, a
// put of the stock and of the threshold, a paid sale applied (no change of
// available) and its refund, a reconcile repair, a campaign's carve-out and
// its end.
func TestEventsEachPathCrossesOnce(t *testing.T) {
	s := newStmts(t)
	sku := testenv.Unique("EV")
	s.setSKU(sku, arbiter.Settings{OnHand: 4, LowStockThreshold: 2})
	require.Empty(t, s.events(sku, 0), "a new SKU above its threshold announces nothing")
	n := 0
	step := func(what string, want ...ev) {
		t.Helper()
		if want == nil {
			want = []ev{}
		}
		require.Equal(t, want, s.events(sku, n), what)
		n += len(want)
	}

	_, err := s.reserve(hold("a", sku, 1))
	require.NoError(t, err)
	step("4 -> 3 crosses nothing")
	_, err = s.reserve(hold("b", sku, 1))
	require.NoError(t, err)
	step("a reservation to the threshold", ev{arbiter.EventLowStock, 4, 2, 2})
	_, err = s.reserve(hold("c", sku, 2))
	require.NoError(t, err)
	step("a reservation of the last units", ev{arbiter.EventSoldOut, 4, 4, 0})
	s.release("c", "")
	step("a release from zero", ev{arbiter.EventBackInStock, 4, 2, 2})
	s.restock(sku, 5)
	step("a restock above the threshold re-arms it silently")
	s.restock(sku, -5)
	step("a correction down to the threshold", ev{arbiter.EventLowStock, 4, 2, 2})
	s.setSKU(sku, arbiter.Settings{OnHand: 2, LowStockThreshold: 2})
	step("a put of on_hand down to reserved", ev{arbiter.EventSoldOut, 2, 2, 0})
	s.setSKU(sku, arbiter.Settings{OnHand: 10})
	step("a put back up (and the threshold off)", ev{arbiter.EventBackInStock, 10, 2, 8})
	s.setSKU(sku, arbiter.Settings{OnHand: 10, LowStockThreshold: 8})
	step("a put of the threshold up to available", ev{arbiter.EventLowStock, 10, 2, 8})

	require.NoError(t, s.in(func(a arbiter.Arbiter) error {
		_, err := a.ReleaseDue("b", sku, time.Now().Add(2*time.Hour))
		return err
	}))
	step("a timeout's release above zero crosses nothing")
	s.release("a", "")
	step("a release above zero crosses nothing")

	// A paid sale applied takes from on_hand and reserved alike: available
	// does not move, nothing is announced. Its refund brings units back.
	s.setSKU(sku, arbiter.Settings{OnHand: 3})
	step("3 of 3 available, no threshold")
	_, err = s.reserve(hold("p", sku, 3))
	require.NoError(t, err)
	step("sold out", ev{arbiter.EventSoldOut, 3, 3, 0})
	require.NoError(t, s.in(func(a arbiter.Arbiter) error { return a.Commit("p", testrig.Line(sku, 3)) }))
	s.Deliver(arbiter.StockMessage{Token: "p", SKU: sku, Op: arbiter.OpDeduct, Qty: 3})
	s.RequireQty(sku, 0, 0)
	step("a sale applied moves no available unit")
	s.Deliver(arbiter.StockMessage{Token: "p", SKU: sku, Op: arbiter.OpRestore, Qty: 3})
	step("a refund applied", ev{arbiter.EventBackInStock, 3, 0, 3})

	// A reconcile repair: a reservation's row released without reserved
	// (a drift no path makes; the repair is for what none should) keeps
	// the SKU sold out until the repair gives the units back.
	_, err = s.reserve(hold("q", sku, 3))
	require.NoError(t, err)
	step("sold out again", ev{arbiter.EventSoldOut, 3, 3, 0})
	require.NoError(t, s.DB.Exec(`UPDATE stock_reservations SET state = 'RELEASED' WHERE token = 'q' AND sku = ?`, sku).Error)
	require.NoError(t, s.in(func(a arbiter.Arbiter) error { return a.FixReserved(sku) }))
	step("a reconcile repair", ev{arbiter.EventBackInStock, 3, 0, 3})

	// A campaign carves the whole stock out, and its end gives it back.
	id := testenv.Unique("c")
	require.NoError(t, s.putCampaign(campaign(id, sku, 3, 0, time.Now().Add(-time.Minute))))
	step("a carve-out of every unit", ev{arbiter.EventSoldOut, 3, 3, 0})
	require.NoError(t, s.in(func(a arbiter.Arbiter) error {
		_, err := a.EndCampaign(id, time.Now().UTC().Truncate(time.Microsecond))
		return err
	}))
	step("the campaign's end returns them",
		ev{arbiter.EventCampaignEnded, 3, 0, 3}, ev{arbiter.EventBackInStock, 3, 0, 3})
}

// A change that rolls back announces nothing and leaves the SKU's
// announced thresholds as they were: the crossing is announced by the
// change that commits it.
func TestEventsRolledBackChangeWritesNone(t *testing.T) {
	s := newStmts(t)
	sku := testenv.Unique("EVRB")
	s.put(sku, 1, 0)
	boom := errors.New("boom")
	err := s.in(func(a arbiter.Arbiter) error {
		if _, err := a.Reserve([]arbiter.Hold{hold("a", sku, 1)}); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Empty(t, s.events(sku, 0))
	_, err = s.reserve(hold("a", sku, 1))
	require.NoError(t, err)
	require.Equal(t, []ev{{arbiter.EventSoldOut, 1, 1, 0}}, s.events(sku, 0))
}

// Concurrent sales racing across zero announce one sold_out per crossing:
// rounds of more buyers than units, each round's units given back by
// racing releases; the SKU's events alternate, each with the levels of
// its crossing, and their seqs run with no gap.
func TestEventsRaceAcrossZero(t *testing.T) {
	s := newStmts(t)
	sku := testenv.Unique("EVRACE")
	const units, buyers, rounds = 4, 12, 3
	s.put(sku, units, 0)
	var want []ev
	for round := range rounds {
		tokens := make([]string, buyers)
		testrig.Race(buyers, func(i int) {
			tok := testenv.Unique("r")
			if _, err := s.reserve(hold(tok, sku, 1)); err == nil {
				tokens[i] = tok
			} else {
				var refused arbiter.RefusedError
				require.ErrorAs(t, err, &refused)
			}
		})
		s.RequireQty(sku, units, units)
		want = append(want, ev{arbiter.EventSoldOut, units, units, 0})
		testrig.Race(buyers, func(i int) {
			if tokens[i] != "" {
				s.release(tokens[i], "")
			}
		})
		want = append(want, ev{arbiter.EventBackInStock, units, units - 1, 1})
		require.Equal(t, want, s.events(sku, 0), "round %d", round)
	}
}

// sku.level_changed: one per SKU per second at most, with the levels as
// they are when written, numbered in the SKU's one sequence with its
// threshold events; a SKU nothing moved gets none.
func TestEventsLevelChangedCoalesced(t *testing.T) {
	s := newStmts(t)
	sku, quiet := testenv.Unique("EVLV"), testenv.Unique("EVQ")
	s.put(sku, 10, 0)
	s.put(quiet, 10, 0)
	levels := func(now time.Time) int {
		var n int
		require.NoError(t, s.in(func(a arbiter.Arbiter) (err error) { n, err = a.AnnounceLevels(now, 100); return err }))
		return n
	}
	now := time.Now()
	require.Equal(t, 2, levels(now), "a new SKU's levels")
	for i := range 4 {
		_, err := s.reserve(hold(testenv.Unique("l"), sku, int64(i+1)))
		require.NoError(t, err)
	}
	require.Zero(t, levels(now.Add(500*time.Millisecond)), "within a second of the last")
	require.Equal(t, 1, levels(now.Add(time.Second)), "one for 4 sales")
	require.Zero(t, levels(now.Add(3*time.Second)), "nothing moved since")
	require.Equal(t, []ev{
		{arbiter.EventLevelChanged, 10, 0, 10},
		{arbiter.EventLevelChanged, 10, 10, 0},
	}, []ev{s.events(sku, 0)[0], s.events(sku, 0)[2]})
	require.Equal(t, arbiter.EventSoldOut, s.events(sku, 0)[1].Type, "the threshold event between them, in seq order")
	require.Len(t, s.events(quiet, 0), 1)
}

// Publish numbers committed events for the replay feed in the order they
// were written, above every earlier id; a page reads them in id order, so
// each SKU's events come in seq order.
func TestEventsPublishAndPage(t *testing.T) {
	s := newStmts(t)
	a, b := testenv.Unique("EVPA"), testenv.Unique("EVPB")
	s.put(a, 1, 0)
	s.put(b, 1, 0)
	publish := func() int {
		var n int
		require.NoError(t, arbiter.Transact(context.Background(), s.DB, func(tx *gorm.DB) (err error) {
			n, err = arbiter.EventsOf(tx).Publish(1000)
			return err
		}))
		return n
	}
	var after int64 // a fresh database: no event before
	for _, tok := range []string{"x", "y"} {
		_, err := s.reserve(hold(tok, a, 1))
		require.NoError(t, err)
		s.release(tok, "")
		_, err = s.reserve(hold(tok, b, 1))
		require.NoError(t, err)
		s.release(tok, "")
	}
	require.Equal(t, 8, publish())
	require.Zero(t, publish(), "nothing left to number")
	page, err := arbiter.EventsOf(s.DB).Page(arbiter.EventFilter{After: after, Limit: 100})
	require.NoError(t, err)
	require.Len(t, page, 8)
	seqs := map[string]int64{}
	for i, e := range page {
		if i > 0 {
			require.Greater(t, *e.ID, *page[i-1].ID)
		}
		require.Equal(t, seqs[e.SKU]+1, e.Seq, "each SKU's events in seq order")
		seqs[e.SKU] = e.Seq
	}
	onlyB, err := arbiter.EventsOf(s.DB).Page(arbiter.EventFilter{After: after, SKU: b, Limit: 2})
	require.NoError(t, err)
	require.Equal(t, []string{arbiter.EventSoldOut, arbiter.EventBackInStock}, []string{onlyB[0].Type, onlyB[1].Type})
	require.Equal(t, b, onlyB[0].SKU)
	rest, err := arbiter.EventsOf(s.DB).Page(arbiter.EventFilter{After: *onlyB[1].ID, SKU: b, Limit: 100})
	require.NoError(t, err)
	require.Len(t, rest, 2)
	// A subscription's backlog: what a page would read, its Limit aside.
	all, err := arbiter.EventsOf(s.DB).Count(arbiter.EventFilter{After: after, Limit: 1})
	require.NoError(t, err)
	require.EqualValues(t, 8, all)
	soldOutB, err := arbiter.EventsOf(s.DB).Count(arbiter.EventFilter{After: after,
		Types: []string{arbiter.EventSoldOut}, SKUs: []string{b}})
	require.NoError(t, err)
	require.EqualValues(t, 2, soldOutB)
	head, err := arbiter.EventsOf(s.DB).Head()
	require.NoError(t, err)
	none, err := arbiter.EventsOf(s.DB).Count(arbiter.EventFilter{After: head})
	require.NoError(t, err)
	require.Zero(t, none, "nothing after the head")
}

// An unlimited SKU is never sold out; a SKU turned unlimited is back in
// stock.
func TestEventsUnlimited(t *testing.T) {
	s := newStmts(t)
	sku := testenv.Unique("EVU")
	s.put(sku, 1, 0)
	_, err := s.reserve(hold("a", sku, 1))
	require.NoError(t, err)
	s.setSKU(sku, arbiter.Settings{OnHand: inventory.Unlimited})
	_, err = s.reserve(hold("b", sku, 1000))
	require.NoError(t, err)
	require.Equal(t, []ev{{arbiter.EventSoldOut, 1, 1, 0}, {arbiter.EventBackInStock, -1, 1, -1}}, s.events(sku, 0))
}

// A reservation that waits for a SKU's row lock behind a release is
// numbered after it in the movement history: the history replays through
// the levels the SKU had, and crosses zero where its events say (sold out,
// back in stock, sold out again), never below it. (Its RESERVE movement,
// once inserted before the lock, was numbered before the release: the
// replay dipped to -1 and showed neither crossing.)
func TestEventsHistoryOrderBehindALock(t *testing.T) {
	s := newStmts(t)
	sku := testenv.Unique("EVORD")
	s.put(sku, 1, 0)
	_, err := s.reserve(hold("a", sku, 1))
	require.NoError(t, err)

	// The release's transaction holds the row lock while the reservation
	// goes as far as the lock, then releases and commits.
	tx := s.DB.Begin()
	require.NoError(t, tx.Error)
	defer tx.Rollback()
	require.NoError(t, tx.Exec(`SELECT sku FROM skus WHERE sku = ? FOR UPDATE`, sku).Error)
	reserved := make(chan error, 1)
	go func() { _, err := s.reserve(hold("b", sku, 1)); reserved <- err }()
	require.Eventually(t, func() bool { // (INNODB_TRX is a cache, seldom fresh: the process list is)
		var waiting int64
		err := s.DB.Raw(`SELECT COUNT(*) FROM information_schema.PROCESSLIST
			WHERE db = DATABASE() AND info LIKE 'UPDATE skus SET reserved = (@r0 := reserved +%'`).Scan(&waiting).Error
		return err == nil && waiting > 0
	}, 10*time.Second, 20*time.Millisecond, "the reservation waits for the row lock")
	_, err = arbiter.In(tx).Release("a", sku)
	require.NoError(t, err)
	require.NoError(t, tx.Commit().Error)
	require.NoError(t, <-reserved)

	require.Equal(t, []string{"SET +1 +0", "RESERVE +0 +1", "RELEASE +0 -1", "RESERVE +0 +1"}, s.moves(sku))
	require.Equal(t, []ev{{arbiter.EventSoldOut, 1, 1, 0}, {arbiter.EventBackInStock, 1, 0, 1}, {arbiter.EventSoldOut, 1, 1, 0}},
		s.events(sku, 0))
}

// A cart's reservation on several SKUs: each SKU's fence, its movements'
// positions and its threshold events come from that SKU's own UPDATE (on
// MySQL the UPDATEs leave them in user variables, one set per SKU, read
// back in one statement), never from another's: the SKUs are given
// different seqs, epochs, positions and thresholds first, and only the
// second crosses one.
func TestReserveOfACartFencesEachSKUByItsOwnRow(t *testing.T) {
	s := newStmts(t)
	a, b, c := testenv.Unique("FEA"), testenv.Unique("FEB"), testenv.Unique("FEC")
	s.put(a, 100, 0)
	s.put(b, 3, 0)
	s.put(c, 50, 0)
	for i := range 3 { // a moves ahead of the others
		_, err := s.reserve(hold(fmt.Sprintf("pre-%d", i), a, 1))
		require.NoError(t, err)
	}
	fences, err := s.reserve(hold("cart", c, 2), hold("cart", a, 5), hold("cart", b, 3))
	require.NoError(t, err)
	for _, sku := range []string{a, b, c} {
		var row struct {
			Seq, RedisEpoch, MovementPosition int64
		}
		require.NoError(t, s.DB.Raw(`SELECT seq, redis_epoch, movement_position FROM skus WHERE sku = ?`, sku).Scan(&row).Error)
		require.Equal(t, arbiter.Fence{Seq: row.Seq, Epoch: row.RedisEpoch}, fences[sku], sku)
		var last int64
		require.NoError(t, s.DB.Raw(`SELECT MAX(position) FROM stock_movements WHERE sku = ?`, sku).Scan(&last).Error)
		require.Equal(t, row.MovementPosition, last, "%s: its movements numbered up to its own position", sku)
		var reserve int64
		require.NoError(t, s.DB.Raw(`SELECT position FROM stock_movements WHERE sku = ? AND kind = 'RESERVE' AND reference = 'cart'`, sku).Scan(&reserve).Error)
		require.Equal(t, last, reserve, "%s: the cart's RESERVE is its last movement", sku)
	}
	require.Equal(t, []ev{}, s.events(a, 0))
	require.Equal(t, []ev{{arbiter.EventSoldOut, 3, 3, 0}}, s.events(b, 0), "b alone sold out")
	require.Equal(t, []ev{}, s.events(c, 0))
}
