package counts_test

// Stock counts on the real MariaDB and Redis (testkit/testrig): each test
// knows what was on the shelf at counted_at by construction, so the rebased
// on_hand is checked against it exactly, never against the formula.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/counts"
	"github.com/acme/inventory/order"
	"github.com/acme/inventory/testkit/testrig"
)

func ptr[T any](v T) *T { return &v }

// fixture is a rig and the counts on it.
type fixture struct {
	*testrig.Rig
	counts *counts.Service
	ctx    context.Context
}

func newFixture(t *testing.T, cfg counts.Config) *fixture {
	r := testrig.New(t, testrig.MemoryTransport(t))
	return &fixture{Rig: r, counts: counts.New(r.DB, r.Stock, cfg), ctx: context.Background()}
}

// order places a one-line order of qty units of sku (HELD).
func (f *fixture) order(sku string, qty int64) *order.Order {
	f.T.Helper()
	o, err := f.Orders.Create(f.ctx, "buyer", "", testrig.Line(sku, qty))
	require.NoError(f.T, err)
	return o
}

// pay pays o (COMMITTED: its units still in on_hand and reserved).
func (f *fixture) pay(o *order.Order) *order.Order {
	f.T.Helper()
	p, err := f.Orders.Pay(f.ctx, o.ID, "pay-"+o.ID)
	require.NoError(f.T, err)
	return p
}

// settle has the consumer deduct o's line (SALE: on_hand and reserved
// lose it), as the ordered queue would deliver it.
func (f *fixture) settle(o *order.Order) {
	f.T.Helper()
	f.Deliver(arbiter.StockMessage{Token: o.ReservationToken, SKU: o.Items[0].SKU, Op: arbiter.OpDeduct, Qty: o.Items[0].Qty})
}

func (f *fixture) ship(o *order.Order) {
	f.T.Helper()
	s, err := f.Orders.Ship(f.ctx, o.ID)
	require.NoError(f.T, err)
	require.NotNil(f.T, s.ShippedAt)
}

// instant is now, with the clock moved on either side of it, so every
// movement before it is stamped before and every one after, after.
func instant() time.Time {
	time.Sleep(2 * time.Millisecond)
	t := time.Now().UTC().Truncate(time.Microsecond)
	time.Sleep(2 * time.Millisecond)
	return t
}

// A count taken in the middle of a seckill, between a sale's commit and
// its payment, with sales paid and not shipped, shipped before their
// deduction, and shipped after counted_at, and the sale going on while
// the count applies: what the shelf held at counted_at minus what was
// missing is what on_hand says once everything sold is deducted, exactly.
func TestCountRebasedDuringSeckill(t *testing.T) {
	f := newFixture(t, counts.Config{})
	const stocked = 1000
	sku := f.PutSKU("COUNTED", stocked, 0)

	// Before counted_at: four sales deducted, two of them shipped; one
	// paid and shipped before the consumer deducted it; one deducted
	// and shipped only after counted_at; one held, paid after it.
	var before []*order.Order
	for range 4 {
		o := f.pay(f.order(sku, 2))
		f.settle(o)
		before = append(before, o)
	}
	f.ship(before[0])
	f.ship(before[1])
	early := f.pay(f.order(sku, 3))
	f.ship(early)
	late := f.pay(f.order(sku, 2))
	f.settle(late)
	held := f.order(sku, 1)
	soldBefore := int64(4*2 + 2) // deducted before counted_at

	countedAt := instant()
	const missing = 5
	shelf := int64(stocked - 2 - 2 - 3) // what left the warehouse by counted_at: two shipped sales, the early shipment
	f.pay(held)
	f.settle(held)
	f.settle(early)
	f.ship(late)

	// The seckill goes on while the count applies: buyers reserve, half of
	// them pay and are deducted.
	var sold atomic.Int64
	sold.Store(soldBefore + 1 + 3)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				o, err := f.Orders.Seckill(f.ctx, fmt.Sprintf("b%d-%d", w, i), sku, 0)
				if err != nil {
					t.Errorf("seckill: %v", err)
					return
				}
				if i%2 == 0 {
					f.pay(o)
					f.settle(o)
					sold.Add(1)
				}
			}
		}()
	}
	time.Sleep(50 * time.Millisecond)
	res, err := f.counts.Apply(f.ctx, counts.Request{CountID: "night-1", CountedAt: countedAt,
		Lines: []counts.Line{{SKU: sku, Counted: shelf - missing}}})
	time.Sleep(50 * time.Millisecond)
	close(stop)
	wg.Wait()
	require.NoError(t, err)

	line := res.Lines[0]
	require.Equal(t, arbiter.CountCorrected, line.Outcome)
	require.Equal(t, stocked-soldBefore, *line.OnHandThen, "on_hand as of counted_at: what was deducted before it")
	require.EqualValues(t, 2+2+2-3, line.Unshipped, "sold and not shipped at counted_at (two, and the late shipment), less the early shipment")
	require.Equal(t, "shipped", line.UnshippedFrom)
	require.EqualValues(t, -missing, line.Applied)
	rec := f.SKU(sku)
	require.Equal(t, stocked-sold.Load()-missing, rec.OnHand, "on_hand is what the shelf had at counted_at, less what was sold since, exactly")
	require.Equal(t, f.Live(sku), rec.Reserved)
	require.Equal(t, [2]int64{rec.OnHand, rec.Reserved}, f.MovementSums(sku))
	f.CheckInvariant(sku)
	require.EqualValues(t, 1, f.Count(`SELECT COUNT(*) FROM stock_movements WHERE sku = ? AND kind = 'COUNT' AND reference = ?`,
		sku, arbiter.CountReference("night-1", 1)))
}

// A replay changes nothing and is answered as the first time; two at once
// apply once; another body under the count's id is a conflict; a line of
// an unknown SKU is answered 404 and the others apply.
func TestCountReplayedAndConflicting(t *testing.T) {
	f := newFixture(t, counts.Config{})
	a, b, c := f.PutSKU("A", 10, 0), f.PutSKU("B", 10, 0), f.PutSKU("C", 4, 0)
	at := instant()
	req := counts.Request{CountID: "c-1", CountedAt: at, Lines: []counts.Line{
		{SKU: a, Counted: 7}, {SKU: "NO-SUCH-SKU", Counted: 3}, {SKU: b, Counted: 12, Unshipped: ptr[int64](1)}}}

	answers := make([]*counts.Result, 4)
	testrig.Race(len(answers), func(i int) {
		res, err := f.counts.Apply(f.ctx, req)
		require.NoError(t, err)
		answers[i] = res
	})
	for _, res := range answers[1:] {
		require.Equal(t, answers[0], res, "every answer is the first one")
	}
	res := answers[0]
	require.Equal(t, counts.Totals{Applied: 3, Corrected: 2, Unknown: 1, UnitsAdded: 1, UnitsRemoved: 3}, res.Totals)
	require.Equal(t, arbiter.CountUnknown, res.Lines[1].Outcome)
	require.Equal(t, 404, res.Lines[1].Status)
	require.Equal(t, "not_found", res.Lines[1].Error.Code)
	require.Equal(t, "line", res.Lines[2].UnshippedFrom)
	f.RequireQty(a, 7, 0)
	f.RequireQty(b, 11, 0)
	f.CheckInvariant(a)
	f.CheckInvariant(b)

	again, err := f.counts.Apply(f.ctx, req)
	require.NoError(t, err)
	require.Equal(t, res, again)
	require.EqualValues(t, 2, f.Count(`SELECT COUNT(*) FROM stock_movements WHERE kind = 'COUNT'`), "applied once")

	for name, other := range map[string]counts.Request{
		"another counted line": {CountID: "c-1", CountedAt: at, Lines: []counts.Line{{SKU: a, Counted: 8}, req.Lines[1], req.Lines[2]}},
		"another counted_at":   {CountID: "c-1", CountedAt: at.Add(-time.Second), Lines: req.Lines},
		"overlapping lines":    {CountID: "c-1", CountedAt: at, Offset: 2, Lines: []counts.Line{{SKU: a, Counted: 1}}},
	} {
		_, err := f.counts.Apply(f.ctx, other)
		require.ErrorIs(t, err, inventory.ErrConflict, name)
	}
	f.RequireQty(a, 7, 0)

	// The next page of the count applies; the progress sums both.
	page2, err := f.counts.Apply(f.ctx, counts.Request{CountID: "c-1", CountedAt: at, Offset: 3,
		Lines: []counts.Line{{SKU: c, Counted: 4}}})
	require.NoError(t, err)
	require.Equal(t, counts.Totals{Applied: 1, Unchanged: 1}, page2.Totals)
	require.Empty(t, page2.Lines, "an unchanged line is in the totals only")
	p, err := f.counts.Get(f.ctx, "c-1")
	require.NoError(t, err)
	require.True(t, p.Done)
	require.EqualValues(t, 4, p.Lines)
	require.Equal(t, counts.Totals{Applied: 4, Corrected: 2, Unchanged: 1, Unknown: 1, UnitsAdded: 1, UnitsRemoved: 3}, p.Totals)
	require.Equal(t, []counts.Page{{Offset: 0, Lines: 3, Applied: 3}, {Offset: 3, Lines: 1, Applied: 1}}, p.Pages)
	_, err = f.counts.Get(f.ctx, "c-2")
	require.ErrorIs(t, err, inventory.ErrNotFound)
}

// A count that finds fewer units than are held takes on_hand down to
// reserved and no further: the rest is a shortage, recorded once as an
// anomaly and announced once as sku.shortage, even while buyers keep
// reserving and the count is sent twice.
func TestCountShortOfHeld(t *testing.T) {
	f := newFixture(t, counts.Config{})
	sku := f.PutSKU("SHORT", 20, 0)
	for range 6 {
		f.order(sku, 1)
	}
	at := instant()
	var sold atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := f.Orders.Seckill(f.ctx, fmt.Sprintf("s%d-%d", w, i), sku, 0); err == nil {
					sold.Add(1)
				} else if !isSoldOut(err) {
					t.Errorf("seckill: %v", err)
					return
				}
			}
		}()
	}
	req := counts.Request{CountID: "short-1", CountedAt: at, Lines: []counts.Line{{SKU: sku, Counted: 2}}}
	var res [2]*counts.Result
	testrig.Race(2, func(i int) {
		var err error
		res[i], err = f.counts.Apply(f.ctx, req)
		require.NoError(t, err)
	})
	close(stop)
	wg.Wait()
	require.Equal(t, res[0], res[1])
	line := res[0].Lines[0]
	require.Equal(t, arbiter.CountShort, line.Outcome)
	rec := f.SKU(sku)
	require.Equal(t, 6+sold.Load(), rec.Reserved, "every reservation kept")
	require.LessOrEqual(t, rec.Reserved, rec.OnHand, "nothing oversold")
	require.Equal(t, *line.OnHand, rec.OnHand, "no sale came after on_hand reached reserved")
	require.Equal(t, int64(20)+line.Applied, rec.OnHand)
	require.Equal(t, rec.Reserved-2, line.Short, "the count's 2, less what is held")
	f.CheckInvariant(sku)
	require.EqualValues(t, 1, f.Count(`SELECT COUNT(*) FROM stock_anomalies WHERE sku = ? AND op = 'COUNT' AND qty = ?`, sku, line.Short))
	events, err := arbiter.EventsOf(f.DB).OfSKU(sku)
	require.NoError(t, err)
	var shortages []arbiter.Event
	for _, e := range events {
		if e.Type == arbiter.EventShortage {
			shortages = append(shortages, e)
		}
	}
	require.Len(t, shortages, 1)
	require.Equal(t, line.Short, *shortages[0].Short)
	require.Equal(t, "short-1", *shortages[0].CountID)
	require.Equal(t, int64(0), shortages[0].Available)
}

func isSoldOut(err error) bool { return errors.Is(err, inventory.ErrInsufficientStock) }

// Bad input is refused before anything is written: nothing of the request
// applies, and a count refused whole leaves no record.
func TestCountRefusesBadInput(t *testing.T) {
	f := newFixture(t, counts.Config{Retention: 2 * time.Hour})
	sku := f.PutSKU("BAD", 10, 0)
	at := instant()
	many := make([]counts.Line, counts.MaxLines+1)
	for i := range many {
		many[i] = counts.Line{SKU: fmt.Sprintf("S%d", i), Counted: 1}
	}
	for name, req := range map[string]counts.Request{
		"negative counted":     {CountID: "bad", CountedAt: at, Lines: []counts.Line{{SKU: sku, Counted: 1}, {SKU: "X", Counted: -1}}},
		"negative unshipped":   {CountID: "bad", CountedAt: at, Lines: []counts.Line{{SKU: sku, Counted: 1, Unshipped: ptr[int64](-1)}}},
		"a SKU twice":          {CountID: "bad", CountedAt: at, Lines: []counts.Line{{SKU: sku, Counted: 1}, {SKU: sku, Counted: 2}}},
		"no lines":             {CountID: "bad", CountedAt: at},
		"too many lines":       {CountID: "bad", CountedAt: at, Lines: many},
		"a bad count_id":       {CountID: "bad id", CountedAt: at, Lines: []counts.Line{{SKU: sku, Counted: 1}}},
		"a bad SKU":            {CountID: "bad", CountedAt: at, Lines: []counts.Line{{SKU: "A{B}", Counted: 1}}},
		"no counted_at":        {CountID: "bad", Lines: []counts.Line{{SKU: sku, Counted: 1}}},
		"counted in future":    {CountID: "bad", CountedAt: time.Now().Add(time.Minute), Lines: []counts.Line{{SKU: sku, Counted: 1}}},
		"before the horizon":   {CountID: "bad", CountedAt: time.Now().Add(-2 * time.Hour), Lines: []counts.Line{{SKU: sku, Counted: 1}}},
		"a negative offset":    {CountID: "bad", CountedAt: at, Offset: -1, Lines: []counts.Line{{SKU: sku, Counted: 1}}},
		"counted past the max": {CountID: "bad", CountedAt: at, Lines: []counts.Line{{SKU: sku, Counted: arbiter.MaxStock + 1}}},
	} {
		_, err := f.counts.Apply(f.ctx, req)
		require.ErrorIs(t, err, inventory.ErrInvalidArgument, name)
	}
	_, err := f.counts.Apply(f.ctx, counts.Request{CountID: "old", CountedAt: time.Now().Add(-2 * time.Hour),
		Lines: []counts.Line{{SKU: sku, Counted: 1}}})
	require.ErrorContains(t, err, "may be at most 1h55m0s back", "the error names the horizon")
	f.RequireQty(sku, 10, 0)
	require.EqualValues(t, 0, f.Count(`SELECT COUNT(*) FROM stock_counts`))
	require.EqualValues(t, 0, f.Count(`SELECT COUNT(*) FROM stock_count_batches`))
}

// A count no later than one a SKU took already is superseded for it
// (applying it would undo the later count or repeat it), under another
// count_id too; a later one rebases from the earlier's correction.
func TestCountSuperseded(t *testing.T) {
	f := newFixture(t, counts.Config{})
	sku := f.PutSKU("SUPER", 10, 0)
	early := instant()
	o := f.pay(f.order(sku, 1))
	f.settle(o)
	f.ship(o)
	late := instant()
	_, err := f.counts.Apply(f.ctx, counts.Request{CountID: "late", CountedAt: late, Lines: []counts.Line{{SKU: sku, Counted: 8}}})
	require.NoError(t, err)
	f.RequireQty(sku, 8, 0)
	for _, id := range []string{"early", "late-again"} {
		at := early
		if id == "late-again" {
			at = late
		}
		res, err := f.counts.Apply(f.ctx, counts.Request{CountID: id, CountedAt: at, Lines: []counts.Line{{SKU: sku, Counted: 3}}})
		require.NoError(t, err)
		require.Equal(t, arbiter.CountSuperseded, res.Lines[0].Outcome, id)
		require.Equal(t, 409, res.Lines[0].Status)
		f.RequireQty(sku, 8, 0)
	}
	// An admin's put after counted_at states the level later than the
	// count: it supersedes the count too.
	put := f.PutSKU("PUT", 10, 0)
	before := instant()
	_, err = f.Catalog.Put(f.ctx, put, 12, 0)
	require.NoError(t, err)
	res, err := f.counts.Apply(f.ctx, counts.Request{CountID: "before-put", CountedAt: before, Lines: []counts.Line{{SKU: put, Counted: 9}}})
	require.NoError(t, err)
	require.Equal(t, arbiter.CountSuperseded, res.Lines[0].Outcome)
	f.RequireQty(put, 12, 0)

	// Later: the shelf has 8, one more sale is deducted and shipped
	// after counting.
	later := instant()
	o = f.pay(f.order(sku, 2))
	f.settle(o)
	res, err = f.counts.Apply(f.ctx, counts.Request{CountID: "later", CountedAt: later, Lines: []counts.Line{{SKU: sku, Counted: 8}}})
	require.NoError(t, err)
	require.Equal(t, counts.Totals{Applied: 1, Unchanged: 1}, res.Totals, "the first count's correction is part of on_hand at the second's counted_at")
	require.Empty(t, res.Lines)
	f.RequireQty(sku, 6, 0)
}

// The embedded default (SQLite, miniredis) passes the same counts.
func TestEmbeddedContract(t *testing.T) {
	testrig.RunEmbedded(t, TestCountReplayedAndConflicting, TestCountRefusesBadInput, TestCountSuperseded, TestCountRebasedDuringSeckill,
		TestCountAnnouncesTheLevelsItMoved)
}

// A count read a minute or more after its counted_at answers the lines
// that change nothing from that read, without their SKUs' row locks (a
// sale holding the hot row does not hold the count up), and applies the
// others under theirs, exactly as ever.
func TestCountSettledLinesTakeNoLock(t *testing.T) {
	f := newFixture(t, counts.Config{})
	same, off := f.PutSKU("SAME", 50, 0), f.PutSKU("OFF", 50, 0)
	// Their history is older than counted_at, which is two minutes ago.
	require.NoError(t, f.DB.Exec(`UPDATE stock_movements SET created_at = ? WHERE sku IN ?`,
		time.Now().UTC().Add(-10*time.Minute), []string{same, off}).Error)
	at := time.Now().UTC().Add(-2 * time.Minute)
	o := f.pay(f.order(same, 4)) // sold since: the count is rebased over it
	f.settle(o)

	// Someone holds SAME's row lock while the count runs.
	tx := f.DB.Begin()
	var n int64
	require.NoError(t, tx.Raw(`SELECT on_hand FROM skus WHERE sku = ? FOR UPDATE`, same).Scan(&n).Error)
	ctx, cancel := context.WithTimeout(f.ctx, 5*time.Second)
	req := counts.Request{CountID: "settled", CountedAt: at, Lines: []counts.Line{
		{SKU: same, Counted: 50}, {SKU: off, Counted: 47}, {SKU: "NO-SUCH", Counted: 1}}}
	res, err := f.counts.Apply(ctx, req)
	cancel()
	require.NoError(t, tx.Rollback().Error)
	require.NoError(t, err, "SAME's line took no lock")
	require.Equal(t, counts.Totals{Applied: 3, Corrected: 1, Unchanged: 1, Unknown: 1, UnitsRemoved: 3}, res.Totals)
	require.Len(t, res.Lines, 2, "SAME's line is unchanged: in the totals only")
	require.Equal(t, arbiter.CountCorrected, res.Lines[0].Outcome)
	require.EqualValues(t, 2, res.Lines[0].Line)
	require.EqualValues(t, -3, res.Lines[0].Applied)
	require.Equal(t, arbiter.CountUnknown, res.Lines[1].Outcome)
	require.EqualValues(t, 3, res.Lines[1].Line)
	again, err := f.counts.Apply(f.ctx, req)
	require.NoError(t, err)
	require.Equal(t, res, again, "a replay is answered from the batch's record as the first time")
	f.RequireQty(same, 46, 0)
	f.RequireQty(off, 47, 0)
	f.CheckInvariant(off)
}

// A count announces the levels of the SKUs it moved itself, in its
// transaction (sku.level_changed after its sku.shortage, before the
// threshold events, in seq order), and leaves a SKU announced within the
// last second to the events job, as a sale does.
func TestCountAnnouncesTheLevelsItMoved(t *testing.T) {
	f := newFixture(t, counts.Config{})
	sku := f.PutSKU("LVL", 10, 0)
	f.order(sku, 4)
	type event struct {
		Type                      string
		Seq, OnHand, Reserved, Av int64
		Short                     *int64
	}
	events := func() []event {
		var out []event
		rows, err := f.DB.Raw(`SELECT type, seq, on_hand, reserved, available, short FROM stock_events WHERE sku = ? ORDER BY row_id`, sku).Rows()
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var e event
			require.NoError(t, rows.Scan(&e.Type, &e.Seq, &e.OnHand, &e.Reserved, &e.Av, &e.Short))
			out = append(out, e)
		}
		return out
	}
	dirty := func() (bool, bool) {
		var d int64
		var at *time.Time
		require.NoError(t, f.DB.Raw(`SELECT level_dirty, level_at FROM skus WHERE sku = ?`, sku).Row().Scan(&d, &at))
		return d == 1, at != nil
	}
	before := events()
	var seq int64
	require.NoError(t, f.DB.Raw(`SELECT event_seq FROM skus WHERE sku = ?`, sku).Scan(&seq).Error)

	// 2 counted, 4 held: on_hand goes to 4, 2 short.
	res, err := f.counts.Apply(f.ctx, counts.Request{CountID: "lvl-1", CountedAt: instant(), Lines: []counts.Line{{SKU: sku, Counted: 2}}})
	require.NoError(t, err)
	require.Equal(t, arbiter.CountShort, res.Lines[0].Outcome)
	got := events()[len(before):]
	require.Equal(t, []event{
		{Type: arbiter.EventShortage, Seq: seq + 1, OnHand: 4, Reserved: 4, Av: 0, Short: ptr[int64](2)},
		{Type: arbiter.EventLevelChanged, Seq: seq + 2, OnHand: 4, Reserved: 4, Av: 0},
		{Type: arbiter.EventSoldOut, Seq: seq + 3, OnHand: 4, Reserved: 4, Av: 0},
	}, got)
	isDirty, announced := dirty()
	require.False(t, isDirty, "announced: nothing left for the events job")
	require.True(t, announced)

	// Within the second: the events job announces it, no sooner.
	res, err = f.counts.Apply(f.ctx, counts.Request{CountID: "lvl-2", CountedAt: instant(), Lines: []counts.Line{{SKU: sku, Counted: 5}}})
	require.NoError(t, err)
	require.Equal(t, arbiter.CountCorrected, res.Lines[0].Outcome)
	got = events()[len(before)+3:]
	require.Equal(t, []event{{Type: arbiter.EventBackInStock, Seq: seq + 4, OnHand: 5, Reserved: 4, Av: 1}}, got)
	isDirty, _ = dirty()
	require.True(t, isDirty, "marked for the events job")
	var n int64
	require.NoError(t, f.DB.Raw(`SELECT event_seq FROM skus WHERE sku = ?`, sku).Scan(&n).Error)
	require.Equal(t, seq+4, n, "the SKU's event seq is its last event's")
}
