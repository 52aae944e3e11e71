package stock

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/testkit/testenv"
)

func TestAdmitResults(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		db := newFakeDB(map[string]int64{"A": 10, "U": inventory.Unlimited})
		s := newStore(t, rdb, db)

		a, err := s.Admit(ctx, "A", 3, "")
		require.NoError(t, err)
		require.EqualValues(t, 7, a.Remaining)
		require.Equal(t, db.epoch["A"], a.Epoch, "the admission names the initialisation it took from")

		_, err = s.Admit(ctx, "A", 8, "")
		require.ErrorIs(t, err, inventory.ErrInsufficientStock)
		require.EqualValues(t, 7, levels(t, s, "A").Available, "a refused admission takes nothing")

		a, err = s.Admit(ctx, "A", 7, "")
		require.NoError(t, err)
		require.EqualValues(t, 0, a.Remaining)

		a, err = s.Admit(ctx, "U", 1000, "")
		require.NoError(t, err)
		require.Equal(t, inventory.Unlimited, a.Remaining)
		require.True(t, levels(t, s, "U").Unlimited)

		_, err = s.Admit(ctx, "NOPE", 1, "")
		require.ErrorIs(t, err, inventory.ErrUnknownSKU)
		require.EqualValues(t, 3, db.calls.Load(), "one cold init per SKU")
		require.EqualValues(t, 2, s.Stats().Deducted.Load())
		require.EqualValues(t, 1, s.Stats().Insufficient.Load())
	})
}

func TestScriptResultCodes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		run := func(sku, token string, qty int64) []int64 {
			ttl := 0
			if token != "" {
				ttl = 60_000
			}
			r, err := deductScript.Run(ctx, rdb, admitKeys(sku, token), qty, ttl).Int64Slice()
			require.NoError(t, err)
			return r
		}
		require.Equal(t, []int64{-3, 0}, run("S", "", 1), "key not initialised")
		require.NoError(t, rdb.HSet(ctx, stockKey("S"), "a", 2, "e", 7, "s", 0).Err())
		require.Equal(t, []int64{-2, 7}, run("S", "", 3), "not enough")
		require.Equal(t, []int64{1, 7}, run("S", "t1", 1), "what remains")
		require.Equal(t, []int64{-4, 7}, run("S", "t1", 1), "a token seen before takes nothing")
		require.Equal(t, []int64{0, 7}, run("S", "", 1))
		require.NoError(t, rdb.HSet(ctx, stockKey("U"), "a", -1, "e", 8, "s", 0).Err())
		require.Equal(t, []int64{-1, 8}, run("U", "", 5), "unlimited")
	})
}

func TestBadInputTouchesNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		db := newFakeDB(map[string]int64{"A": 10})
		s := newStore(t, rdb, db)
		cases := []struct {
			sku, token string
			qty        int64
		}{
			{"A", "", 0},
			{"A", "", -1},
			{"A", "", inventory.DefaultMaxQty + 1},
			{"A", "", 1 << 62},
			{"", "", 1},
			{"A{x}", "", 1},
			{"A B", "", 1},
			{strings.Repeat("a", 65), "", 1},
			{"A", "t k", 1},
			{"A", strings.Repeat("t", 141), 1},
			{"A", "t\n", 1},
		}
		for _, c := range cases {
			_, err := s.Admit(ctx, c.sku, c.qty, c.token)
			require.ErrorIs(t, err, inventory.ErrInvalidArgument, "%+v", c)
			if c.token == "" {
				require.ErrorIs(t, s.Undo(ctx, c.sku, c.qty, Admission{Epoch: 1}, ""), inventory.ErrInvalidArgument, "%+v", c)
			}
		}
		require.ErrorIs(t, s.Apply(ctx, inventory.Change{SKU: "A B", Delta: 1, Seq: 1}), inventory.ErrInvalidArgument)
		require.ErrorIs(t, s.Realign(ctx, "A{x}"), inventory.ErrInvalidArgument)
		_, err := s.AdmitCart(ctx, []inventory.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 0}})
		require.ErrorIs(t, err, inventory.ErrInvalidArgument)
		_, err = s.NormaliseCart(nil)
		require.ErrorIs(t, err, inventory.ErrInvalidArgument)
		_, err = s.NormaliseCart([]inventory.Line{{SKU: "A", Qty: inventory.DefaultMaxQty}, {SKU: "A", Qty: 1}})
		require.ErrorIs(t, err, inventory.ErrInvalidArgument, "merged lines are bounded too")

		require.EqualValues(t, 0, db.calls.Load(), "no cold init was attempted")
		n, err := rdb.Exists(ctx, stockKey("A"), tokenKey("A", "t")).Result()
		require.NoError(t, err)
		require.EqualValues(t, 0, n, "Redis was not touched")
	})
}

// A token-API token is remembered so a replay takes nothing; undoing its
// admission (the database refused it) forgets it so it may try again.
func TestTokenReplay(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		s := newStore(t, rdb, newFakeDB(map[string]int64{"A": 10}))
		a, err := s.Admit(ctx, "A", 3, "t.c1")
		require.NoError(t, err)
		require.EqualValues(t, 7, a.Remaining)
		for i := 0; i < 3; i++ {
			_, err = s.Admit(ctx, "A", 3, "t.c1")
			require.ErrorIs(t, err, inventory.ErrReplay)
		}
		require.EqualValues(t, 7, levels(t, s, "A").Available, "replays took nothing")
		ttl, err := rdb.PTTL(ctx, tokenKey("A", "t.c1")).Result()
		require.NoError(t, err)
		require.Greater(t, ttl, 15*time.Minute, "the token is remembered as long as a hold lives")

		require.NoError(t, s.Undo(ctx, "A", 3, a, "t.c1"))
		require.EqualValues(t, 10, levels(t, s, "A").Available)
		a, err = s.Admit(ctx, "A", 3, "t.c1")
		require.NoError(t, err, "an undone token may reserve again")
		require.EqualValues(t, 7, a.Remaining)
	})
}

// An admission is undone only into the initialisation it was taken from:
// after a re-init the value came from the database, which never had it.
func TestUndoOnlyIntoItsEpoch(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		db := newFakeDB(map[string]int64{"A": 10})
		s := newStore(t, rdb, db)
		a1, err := s.Admit(ctx, "A", 2, "")
		require.NoError(t, err)
		a2, err := s.Admit(ctx, "A", 3, "")
		require.NoError(t, err)
		require.NoError(t, s.Undo(ctx, "A", 2, a1, ""))
		require.EqualValues(t, 7, levels(t, s, "A").Available, "same epoch: given back")

		require.NoError(t, s.Realign(ctx, "A")) // the database never recorded a2: 10
		require.EqualValues(t, 10, levels(t, s, "A").Available)
		require.NoError(t, s.Undo(ctx, "A", 3, a2, ""))
		require.EqualValues(t, 10, levels(t, s, "A").Available, "another epoch: nothing given back")

		a3, err := s.Admit(ctx, "A", 1, "")
		require.NoError(t, err)
		require.NoError(t, b.Flush(ctx, rdb))
		require.NoError(t, s.Undo(ctx, "A", 1, a3, ""))
		n, err := rdb.Exists(ctx, stockKey("A")).Result()
		require.NoError(t, err)
		require.Zero(t, n, "an undo never recreates a lost key")
	})
}

// Apply brings a committed change in exactly once, whichever way it races
// an initialisation.
func TestApplyFencing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		db := newFakeDB(map[string]int64{"A": 10, "U": inventory.Unlimited})
		s := newStore(t, rdb, db)
		require.EqualValues(t, 10, levels(t, s, "A").Available)

		// A release committed after the init read (seq 1 > init seq 0): added.
		db.reserved["A"] = 4 // as if 4 were reserved before; not used by Redis here
		require.NoError(t, s.Apply(ctx, inventory.Change{SKU: "A", Delta: 2, Seq: 1}))
		require.EqualValues(t, 12, levels(t, s, "A").Available)
		// A change the init already read (seq <= init seq): skipped.
		require.NoError(t, s.Realign(ctx, "A")) // reads seq 0 again: 6
		db.seq["A"] = 5
		require.NoError(t, s.Realign(ctx, "A")) // init seq 5
		require.EqualValues(t, 6, levels(t, s, "A").Available)
		require.NoError(t, s.Apply(ctx, inventory.Change{SKU: "A", Delta: 2, Seq: 5}))
		require.NoError(t, s.Apply(ctx, inventory.Change{SKU: "A", Delta: 2, Seq: 3}))
		require.EqualValues(t, 6, levels(t, s, "A").Available, "counted by the init")
		// A reservation taken from this very initialisation: already in the value.
		lv := levels(t, s, "A")
		require.NoError(t, s.Apply(ctx, inventory.Change{SKU: "A", Delta: -1, Seq: 9, Epoch: lv.Epoch}))
		require.EqualValues(t, 6, levels(t, s, "A").Available)
		// ... and one taken from an older initialisation: taken again.
		require.NoError(t, s.Apply(ctx, inventory.Change{SKU: "A", Delta: -1, Seq: 9, Epoch: lv.Epoch + 1}))
		require.EqualValues(t, 5, levels(t, s, "A").Available)

		// Below zero: Redis was wrong; the SKU is realigned from the database.
		realigns := s.Stats().Realigns.Load()
		require.NoError(t, s.Apply(ctx, inventory.Change{SKU: "A", Delta: -50, Seq: 10}))
		require.Equal(t, realigns+1, s.Stats().Realigns.Load())
		require.Equal(t, db.available("A"), levels(t, s, "A").Available)

		// Unlimited stays unlimited; a lost key is not recreated.
		require.NoError(t, s.Apply(ctx, inventory.Change{SKU: "U", Delta: -5, Seq: 99}))
		require.True(t, levels(t, s, "U").Unlimited)
		require.NoError(t, b.Flush(ctx, rdb))
		require.NoError(t, s.Apply(ctx, inventory.Change{SKU: "A", Delta: 3, Seq: 99}))
		n, err := rdb.Exists(ctx, stockKey("A")).Result()
		require.NoError(t, err)
		require.Zero(t, n)
	})
}

// The whole protocol under fire: buyers, releases, re-inits (realign and key
// loss) all racing, with a pause between every step. The database never
// oversells (it is the arbiter), and once the re-inits stop Redis equals the
// database exactly: every change was counted once, by an init or by itself.
// Refusals do not realign here, so nothing heals a miscount.
func TestProtocolRacesReinit(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		const stocked = 300
		db := newFakeDB(map[string]int64{"HOT": stocked})
		db.beforeWrite = latency // an init takes a while between its read and its write
		var stores []*Store
		for node := 0; node < 3; node++ {
			stores = append(stores, newStore(t, rdb, db))
		}
		var sold, ops atomic.Int64
		trade := func(rounds int) {
			var wg sync.WaitGroup
			for w := 0; w < 48; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s := stores[w%len(stores)]
					for a := 0; a < rounds; a++ {
						ops.Add(1)
						q := 1 + rand.Int64N(3)
						ok, err := buy(ctx, s, db, "HOT", q, false)
						if err != nil {
							t.Error(err)
							return
						}
						if !ok {
							continue
						}
						sold.Add(q)
						if rand.IntN(2) == 0 { // cancel: give it back
							if err := giveBack(ctx, s, db, "HOT", q); err != nil {
								t.Error(err)
								return
							}
							sold.Add(-q)
						}
					}
				}()
			}
			wg.Wait()
		}
		var chaos sync.WaitGroup
		chaos.Add(1)
		go func() { // realigns and key losses during the first half of the trading
			defer chaos.Done()
			for i := 0; ops.Load() < 48*100/2; i++ {
				time.Sleep(time.Duration(200+rand.IntN(800)) * time.Microsecond)
				var err error
				if i%4 == 3 {
					err = b.Flush(ctx, rdb)
				} else {
					err = stores[i%len(stores)].Realign(ctx, "HOT")
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
		db.mu.Lock()
		db.onHand["HOT"] = 100_000 // plenty while re-inits race every step
		db.mu.Unlock()
		require.NoError(t, stores[0].Realign(ctx, "HOT"))
		trade(100) // the re-inits stop half way: what they miscounted would stay
		chaos.Wait()
		require.Greater(t, db.calls.Load(), int64(20), "the race did re-initialise")
		lv, err := stores[0].Levels(ctx, "HOT")
		require.NoError(t, err)
		if lv.Initialised {
			require.Equal(t, db.available("HOT"), lv.Available, "after the re-init storm, with no repair")
		}

		// Now the scarce phase, no re-inits: the sale runs into the ground.
		db.mu.Lock()
		db.onHand["HOT"] = db.reserved["HOT"] + stocked
		db.mu.Unlock()
		require.NoError(t, stores[0].Realign(ctx, "HOT"))
		base := sold.Load()
		trade(40)
		require.LessOrEqual(t, sold.Load()-base, int64(stocked), "never oversold")
		require.Equal(t, sold.Load(), db.reserved["HOT"], "the database holds exactly what was sold")
		require.Equal(t, db.available("HOT"), levels(t, stores[1], "HOT").Available, "Redis = on_hand - reserved")
	})
}

// raceAdmit runs workers goroutines, each making attempts admissions of one
// SKU, and returns the units admitted.
func raceAdmit(t *testing.T, s *Store, sku string, workers, attempts int, qty func() int64) int64 {
	t.Helper()
	var took atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for a := 0; a < attempts; a++ {
				q := qty()
				_, err := s.Admit(context.Background(), sku, q, "")
				if errors.Is(err, inventory.ErrInsufficientStock) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				took.Add(q)
			}
		}()
	}
	wg.Wait()
	return took.Load()
}

func TestNoOverAdmission(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		t.Run("qty 1", func(t *testing.T) {
			require.NoError(t, b.Flush(ctx, rdb))
			s := newStore(t, rdb, newFakeDB(map[string]int64{"HOT": 500}))
			require.EqualValues(t, 500, raceAdmit(t, s, "HOT", 64, 40, func() int64 { return 1 }), "exactly the stock")
			require.EqualValues(t, 0, levels(t, s, "HOT").Available)
		})
		t.Run("mixed quantities", func(t *testing.T) {
			require.NoError(t, b.Flush(ctx, rdb))
			s := newStore(t, rdb, newFakeDB(map[string]int64{"HOT": 500}))
			took := raceAdmit(t, s, "HOT", 64, 40, func() int64 { return 1 + rand.Int64N(5) })
			left := levels(t, s, "HOT").Available
			require.EqualValues(t, 500, took+left, "taken + left = stocked")
			require.Less(t, left, int64(5), "the sale ran until no request could fit")
		})
		t.Run("cold key, many nodes: one init", func(t *testing.T) {
			require.NoError(t, b.Flush(ctx, rdb))
			db := newFakeDB(map[string]int64{"HOT": 500})
			db.delay = 50 * time.Millisecond // a slow database read widens the race
			var took atomic.Int64
			var wg sync.WaitGroup
			for node := 0; node < 4; node++ { // four Stores: four processes' worth of state
				s := newStore(t, rdb, db)
				wg.Add(1)
				go func() {
					defer wg.Done()
					took.Add(raceAdmit(t, s, "HOT", 16, 40, func() int64 { return 1 }))
				}()
			}
			wg.Wait()
			require.EqualValues(t, 1, db.calls.Load(), "exactly one cold init reached the database")
			require.EqualValues(t, 500, took.Load())
		})
	})
}

func TestCartAllOrNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		s := newStore(t, rdb, newFakeDB(map[string]int64{"A": 5, "B": 2, "C": 5}))
		cart, err := s.NormaliseCart([]inventory.Line{{SKU: "C", Qty: 1}, {SKU: "A", Qty: 2}, {SKU: "A", Qty: 1}})
		require.NoError(t, err)
		require.Equal(t, []inventory.Line{{SKU: "A", Qty: 3}, {SKU: "C", Qty: 1}}, cart, "merged and sorted")
		adm, err := s.AdmitCart(ctx, cart)
		require.NoError(t, err)
		require.Equal(t, []int64{2, 4}, []int64{adm[0].Remaining, adm[1].Remaining})

		_, err = s.AdmitCart(ctx, []inventory.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 3}, {SKU: "C", Qty: 1}})
		require.ErrorIs(t, err, inventory.ErrInsufficientStock)
		require.ErrorContains(t, err, "B")
		for sku, want := range map[string]int64{"A": 2, "B": 2, "C": 4} {
			require.Equal(t, want, levels(t, s, sku).Available, "%s: a failed cart takes nothing", sku)
		}
		s.UndoCart(ctx, cart, adm)
		require.EqualValues(t, 5, levels(t, s, "A").Available)
		require.EqualValues(t, 5, levels(t, s, "C").Available)
	})
}

// A buyer under a per-user limit is admitted by one script call that checks
// and counts the limit with the stock: exactly the limit across many tabs,
// nothing counted on a refusal (over the limit, sold out), the units counted
// on an unlimited SKU too, and a give-back reopens the limit.
func TestAdmitBuyer(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		var back []string
		db := newFakeDB(map[string]int64{"A": 10, "ONE": 1, "FREE": inventory.Unlimited})
		s, err := NewStore(rdb, Config{Init: db.init, OnStockBack: func(sku string) { back = append(back, sku) }})
		require.NoError(t, err)
		u1 := Buyer{User: "u1", Limit: 2}
		var wins atomic.Int64
		var wg sync.WaitGroup
		for i := 0; i < 32; i++ { // one user, many tabs, a cold SKU
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := s.AdmitBuyer(ctx, "A", 1, u1)
				switch {
				case err == nil:
					wins.Add(1)
				case !errors.Is(err, inventory.ErrOverLimit):
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		require.EqualValues(t, 2, wins.Load(), "exactly the limit")
		require.EqualValues(t, 8, levels(t, s, "A").Available, "only the admitted units were taken")
		bought := func(sku, user string) string {
			v, err := rdb.HGet(ctx, buyersKey(sku), user).Result()
			if errors.Is(err, redis.Nil) {
				return "none"
			}
			require.NoError(t, err)
			return v
		}
		require.Equal(t, "2", bought("A", "u1"))

		// One round trip per sale (the script is loaded by now).
		cmds := testenv.CountCommands(rdb)
		adm, err := s.AdmitBuyer(ctx, "A", 1, Buyer{User: "u2", Limit: 2})
		require.NoError(t, err)
		require.EqualValues(t, 7, adm.Remaining)
		require.EqualValues(t, 1, cmds.Load(), "quota and stock in one call")

		require.NoError(t, s.UndoBuyer(ctx, "A", 1, adm, "u1"))
		require.Equal(t, []string{"A"}, back, "an undone unit comes back")
		_, err = s.AdmitBuyer(ctx, "A", 1, u1)
		require.NoError(t, err, "a failed purchase gives its quota back")
		require.Equal(t, "2", bought("A", "u1"))
		back = nil

		// Sold out: refused, and the buyer's limit is not counted.
		_, err = s.AdmitBuyer(ctx, "ONE", 1, Buyer{User: "u3", Limit: 5})
		require.NoError(t, err)
		_, err = s.AdmitBuyer(ctx, "ONE", 1, Buyer{User: "u4", Limit: 5})
		require.ErrorIs(t, err, inventory.ErrInsufficientStock)
		require.Equal(t, "none", bought("ONE", "u4"))

		// Unlimited stock still counts the buyer's units.
		for i := 0; i < 3; i++ {
			adm, err := s.AdmitBuyer(ctx, "FREE", 1, Buyer{User: "u5", Limit: 3})
			require.NoError(t, err)
			require.EqualValues(t, inventory.Unlimited, adm.Remaining)
		}
		_, err = s.AdmitBuyer(ctx, "FREE", 1, Buyer{User: "u5", Limit: 3})
		require.ErrorIs(t, err, inventory.ErrOverLimit)
		require.Equal(t, "3", bought("FREE", "u5"))

		for _, bad := range []Buyer{{User: "bad user", Limit: 2}, {User: "", Limit: 2}, {User: "u6", Limit: 0}} {
			_, err = s.AdmitBuyer(ctx, "A", 1, bad)
			require.ErrorIs(t, err, inventory.ErrInvalidArgument, "%+v", bad)
		}
		require.Equal(t, "none", bought("A", "u6"))
		require.Empty(t, back)

		// The pre-filter forgets: it expires a day after the last purchase
		// (the database keeps the limit), and a give-back after it expired
		// leaves nothing behind (the next admission with a limit initialises
		// it from the database).
		ttl, err := rdb.PTTL(ctx, buyersKey("A")).Result()
		require.NoError(t, err)
		require.Greater(t, ttl, 23*time.Hour)
		require.LessOrEqual(t, ttl, 24*time.Hour)
		require.NoError(t, rdb.Del(ctx, buyersKey("A")).Err())
		require.NoError(t, s.UndoBuyer(ctx, "A", 1, adm, "u1"))
		n, err := rdb.Exists(ctx, buyersKey("A")).Result()
		require.NoError(t, err)
		require.Zero(t, n)
		back = nil
		require.NoError(t, s.Forget(ctx, "A"))
		require.Equal(t, []string{"A"}, back, "a reset may bring stock back")
	})
}

// A write's follow-ups end FollowUpGrace after the request's deadline,
// whenever they start: follow-ups run one after another (an undo, a quota
// given back, a realign) must not each get FollowUpGrace of their own.
func TestFollowUpsEndAtTheDeadlinesGrace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	d, _ := ctx.Deadline()
	for _, at := range []time.Duration{0, 50 * time.Millisecond, 400 * time.Millisecond} {
		time.Sleep(time.Until(d.Add(at - 20*time.Millisecond)))
		fctx, fcancel := FollowUp(ctx)
		got, ok := fctx.Deadline()
		fcancel()
		require.True(t, ok)
		require.Equal(t, d.Add(FollowUpGrace), got, "a follow-up starting %s after the request", at)
	}
	bg, bcancel := FollowUp(context.Background())
	defer bcancel()
	_, ok := bg.Deadline()
	require.False(t, ok, "background work has no deadline to inherit")
}

// buyFor runs a seckill purchase as package order does: Redis admits and
// counts the buyer, the database arbitrates both; a refusal undoes both (no
// realign: nothing heals a miscount); a reservation that committed after a
// re-init is brought into the new value, count included.
func buyFor(ctx context.Context, s *Store, db *fakeDB, sku, user string) (bool, error) {
	db.mu.Lock()
	limit := db.limit[sku]
	db.mu.Unlock()
	adm, err := s.AdmitBuyer(ctx, sku, 1, Buyer{User: user, Limit: limit})
	if errors.Is(err, inventory.ErrInsufficientStock) || errors.Is(err, inventory.ErrOverLimit) || errors.Is(err, inventory.ErrUnavailable) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	latency()
	seq, epoch, ok := db.reserveFor(sku, user, 1)
	latency()
	if !ok {
		return false, s.UndoBuyer(ctx, sku, 1, adm, user)
	}
	if epoch != adm.Epoch {
		return true, s.Apply(ctx, inventory.Change{SKU: sku, Delta: -1, Seq: seq, Epoch: adm.Epoch, Buyers: map[string]int64{user: 1}})
	}
	return true, nil
}

// The buyers' counts under the whole protocol's fire: purchases counting
// against a tight per-user limit, cancels giving the counts back, re-inits
// (realigns, key losses, the buyers hash alone lost) all racing, with a
// pause between every step, in rounds, each with one re-init or loss
// somewhere in its trading. At the quiet point after each round
// Redis's counts equal the database's exactly: each change of a count was
// counted once, by an initialisation or by itself, never lost and never
// twice, and nothing repaired a miscount in between (refusals do not
// realign here). Then no buyer passes the limit.
func TestBuyerCountsRaceReinit(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		db := newFakeDB(map[string]int64{"HOT": 1_000_000})
		db.limit["HOT"] = 4 // tight: buyers hover at the limit, so refusals race the re-inits too
		db.beforeWrite = latency
		var stores []*Store
		for node := 0; node < 3; node++ {
			stores = append(stores, newStore(t, rdb, db))
		}
		users := []string{"u0", "u1", "u2", "u3", "u4", "u5"}
		checked := 0
		for round := 0; round < 40; round++ {
			// Every buyer starts the round with nothing held, so the
			// round's trading runs up against the limit again.
			for u, q := range db.counts("HOT") {
				seq := db.releaseFor("HOT", u, q)
				require.NoError(t, stores[0].Apply(ctx, inventory.Change{SKU: "HOT", Delta: q, Seq: seq, Buyers: map[string]int64{u: -q}}))
			}
			var trading sync.WaitGroup
			for w := 0; w < 24; w++ {
				trading.Add(1)
				go func() {
					defer trading.Done()
					s, user := stores[w%len(stores)], users[w%len(users)]
					for a := 0; a < 4; a++ {
						ok, err := buyFor(ctx, s, db, "HOT", user)
						if err != nil {
							t.Error(err)
							return
						}
						if ok && rand.IntN(2) == 0 { // cancel: give it back
							seq := db.releaseFor("HOT", user, 1)
							latency()
							if err := s.Apply(ctx, inventory.Change{SKU: "HOT", Delta: 1, Seq: seq, Buyers: map[string]int64{user: -1}}); err != nil {
								t.Error(err)
								return
							}
						}
					}
				}()
			}
			var chaos sync.WaitGroup
			chaos.Add(1)
			go func() { // one re-init or loss, somewhere in the round's trading
				defer chaos.Done()
				time.Sleep(time.Duration(rand.IntN(600)) * time.Microsecond)
				var err error
				switch round % 6 {
				case 4:
					err = b.Flush(ctx, rdb)
				case 5:
					err = rdb.Del(ctx, buyersKey("HOT")).Err()
				default:
					err = stores[round%len(stores)].Realign(ctx, "HOT")
				}
				if err != nil {
					t.Error(err)
				}
			}()
			trading.Wait()
			chaos.Wait()
			if t.Failed() {
				return
			}
			lv, err := stores[0].Levels(ctx, "HOT")
			require.NoError(t, err)
			if !lv.Initialised || lv.BuyersEpoch != lv.Epoch {
				continue // lost last: the next admission initialises it from the database
			}
			got, _, err := stores[0].Buyers(ctx, "HOT")
			require.NoError(t, err)
			require.Equal(t, db.counts("HOT"), got, "round %d: Redis counts what the database counts", round)
			require.Equal(t, db.available("HOT"), lv.Available, "round %d", round)
			checked++
		}
		t.Logf("checked %d rounds, %d initialisations", checked, db.calls.Load())
		require.Greater(t, db.calls.Load(), int64(30), "the race did re-initialise")
		require.Greater(t, checked, 0)
		for u, q := range db.counts("HOT") {
			require.LessOrEqual(t, q, int64(4), u)
		}
	})
}
