package followup_test

// The follow-ups that bring what the database decided into Redis, on the
// real MariaDB and Redis (testkit/testrig): the database's records are
// written through the arbiter, as the write paths write them, and Redis is
// read back exactly.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/followup"
	"github.com/acme/inventory/stock"
	"github.com/acme/inventory/testkit/testenv"
	"github.com/acme/inventory/testkit/testrig"
)

// fixture is a rig, its follow-ups, what they log and a count of the
// commands its Redis client sends.
type fixture struct {
	*testrig.Rig
	f    followup.Redis
	logs *testenv.Logs
	sent *atomic.Int64
}

func newFixture(t *testing.T) *fixture {
	r := testrig.New(t, testrig.MemoryTransport(t))
	l := &testenv.Logs{}
	return &fixture{Rig: r, f: followup.Redis{Stock: r.Stock, Log: slog.New(slog.NewTextHandler(l, nil))}, logs: l,
		sent: testenv.CountCommands(r.RDB)}
}

// quiet asserts fn sends no command to Redis.
func (x *fixture) quiet(fn func()) {
	x.T.Helper()
	before := x.sent.Load()
	fn()
	require.Equal(x.T, before, x.sent.Load(), "no command reached Redis")
}

// levels is what Redis holds for sku, without initialising it.
func (x *fixture) levels(sku string) stock.Levels {
	x.T.Helper()
	lv, err := x.Stock.Levels(context.Background(), sku)
	require.NoError(x.T, err)
	return lv
}

// admit takes qty of sku in Redis as an order line does and checks what
// is left.
func (x *fixture) admit(sku string, qty, left int64) stock.Admission {
	x.T.Helper()
	adm, err := x.Stock.Admit(context.Background(), sku, qty, "")
	require.NoError(x.T, err)
	require.Equal(x.T, left, adm.Remaining)
	return adm
}

// record writes HELD reservations of lines under token through the arbiter
// (as the group commit does) and returns the database's fences.
func (x *fixture) record(token string, lines ...inventory.Line) map[string]arbiter.Fence {
	x.T.Helper()
	return x.recordFor(token, "", lines...)
}

// release releases token's holds in the database and returns the changes
// for Redis.
func (x *fixture) release(token string) []inventory.Change {
	x.T.Helper()
	var freed arbiter.Freed
	require.NoError(x.T, x.DB.Transaction(func(tx *gorm.DB) error {
		var err error
		freed, err = arbiter.In(tx).Release(token, "")
		return err
	}))
	require.NotEmpty(x.T, freed.Changes)
	return freed.Changes
}

// inflate gives Redis n units of sku the database never had (a change no
// initialisation saw, as a Redis restored from an old snapshot has).
func (x *fixture) inflate(sku string, n int64) {
	x.T.Helper()
	ctx := context.Background()
	lv := x.levels(sku)
	require.NoError(x.T, x.Stock.Apply(ctx, inventory.Change{SKU: sku, Delta: n, Seq: lv.Seq + 1_000_000}))
	require.Equal(x.T, lv.Available+n, x.levels(sku).Available)
}

// Settle: an admission whose reservation committed in the admission's own
// Redis epoch sends nothing; one taken from a value that was re-initialised
// before the commit (the new value read a database without it) is taken
// again from the new value, once; one whose re-initialisation came after the
// commit (the new value counted it) is not taken twice. An admission of an
// unlimited value is settled the same way once the SKU got a limit.
func TestSettleTakesAnAdmissionAcrossAReinitOnce(t *testing.T) {
	x := newFixture(t)
	ctx := context.Background()
	x.AddSKU("A", 10)
	x.AddSKU("B", 10)

	adm := x.admit("A", 3, 7)
	fences := x.record("x1", inventory.Line{SKU: "A", Qty: 3})
	require.Equal(t, adm.Epoch, fences["A"].Epoch, "no re-init: the database knows the admission's epoch")
	x.quiet(func() { x.f.Settle(ctx, "x1", testrig.Line("A", 3), []stock.Admission{adm}, fences, "", false) })
	require.EqualValues(t, 7, x.levels("A").Available)
	x.CheckInvariant("A")

	// Re-initialised between the admission and the commit.
	adm = x.admit("A", 2, 5)
	require.NoError(t, x.Stock.Realign(ctx, "A"))
	require.EqualValues(t, 7, x.levels("A").Available, "the new value lacks the uncommitted admission")
	fences = x.record("x2", inventory.Line{SKU: "A", Qty: 2})
	require.NotEqual(t, adm.Epoch, fences["A"].Epoch)
	x.f.Settle(ctx, "x2", testrig.Line("A", 2), []stock.Admission{adm}, fences, "", false)
	require.EqualValues(t, 5, x.levels("A").Available, "taken from the new value")
	x.CheckInvariant("A")

	// Re-initialised after the commit.
	adm = x.admit("A", 1, 4)
	fences = x.record("x3", inventory.Line{SKU: "A", Qty: 1})
	require.NoError(t, x.Stock.Realign(ctx, "A"))
	require.EqualValues(t, 4, x.levels("A").Available, "the new value counted the reservation")
	require.NotEqual(t, adm.Epoch, x.levels("A").Epoch)
	x.f.Settle(ctx, "x3", testrig.Line("A", 1), []stock.Admission{adm}, fences, "", false)
	require.EqualValues(t, 4, x.levels("A").Available, "not taken twice")
	x.CheckInvariant("A")

	// A cart: only the line whose SKU was re-initialised is taken again.
	admA, admB := x.admit("A", 1, 3), x.admit("B", 4, 6)
	require.NoError(t, x.Stock.Realign(ctx, "B"))
	require.EqualValues(t, 10, x.levels("B").Available)
	cart := []inventory.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 4}}
	fences = x.record("x4", cart...)
	x.f.Settle(ctx, "x4", cart, []stock.Admission{admA, admB}, fences, "", false)
	require.EqualValues(t, 3, x.levels("A").Available)
	require.EqualValues(t, 6, x.levels("B").Available)
	x.CheckInvariant("A")
	x.CheckInvariant("B")

	// An unlimited value's admission took nothing; the SKU gets a limit (and
	// Redis a new epoch from the database) before the reservation commits.
	x.AddSKU("U", inventory.Unlimited)
	adm = x.admit("U", 2, inventory.Unlimited)
	fences = x.record("x5", inventory.Line{SKU: "U", Qty: 2})
	x.quiet(func() { x.f.Settle(ctx, "x5", testrig.Line("U", 2), []stock.Admission{adm}, fences, "", false) })
	require.EqualValues(t, inventory.Unlimited, x.levels("U").Available, "still unlimited: nothing to settle")
	adm = x.admit("U", 3, inventory.Unlimited)
	require.NoError(t, x.DB.Transaction(func(tx *gorm.DB) error { return arbiter.In(tx).Set("U", arbiter.Settings{OnHand: 10}, nil) }))
	require.NoError(t, x.Stock.Realign(ctx, "U"))
	require.EqualValues(t, 8, x.levels("U").Available, "10 on hand, the first reservation's 2 reserved")
	fences = x.record("x6", inventory.Line{SKU: "U", Qty: 3})
	x.f.Settle(ctx, "x6", testrig.Line("U", 3), []stock.Admission{adm}, fences, "", false)
	require.EqualValues(t, 5, x.levels("U").Available)
	x.CheckInvariant("U")
	require.Empty(t, x.logs.String())
}

// Refused: the database refusing what Redis admitted (RefusedError, however
// wrapped) realigns the SKU, also when the caller has gone, and is the
// caller's insufficient stock; an unknown SKU and a buyer over the limit are
// the database's answer, returned unchanged; anything else is a failed
// write. Only the refusal touches Redis.
func TestRefusedRealignsAndPassesTheRestThrough(t *testing.T) {
	x := newFixture(t)
	ctx := context.Background()
	x.AddSKU("F", 5)
	require.EqualValues(t, 5, x.RedisAvailable("F"))

	x.inflate("F", 10)
	err := x.f.Refused(ctx, fmt.Errorf("group commit: %w", arbiter.RefusedError{SKU: "F"}), false)
	require.ErrorIs(t, err, inventory.ErrInsufficientStock)
	require.EqualError(t, err, inventory.ErrInsufficientStock.Error()+": F")
	var refused arbiter.RefusedError
	require.False(t, errors.As(err, &refused), "the caller's error is insufficient stock, not the database's refusal")
	require.EqualValues(t, 5, x.levels("F").Available, "realigned from the database")
	require.Contains(t, x.logs.String(), "the database refused what Redis admitted; realigning")
	x.CheckInvariant("F")

	x.inflate("F", 3)
	gone, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, x.f.Refused(gone, arbiter.RefusedError{SKU: "F"}, false), inventory.ErrInsufficientStock)
	require.EqualValues(t, 5, x.levels("F").Available, "the realign ran although the caller left")
	x.CheckInvariant("F")

	x.quiet(func() {
		for _, in := range []error{
			inventory.UnknownSKU("NOPE"),
			errors.Join(nil, inventory.UnknownSKU("NOPE")), // as the arbiter returns it
			arbiter.OverLimitError{SKU: "F", User: "u", Limit: 1},
			fmt.Errorf("write: %w", arbiter.OverLimitError{SKU: "F", User: "u", Limit: 1}),
		} {
			out := x.f.Refused(ctx, in, false)
			require.Equal(t, in, out, "%v passes through unchanged", in)
			require.False(t, errors.Is(out, inventory.ErrInsufficientStock))
		}
		boom := errors.New("connection lost")
		err := x.f.Refused(ctx, boom, false)
		require.ErrorIs(t, err, boom)
		require.EqualError(t, err, "order: write: connection lost")
		require.False(t, errors.Is(err, inventory.ErrInsufficientStock))
	})
	require.EqualValues(t, 5, x.levels("F").Available)
}

// Apply brings committed changes into Redis under stock.FollowUp's context:
// after the caller's context was cancelled, or its deadline just passed, the
// changes still land; past the deadline's grace the follow-up ends, logged
// and not returned, and the realign repairs Redis.
func TestApplyLandsAfterTheCallerLeft(t *testing.T) {
	x := newFixture(t)
	ctx := context.Background()
	x.AddSKU("A", 10)
	x.AddSKU("B", 10)

	hold := func(token string, qtyA, qtyB int64) {
		t.Helper()
		a, b := x.admit("A", qtyA, x.levels("A").Available-qtyA), x.admit("B", qtyB, x.levels("B").Available-qtyB)
		cart := []inventory.Line{{SKU: "A", Qty: qtyA}, {SKU: "B", Qty: qtyB}}
		x.f.Settle(ctx, token, cart, []stock.Admission{a, b}, x.record(token, cart...), "", false)
	}
	require.EqualValues(t, 10, x.RedisAvailable("A"))
	require.EqualValues(t, 10, x.RedisAvailable("B"))

	hold("x1", 3, 1)
	chs := x.release("x1")
	gone, cancel := context.WithCancel(ctx)
	cancel()
	x.f.Apply(gone, chs)
	require.EqualValues(t, 10, x.levels("A").Available)
	require.EqualValues(t, 10, x.levels("B").Available)
	x.CheckInvariant("A")
	x.CheckInvariant("B")

	hold("x2", 2, 2)
	chs = x.release("x2")
	ended, cancel := context.WithDeadline(ctx, time.Now())
	defer cancel()
	<-ended.Done()
	x.f.Apply(ended, chs)
	require.EqualValues(t, 10, x.levels("A").Available, "within the grace after the deadline")
	require.EqualValues(t, 10, x.levels("B").Available)
	require.Empty(t, x.logs.String())

	hold("x3", 4, 5)
	chs = x.release("x3")
	long, cancel := context.WithDeadline(ctx, time.Now().Add(-2*stock.FollowUpGrace))
	defer cancel()
	x.f.Apply(long, chs)
	require.EqualValues(t, 6, x.levels("A").Available, "the follow-up ended with its grace: Redis still lacks the units")
	require.EqualValues(t, 5, x.levels("B").Available)
	require.Equal(t, 2, strings.Count(x.logs.String(), "bringing a committed change into Redis failed; the realign repairs it"),
		"each change's failure is logged: %s", x.logs.String())
	skus, err := x.Reconciler().Realign(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"A", "B"}, skus)
	x.CheckInvariant("A")
	x.CheckInvariant("B")

	x.quiet(func() { x.f.Apply(ctx, nil) })
}

// recordFor writes HELD reservations of lines under token for buyer through
// the arbiter (as the group commit does: the buyer counts against the SKU's
// per-user limit) and returns the database's fences.
func (x *fixture) recordFor(token, buyer string, lines ...inventory.Line) map[string]arbiter.Fence {
	x.T.Helper()
	now := time.Now().UTC().Truncate(time.Microsecond)
	holds := make([]arbiter.Hold, len(lines))
	for i, l := range lines {
		holds[i] = arbiter.Hold{Buyer: buyer, Row: arbiter.Reservation{Token: token, SKU: l.SKU, Qty: l.Qty, State: arbiter.Held,
			ExpiresAt: now.Add(time.Minute), CreatedAt: now, UpdatedAt: now}}
	}
	var fences map[string]arbiter.Fence
	require.NoError(x.T, x.DB.Transaction(func(tx *gorm.DB) error {
		var err error
		fences, err = arbiter.In(tx).Reserve(holds)
		return err
	}))
	return fences
}

// The buyers' counts in Redis follow buyer_quotas under the stock's fence:
// an admission's count is settled like its units (once, whichever side of a
// re-init its commit lands), a refused admission's count goes back only
// into its own initialisation, a release's count comes back once (not
// again when an initialisation read it), and units the database counted
// that no admission counted (an order placed outside the seckill) are
// counted when they commit, unless an initialisation read them.
func TestBuyersCountsFollowTheFence(t *testing.T) {
	x := newFixture(t)
	ctx := context.Background()
	sku := x.PutSKU("LIM", 10, 3)
	buyers := "inv:{" + sku + "}:buyers"
	counted := func(user string) string {
		t.Helper()
		v, err := x.RDB.HGet(ctx, buyers, user).Result()
		if errors.Is(err, redis.Nil) {
			return "none"
		}
		require.NoError(t, err)
		return v
	}
	seckill := func(user string) stock.Admission {
		t.Helper()
		adm, err := x.Stock.AdmitBuyer(ctx, sku, 1, stock.Buyer{User: user, Limit: 3})
		require.NoError(t, err)
		return adm
	}
	one := testrig.Line(sku, 1)

	// In the admission's own initialisation: the admission counted it.
	adm := seckill("u")
	f := x.recordFor("o1", "u", one...)
	require.EqualValues(t, 3, f[sku].Limit, "the database counted the buyer")
	x.quiet(func() { x.f.Settle(ctx, "o1", one, []stock.Admission{adm}, f, "u", true) })
	require.Equal(t, "1", counted("u"))

	// Re-initialised between the admission and the commit: the new
	// initialisation read the database without it; Settle counts it once.
	adm = seckill("u")
	require.Equal(t, "2", counted("u"))
	require.NoError(t, x.Stock.Realign(ctx, sku))
	require.Equal(t, "1", counted("u"), "the database's count")
	f = x.recordFor("o2", "u", one...)
	x.f.Settle(ctx, "o2", one, []stock.Admission{adm}, f, "u", true)
	require.Equal(t, "2", counted("u"))
	require.EqualValues(t, 8, x.levels(sku).Available)

	// Re-initialised after the commit: read by the initialisation, not counted again.
	adm = seckill("u")
	f = x.recordFor("o3", "u", one...)
	require.NoError(t, x.Stock.Realign(ctx, sku))
	x.f.Settle(ctx, "o3", one, []stock.Admission{adm}, f, "u", true)
	require.Equal(t, "3", counted("u"))
	require.EqualValues(t, 7, x.levels(sku).Available)
	_, err := x.Stock.AdmitBuyer(ctx, sku, 1, stock.Buyer{User: "u", Limit: 3})
	require.ErrorIs(t, err, inventory.ErrOverLimit)

	// A refused admission: its count goes back into its own initialisation,
	// and not into a later one (which read the database, without it).
	adm = seckill("v")
	require.NoError(t, x.Stock.UndoBuyer(ctx, sku, 1, adm, "v"))
	require.Equal(t, "none", counted("v"))
	require.EqualValues(t, 7, x.levels(sku).Available)
	adm = seckill("v")
	x.quiet(func() { x.f.Settle(ctx, "ov", one, []stock.Admission{adm}, x.recordFor("ov", "v", one...), "v", true) })
	adm = seckill("v")
	require.Equal(t, "2", counted("v"))
	require.NoError(t, x.Stock.Realign(ctx, sku))
	require.Equal(t, "1", counted("v"), "the database's count")
	require.NoError(t, x.Stock.UndoBuyer(ctx, sku, 1, adm, "v"))
	require.Equal(t, "1", counted("v"), "nothing given back into the new initialisation")
	require.EqualValues(t, 6, x.levels(sku).Available)

	// A release gives the buyer's units back once, also after the caller
	// left; not again when an initialisation read the release.
	chs := x.release("o1")
	require.Equal(t, map[string]int64{"u": -1}, chs[0].Buyers)
	gone, cancel := context.WithCancel(ctx)
	cancel()
	x.f.Apply(gone, chs)
	require.Equal(t, "2", counted("u"))
	require.EqualValues(t, 7, x.levels(sku).Available)
	chs = x.release("o2")
	require.NoError(t, x.Stock.Realign(ctx, sku))
	x.f.Apply(ctx, chs)
	require.Equal(t, "1", counted("u"))
	require.EqualValues(t, 8, x.levels(sku).Available)

	// An order placed outside the seckill (admitted without the limit): the
	// database counted it, so Redis counts it when it commits ...
	adm = x.admit(sku, 2, 6)
	f = x.recordFor("o4", "w", testrig.Line(sku, 2)...)
	x.f.Settle(ctx, "o4", testrig.Line(sku, 2), []stock.Admission{adm}, f, "w", false)
	require.Equal(t, "2", counted("w"))
	// ... and not twice when an initialisation read it first.
	adm = x.admit(sku, 1, 5)
	f = x.recordFor("o5", "w", one...)
	require.NoError(t, x.Stock.Realign(ctx, sku))
	x.f.Settle(ctx, "o5", one, []stock.Admission{adm}, f, "w", false)
	require.Equal(t, "3", counted("w"))
	require.EqualValues(t, 5, x.levels(sku).Available)

	require.Equal(t, x.Quota(sku, "u"), int64(1))
	require.Equal(t, x.Quota(sku, "w"), int64(3))
	reports, err := x.Reconciler().Reconcile(ctx, false)
	require.NoError(t, err)
	require.Empty(t, reports, "Redis agrees with the database, counts included")
	require.Empty(t, x.logs.String())
	x.CheckInvariant(sku)
}

// recordBatch writes each token's HELD reservation of its line through the
// arbiter in one call, as one group commit does for its batch: the batch
// moves each SKU once, so its reservations share the SKU's fence.
func (x *fixture) recordBatch(buyer map[string]string, lines map[string]inventory.Line) map[string]arbiter.Fence {
	x.T.Helper()
	now := time.Now().UTC().Truncate(time.Microsecond)
	var holds []arbiter.Hold
	for _, token := range slices.Sorted(maps.Keys(lines)) {
		l := lines[token]
		holds = append(holds, arbiter.Hold{Buyer: buyer[token], Row: arbiter.Reservation{Token: token, SKU: l.SKU, Qty: l.Qty,
			State: arbiter.Held, ExpiresAt: now.Add(time.Minute), CreatedAt: now, UpdatedAt: now}})
	}
	var fences map[string]arbiter.Fence
	require.NoError(x.T, x.DB.Transaction(func(tx *gorm.DB) error {
		var err error
		fences, err = arbiter.In(tx).Reserve(holds)
		return err
	}))
	return fences
}

// One group commit moves a SKU once for its whole batch, so its
// reservations' changes share one seq; each is named by its reservation's
// token. Admitted from a value re-initialised before the batch committed,
// each reservation is taken again from the new value once, however often
// its follow-up is delivered; and an order's two changes at that seq (its
// units, and the count of a buyer its admission did not count) both land.
func TestSettleTellsApartTheChangesOfABatch(t *testing.T) {
	x := newFixture(t)
	ctx := context.Background()
	sku := x.PutSKU("BATCH", 10, 5)
	counted := func(user string) string {
		t.Helper()
		v, err := x.RDB.HGet(ctx, "inv:{"+sku+"}:buyers", user).Result()
		if errors.Is(err, redis.Nil) {
			return "none"
		}
		require.NoError(t, err)
		return v
	}
	a1, a2 := x.admit(sku, 1, 9), x.admit(sku, 2, 7)
	require.NoError(t, x.Stock.Realign(ctx, sku))
	require.EqualValues(t, 10, x.levels(sku).Available, "the new value lacks both uncommitted admissions")
	fences := x.recordBatch(map[string]string{"b2": "w"},
		map[string]inventory.Line{"b1": {SKU: sku, Qty: 1}, "b2": {SKU: sku, Qty: 2}})
	for range 2 {
		x.f.Settle(ctx, "b1", testrig.Line(sku, 1), []stock.Admission{a1}, fences, "", false)
		x.f.Settle(ctx, "b2", testrig.Line(sku, 2), []stock.Admission{a2}, fences, "w", false)
	}
	require.EqualValues(t, 7, x.levels(sku).Available, "each reservation taken once")
	require.Equal(t, "2", counted("w"), "the buyer's units counted once")
	reports, err := x.Reconciler().Reconcile(ctx, false)
	require.NoError(t, err)
	require.Empty(t, reports, "Redis agrees with the database, counts included")
	require.Empty(t, x.logs.String())
	x.CheckInvariant(sku)
}

// TestEmbeddedContract runs the follow-ups' tests again on the embedded
// default's stand-ins (SQLite, miniredis).
func TestEmbeddedContract(t *testing.T) {
	testrig.RunEmbedded(t,
		TestSettleTakesAnAdmissionAcrossAReinitOnce,
		TestRefusedRealignsAndPassesTheRestThrough,
		TestApplyLandsAfterTheCallerLeft,
		TestBuyersCountsFollowTheFence,
		TestSettleTellsApartTheChangesOfABatch,
	)
}
