package arbiter_test

// The movement records every quantity change writes (the arbiter's
// Movement rows), read back through the listing and checked against the
// SKU's record, on the real MariaDB and Redis.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/catalog"
	"github.com/acme/inventory/internal/groupcommit"
	"github.com/acme/inventory/internal/listing"
	"github.com/acme/inventory/testkit/testenv"
	"github.com/acme/inventory/testkit/testrig"
)

// move is a movement without its id and time (asserted separately).
type move struct {
	Kind             arbiter.MovementKind
	OnHand, Reserved int64
	Reason, Ref      string
}

// history reads sku's whole history through Movements, a page at a time,
// checks positions run 1, 2, 3, ... with no gap and every movement has a
// time, and returns it.
func history(t *testing.T, l *listing.Reader, sku string) []move {
	t.Helper()
	var out []move
	var after int64
	for {
		p, err := l.Movements(context.Background(), sku, after, listing.MaxPageSize)
		require.NoError(t, err)
		for _, m := range p.Items {
			require.Equal(t, after+1, m.Position, "positions run on with no gap")
			require.Equal(t, sku, m.SKU)
			require.False(t, m.CreatedAt.IsZero(), "movement %d has a time", m.ID)
			after = m.Position
			out = append(out, move{m.Kind, m.OnHandDelta, m.ReservedDelta, m.Reason, m.Reference})
		}
		require.Equal(t, after, p.Next, "the page's cursor is its last position")
		if !p.More {
			return out
		}
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
	requireLastOnHandChange(t, r.DB, sku)
}

// requireLastOnHandChange asserts the SKU's row names its last movement
// that changed on_hand, a count's aside (a SET always counts), by position
// and created_at (0 and NULL: none): what a count's rebase starts from.
func requireLastOnHandChange(t *testing.T, db *gorm.DB, sku string) {
	t.Helper()
	type change struct {
		Position int64
		At       *time.Time
	}
	var row, last []change
	require.NoError(t, db.Raw(`SELECT on_hand_position AS position, on_hand_moved_at AS at FROM skus WHERE sku = ?`, sku).Scan(&row).Error)
	require.NoError(t, db.Raw(`SELECT position, created_at AS at FROM stock_movements
		WHERE sku = ? AND kind <> 'COUNT' AND (on_hand_delta <> 0 OR kind = 'SET') ORDER BY position DESC LIMIT 1`, sku).Scan(&last).Error)
	require.Len(t, row, 1, sku)
	if len(last) == 0 {
		last = []change{{}}
	}
	require.Equal(t, last[0].Position, row[0].Position, "%s: the row's last change of on_hand", sku)
	if last[0].At == nil {
		require.Nil(t, row[0].At, sku)
		return
	}
	require.NotNil(t, row[0].At, sku)
	require.True(t, last[0].At.Equal(*row[0].At), "%s: the row stamps its last change of on_hand %s, the movement %s", sku, *row[0].At, *last[0].At)
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

// follower reads one SKU's history as an audit export or an ERP would:
// a page at a time from the cursor the last answer gave it, then again
// later from where it stopped. It records each movement it is given.
type follower struct {
	t     *testing.T
	l     *listing.Reader
	sku   string
	after int64
	got   []arbiter.Movement
}

// poll reads every movement after the follower's cursor, in pages of two,
// and returns the new ones.
func (f *follower) poll() []arbiter.Movement {
	f.t.Helper()
	const limit = 2
	var fresh []arbiter.Movement
	for {
		p, err := f.l.Movements(context.Background(), f.sku, f.after, limit)
		require.NoError(f.t, err)
		fresh = append(fresh, p.Items...)
		f.after = p.Next // the answer's cursor, on every page
		if len(p.Items) < limit {
			break
		}
	}
	f.got = append(f.got, fresh...)
	return fresh
}

// kinds names movements as "KIND reason/reference", in order.
func kinds(ms []arbiter.Movement) []string {
	out := []string{}
	for _, m := range ms {
		out = append(out, fmt.Sprintf("%s %s%s", m.Kind, m.Reason, m.Reference))
	}
	return out
}

// A follower of a SKU's history polls with the cursor of the last answer
// and gets every movement exactly once, in commit order, whatever commits
// late: two transactions on one SKU, the second queued behind the first's
// row lock, and the follower reading before either commits, between the
// two commits, and after. Neither can skip: a movement is numbered under
// the SKU's row lock, so a transaction that commits later is numbered
// after every movement a follower could already have read.
func TestMovementsFollowerAcrossLateCommits(t *testing.T) {
	s := newStmts(t)
	sku := testenv.Unique("FOLLOW")
	s.put(sku, 5, 0)
	f := &follower{t: t, l: s.Listing, sku: sku}
	require.Equal(t, []string{"SET "}, kinds(f.poll()))
	require.Empty(t, kinds(f.poll()), "nothing new: the last page's cursor holds the follower's place")

	first := s.DB.Begin()
	require.NoError(t, first.Error)
	defer first.Rollback()
	_, _, err := arbiter.In(first).Restock(sku, 2, "first", "", nil)
	require.NoError(t, err)

	// The second change goes as far as the row lock, and holds its
	// transaction open once it has written, until the test commits it.
	second := s.DB.Begin()
	require.NoError(t, second.Error)
	defer second.Rollback()
	written := make(chan error, 1)
	go func() { _, err := arbiter.In(second).Reserve([]arbiter.Hold{hold("second", sku, 1)}); written <- err }()
	require.Eventually(t, func() bool { // (INNODB_TRX is a cache, seldom fresh: the process list is)
		var waiting int64
		err := s.DB.Raw(`SELECT COUNT(*) FROM information_schema.PROCESSLIST
			WHERE db = DATABASE() AND info LIKE 'UPDATE skus SET reserved = (@r0 := reserved +%'`).Scan(&waiting).Error
		return err == nil && waiting > 0
	}, 10*time.Second, 20*time.Millisecond, "the second change waits for the row lock")
	require.Empty(t, kinds(f.poll()), "neither committed")

	require.NoError(t, first.Commit().Error)
	require.NoError(t, <-written)
	require.Equal(t, []string{"RESTOCK first"}, kinds(f.poll()), "between the commits: the first")
	require.Empty(t, kinds(f.poll()))

	require.NoError(t, second.Commit().Error)
	require.Equal(t, []string{"RESERVE second"}, kinds(f.poll()), "after the second commit: the second")
	require.Empty(t, kinds(f.poll()))

	require.Equal(t, []string{"SET ", "RESTOCK first", "RESERVE second"}, kinds(f.got), "each once, in commit order")
	var positions []int64
	for _, m := range f.got {
		positions = append(positions, m.Position)
	}
	require.Equal(t, []int64{1, 2, 3}, positions, "numbered as they committed, with no gap")
	require.Len(t, history(t, s.Listing, sku), 3, "what a reader of the whole history reads")
}
