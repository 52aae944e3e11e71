package stock

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/testkit/testenv"
)

// fakeCampaigns plays the database behind InitCampaign: per campaign its
// pool row (units left, seq, epoch) and window. mu is the pool's row lock:
// the init holds it while Redis is written.
type fakeCampaigns struct {
	mu    sync.Mutex
	pools map[string]*fakePool // by campaign ID
	calls atomic.Int64
	delay time.Duration
	hold  chan struct{} // non-nil: an init waits for it after writing
}

type fakePool struct {
	left, seq, epoch int64
	opens, closes    time.Time
	buyers           map[string]int64 // what buyer_quotas counts against the campaign's limit
	ended            bool             // its pool released, or its window closed
}

func newFakeCampaigns(pools map[string]*fakePool) *fakeCampaigns {
	return &fakeCampaigns{pools: pools}
}

func (f *fakeCampaigns) init(ctx context.Context, c Campaign, write func(CampaignBaseline) error) error {
	f.calls.Add(1)
	if f.delay > 0 {
		time.Sleep(f.delay)
	}
	f.mu.Lock()
	p, ok := f.pools[c.ID]
	if !ok {
		f.mu.Unlock()
		return fmt.Errorf("campaign %s: %w", c.ID, inventory.ErrNotFound)
	}
	if p.ended {
		f.mu.Unlock()
		return fmt.Errorf("campaign %s: %w", c.ID, inventory.ErrEnded)
	}
	p.epoch = 1 + rand.Int64N(1<<52)
	err := write(CampaignBaseline{
		Baseline: inventory.Baseline{Available: p.left, Epoch: p.epoch, Seq: p.seq, Buyers: maps.Clone(p.buyers)},
		Opens:    p.opens, Closes: p.closes,
	})
	f.mu.Unlock()
	if f.hold != nil {
		<-f.hold
	}
	return err
}

func newCampaignStore(t *testing.T, rdb redis.UniversalClient, f *fakeCampaigns) *Store {
	t.Helper()
	s, err := NewStore(rdb, Config{Init: newFakeDB(map[string]int64{}).init, InitCampaign: f.init,
		LockTTL: 2 * time.Second, InitWait: 5 * time.Second})
	require.NoError(t, err)
	return s
}

// window is a campaign window of an hour that opened at opens, to the
// millisecond (what Redis keeps).
func window(opens time.Time) (time.Time, time.Time) {
	opens = time.UnixMilli(opens.UnixMilli())
	return opens, opens.Add(time.Hour)
}

// campaignLevels reads c's pool, which must be in Redis.
func campaignLevels(t *testing.T, s *Store, c Campaign) CampaignLevels {
	t.Helper()
	lv, err := s.CampaignLevels(context.Background(), c)
	require.NoError(t, err)
	require.True(t, lv.Initialised, "%s is in Redis", c)
	return lv
}

// expiresAt is when key expires, unix ms (miniredis keeps a TTL, not the
// moment: it may answer a millisecond off).
func expiresAt(t *testing.T, rdb redis.UniversalClient, key string) int64 {
	t.Helper()
	at, err := rdb.PExpireTime(context.Background(), key).Result()
	require.NoError(t, err)
	return at.Milliseconds()
}

// bought is what the hash key holds for user ("none": nothing).
func bought(t *testing.T, rdb redis.UniversalClient, key, user string) string {
	t.Helper()
	v, err := rdb.HGet(context.Background(), key, user).Result()
	if errors.Is(err, redis.Nil) {
		return "none"
	}
	require.NoError(t, err)
	return v
}

// The deduction script's answers on a campaign's pool: the window is checked
// after "not initialised" and before the limit and the stock; outside it
// nothing is taken or counted. A SKU's hash has no window, whatever now the
// caller passes.
func TestCampaignScriptCodes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		c := Campaign{ID: "C1", SKU: "S"}
		const o, z = 1_000_000, 2_000_000
		run := func(now, limit int64) []int64 {
			keys := []string{campaignKey(c), campaignKey(c)}
			args := []any{1, 0, "", 0, 0, now}
			if limit > 0 {
				keys = append(keys, campaignBuyersKey(c))
				args = []any{1, 0, "u1", limit, 60_000, now}
			}
			r, err := deductScript.Run(ctx, rdb, keys, args...).Int64Slice()
			require.NoError(t, err)
			return r
		}
		require.Equal(t, []int64{-3, 0}, run(o, 0), "not initialised")
		expires := time.Now().Add(time.Hour).UnixMilli()
		r, err := campaignInitScript.Run(ctx, rdb, []string{campaignKey(c), campaignBuyersKey(c), stagedCampaignBuyersKey(c, 7)},
			2, 7, 4, "cold", o, z, expires, 0).Int64Slice()
		require.NoError(t, err)
		require.Equal(t, []int64{1, 2}, r)
		h, err := rdb.HGetAll(ctx, campaignKey(c)).Result()
		require.NoError(t, err)
		require.Equal(t, map[string]string{"a": "2", "e": "7", "s": "4", "o": "1000000", "z": "2000000"}, h)
		h, err = rdb.HGetAll(ctx, campaignBuyersKey(c)).Result()
		require.NoError(t, err)
		require.Equal(t, map[string]string{buyersEpoch: "7"}, h, "the buyers' counts carry the pool's epoch")
		for _, k := range []string{campaignKey(c), campaignBuyersKey(c)} {
			require.InDelta(t, expires, expiresAt(t, rdb, k), 5, "%s expires when the initialisation says", k)
		}

		require.Equal(t, []int64{-8, 7}, run(o-1, 0), "one millisecond before the opening")
		require.Equal(t, []int64{-8, 7}, run(0, 0))
		require.Equal(t, []int64{-9, 7}, run(z, 0), "the close is not in the window")
		require.Equal(t, []int64{-9, 7}, run(z+1, 0))
		require.Equal(t, []int64{1, 7}, run(o, 0), "the opening is")
		require.Equal(t, []int64{0, 7}, run(z-1, 2), "with a limit")
		// The window before the limit: the buyer (1 of 1 bought) is told the
		// sale is over, not that he reached the limit.
		require.Equal(t, []int64{-9, 7}, run(z, 1))
		require.Equal(t, []int64{-8, 7}, run(o-1, 1))
		require.Equal(t, []int64{-7, 7}, run(o, 1), "the limit before the stock")
		require.Equal(t, []int64{-2, 7}, run(o, 5), "sold out")
		require.Equal(t, "1", bought(t, rdb, campaignBuyersKey(c), "u1"), "refusals counted nothing")
		// Counts of another initialisation: the window first, then -10.
		require.NoError(t, rdb.HSet(ctx, campaignBuyersKey(c), buyersEpoch, 6).Err())
		require.Equal(t, []int64{-9, 7}, run(z, 5))
		require.Equal(t, []int64{-10, 7}, run(o, 5), "the buyers' counts are not the pool's initialisation's")
		require.Equal(t, []int64{-2, 7}, run(o, 0), "an admission without a limit does not read them: sold out")

		// A SKU's hash has no window: the sixth argument is never read.
		require.NoError(t, rdb.HSet(ctx, stockKey("S"), "a", 2, "e", 9, "s", 0).Err())
		var got [][]int64
		for _, now := range []int64{0, z, 1 << 50, o - 1} {
			r, err := deductScript.Run(ctx, rdb, admitKeys("S", ""), 1, 0, "", 0, 0, now).Int64Slice()
			require.NoError(t, err)
			got = append(got, r)
		}
		require.Equal(t, [][]int64{{1, 9}, {0, 9}, {-2, 9}, {-2, 9}}, got, "the SKU's two units, whatever the time")
	})
}

// A burst before the opening, at the close and after it takes nothing,
// counts nothing and reaches the database once: the cold init of the first
// caller (the burst shares it), none after.
func TestCampaignWindowBurst(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		opens, closes := window(time.Now().Add(time.Hour))
		f := newFakeCampaigns(map[string]*fakePool{
			"EARLY": {left: 300, opens: opens, closes: closes},
			"LATE":  {left: 300, opens: opens, closes: closes},
		})
		f.delay = 20 * time.Millisecond // a slow read widens the cold race
		s := newCampaignStore(t, rdb, f)
		burst := func(c Campaign, now time.Time, want error) {
			t.Helper()
			var wrong atomic.Int64
			var wg sync.WaitGroup
			for i := range 200 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var b *Buyer
					if i%2 == 0 { // half with a per-user limit
						b = &Buyer{User: fmt.Sprintf("u%d", i%7), Limit: 1}
					}
					_, err := s.AdmitCampaign(ctx, c, 1, b, now)
					if !errors.Is(err, want) {
						wrong.Add(1)
						t.Errorf("at %s: %v, want %v", now, err, want)
					}
				}()
			}
			wg.Wait()
			require.Zero(t, wrong.Load())
			require.EqualValues(t, 300, campaignLevels(t, s, c).Available, "nothing taken")
			h, err := rdb.HGetAll(ctx, campaignBuyersKey(c)).Result()
			require.NoError(t, err)
			delete(h, buyersEpoch) // the initialisation's mark
			require.Empty(t, h, "no buyer counted")
		}
		early := Campaign{ID: "EARLY", SKU: "PHONE"}
		burst(early, opens.Add(-time.Millisecond), inventory.ErrNotStarted)
		require.EqualValues(t, 1, f.calls.Load(), "a cold burst before the opening: one init")
		late := Campaign{ID: "LATE", SKU: "PHONE"}
		burst(late, closes, inventory.ErrEnded)
		require.EqualValues(t, 2, f.calls.Load(), "a cold burst at the close: one init")
		burst(early, closes.Add(time.Minute), inventory.ErrEnded)
		burst(late, opens.Add(-time.Hour), inventory.ErrNotStarted)
		require.EqualValues(t, 2, f.calls.Load(), "warm pools: the database never asked")
		require.Zero(t, s.Stats().Deducted.Load()+s.Stats().Insufficient.Load())

		// The window's edges: the opening is in it, the close is not.
		_, err := s.AdmitCampaign(ctx, early, 1, nil, opens)
		require.NoError(t, err)
		_, err = s.AdmitCampaign(ctx, early, 1, nil, closes.Add(-time.Millisecond))
		require.NoError(t, err)
		require.EqualValues(t, 298, campaignLevels(t, s, early).Available)
	})
}

// Inside the window no unit is admitted twice: 64 buyers × 20 attempts on a
// pool of 300 are answered exactly 300 times yes, with the units left
// 299..0 each once, and the rest sold out.
func TestCampaignNoOverAdmission(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		opens, closes := window(time.Now().Add(-time.Minute))
		f := newFakeCampaigns(map[string]*fakePool{"SALE": {left: 300, seq: 3, opens: opens, closes: closes}})
		s := newCampaignStore(t, rdb, f)
		c := Campaign{ID: "SALE", SKU: "PHONE"}
		var mu sync.Mutex
		var left []int64
		var soldOut atomic.Int64
		var wg sync.WaitGroup
		for range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 20 {
					adm, err := s.AdmitCampaign(ctx, c, 1, nil, time.Now())
					switch {
					case err == nil:
						mu.Lock()
						left = append(left, adm.Remaining)
						mu.Unlock()
					case errors.Is(err, inventory.ErrInsufficientStock):
						soldOut.Add(1)
					default:
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		require.Len(t, left, 300, "exactly the pool")
		slices.Sort(left)
		for i, n := range left {
			require.EqualValues(t, i, n, "the units left, 0..299, each once")
		}
		require.EqualValues(t, 64*20-300, soldOut.Load())
		require.EqualValues(t, 0, campaignLevels(t, s, c).Available)
		require.EqualValues(t, 1, f.calls.Load())
		require.Positive(t, s.Stats().Pipelines.Load(), "campaign admissions go through the coalescer")
	})
}

// A buyer's per-campaign limit is counted with the take, in one script
// call: one buyer in many tabs gets exactly the limit; the campaign's count
// is its own (the SKU's buyers hash is not touched); a give-back reopens it.
func TestCampaignBuyerLimit(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		opens, closes := window(time.Now().Add(-time.Minute))
		f := newFakeCampaigns(map[string]*fakePool{"SALE": {left: 100, opens: opens, closes: closes}})
		s := newCampaignStore(t, rdb, f)
		c := Campaign{ID: "SALE", SKU: "PHONE"}
		u1 := &Buyer{User: "u1", Limit: 2}
		var wins atomic.Int64
		var wg sync.WaitGroup
		for range 48 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := s.AdmitCampaign(ctx, c, 1, u1, time.Now())
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
		require.EqualValues(t, 98, campaignLevels(t, s, c).Available, "only the admitted units were taken")
		require.Equal(t, "2", bought(t, rdb, campaignBuyersKey(c), "u1"))
		require.Equal(t, "none", bought(t, rdb, buyersKey("PHONE"), "u1"), "the SKU's limit is another count")
		require.InDelta(t, closes.Add(CampaignKeysLinger).UnixMilli(), expiresAt(t, rdb, campaignBuyersKey(c)), 5,
			"the counts expire with the pool")

		// One round trip per sale, the limit included.
		cmds := testenv.CountCommands(rdb)
		adm, err := s.AdmitCampaign(ctx, c, 2, &Buyer{User: "u2", Limit: 2}, time.Now())
		require.NoError(t, err)
		require.EqualValues(t, 96, adm.Remaining)
		require.EqualValues(t, 1, cmds.Load(), "limit and pool in one call")

		_, err = s.AdmitCampaign(ctx, c, 1, &Buyer{User: "u2", Limit: 2}, time.Now())
		require.ErrorIs(t, err, inventory.ErrOverLimit)
		require.NoError(t, s.UndoCampaign(ctx, c, 1, Admission{Epoch: adm.Epoch}, u1))
		_, err = s.AdmitCampaign(ctx, c, 1, u1, time.Now())
		require.NoError(t, err, "a failed purchase gives its quota back")
		require.Equal(t, "2", bought(t, rdb, campaignBuyersKey(c), "u1"))
		_, err = s.AdmitCampaign(ctx, c, 1, nil, time.Now())
		require.NoError(t, err, "no buyer: no limit")
		require.EqualValues(t, 95, campaignLevels(t, s, c).Available, "the undone unit came back too")
	})
}

// An admission the database refused goes back into the initialisation it
// was taken from only, its buyer's count too: a realign's counts are the
// database's, which never had the refused admission.
func TestCampaignUndoOnlyIntoItsEpoch(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		opens, closes := window(time.Now().Add(-time.Minute))
		f := newFakeCampaigns(map[string]*fakePool{"SALE": {left: 10, opens: opens, closes: closes}})
		var back []Campaign
		s, err := NewStore(rdb, Config{Init: newFakeDB(map[string]int64{}).init, InitCampaign: f.init,
			OnCampaignBack: func(c Campaign) { back = append(back, c) },
			OnStockBack:    func(sku string) { t.Errorf("a campaign's units are not %s's", sku) }})
		require.NoError(t, err)
		c := Campaign{ID: "SALE", SKU: "PHONE"}
		u1 := &Buyer{User: "u1", Limit: 5}
		a1, err := s.AdmitCampaign(ctx, c, 2, u1, time.Now())
		require.NoError(t, err)
		a2, err := s.AdmitCampaign(ctx, c, 3, u1, time.Now())
		require.NoError(t, err)
		require.Equal(t, f.pools["SALE"].epoch, a1.Epoch, "the admission names its initialisation")
		require.NoError(t, s.UndoCampaign(ctx, c, 2, a1, u1))
		require.EqualValues(t, 7, campaignLevels(t, s, c).Available, "same epoch: given back")
		require.Equal(t, "3", bought(t, rdb, campaignBuyersKey(c), "u1"))
		require.Equal(t, []Campaign{c}, back)

		// The database never recorded a2, and recorded another sale to u1
		// meanwhile: 9 left, u1 holds 1.
		f.pools["SALE"].left, f.pools["SALE"].buyers = 9, map[string]int64{"u1": 1}
		require.NoError(t, s.RealignCampaign(ctx, c))
		lv := campaignLevels(t, s, c)
		require.EqualValues(t, 9, lv.Available)
		require.NotEqual(t, a2.Epoch, lv.Epoch, "a realign is a new epoch")
		require.Equal(t, "1", bought(t, rdb, campaignBuyersKey(c), "u1"), "the database's count")
		require.NoError(t, s.UndoCampaign(ctx, c, 3, a2, u1))
		require.EqualValues(t, 9, campaignLevels(t, s, c).Available, "another epoch: nothing given back")
		require.Equal(t, "1", bought(t, rdb, campaignBuyersKey(c), "u1"), "nor the count, which the database never had")

		a3, err := s.AdmitCampaign(ctx, c, 1, nil, time.Now())
		require.NoError(t, err)
		require.NoError(t, b.Flush(ctx, rdb))
		require.NoError(t, s.UndoCampaign(ctx, c, 1, a3, nil))
		n, err := rdb.Exists(ctx, campaignKey(c)).Result()
		require.NoError(t, err)
		require.Zero(t, n, "an undo never recreates a lost pool")
	})
}

// A committed change of the pool is brought in exactly once, fenced by the
// pool's seq and epoch as a SKU's is.
func TestCampaignApplyFenced(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		opens, closes := window(time.Now().Add(-time.Minute))
		f := newFakeCampaigns(map[string]*fakePool{"SALE": {left: 10, seq: 5, opens: opens, closes: closes}})
		s := newCampaignStore(t, rdb, f)
		c := Campaign{ID: "SALE", SKU: "PHONE"}
		require.NoError(t, s.WarmCampaign(ctx, c))
		lv := campaignLevels(t, s, c)
		require.Equal(t, CampaignLevels{Initialised: true, Available: 10, Epoch: f.pools["SALE"].epoch, Seq: 5,
			Opens: opens, Closes: closes, BuyersEpoch: f.pools["SALE"].epoch}, lv)

		// Changes the init already read (seq <= 5): skipped.
		require.NoError(t, s.ApplyCampaign(ctx, c, inventory.Change{Delta: 1, Seq: 5}))
		require.NoError(t, s.ApplyCampaign(ctx, c, inventory.Change{SKU: "PHONE", Delta: 1, Seq: 3}))
		require.EqualValues(t, 10, campaignLevels(t, s, c).Available, "counted by the init")
		// A unit released back into the live campaign after it: added, once.
		require.NoError(t, s.ApplyCampaign(ctx, c, inventory.Change{Delta: 1, Seq: 6}))
		require.EqualValues(t, 11, campaignLevels(t, s, c).Available)
		// A reservation taken from this initialisation: already in the value;
		// from an older one: taken again.
		require.NoError(t, s.ApplyCampaign(ctx, c, inventory.Change{Delta: -1, Seq: 7, Epoch: lv.Epoch}))
		require.EqualValues(t, 11, campaignLevels(t, s, c).Available)
		require.NoError(t, s.ApplyCampaign(ctx, c, inventory.Change{Delta: -1, Seq: 8, Epoch: lv.Epoch + 1}))
		require.EqualValues(t, 10, campaignLevels(t, s, c).Available)
		// A buyer's count moves with its unit, under the same fence.
		// (Each change its own seq: one delivered again at its seq is
		// applied once, stock/applyonce_test.go.)
		require.NoError(t, s.ApplyCampaign(ctx, c, inventory.Change{Delta: -1, Seq: 9, Epoch: lv.Epoch + 1, Buyers: map[string]int64{"u1": 1}}))
		require.NoError(t, s.ApplyCampaign(ctx, c, inventory.Change{Delta: -1, Seq: 10, Epoch: lv.Epoch, Buyers: map[string]int64{"u1": 1}}))
		require.Equal(t, "1", bought(t, rdb, campaignBuyersKey(c), "u1"), "taken again once, not for its own epoch")
		require.NoError(t, s.ApplyCampaign(ctx, c, inventory.Change{Delta: 1, Seq: 11, Buyers: map[string]int64{"u1": -1}}))
		require.Equal(t, "none", bought(t, rdb, campaignBuyersKey(c), "u1"), "a release gives it back")
		require.EqualValues(t, 10, campaignLevels(t, s, c).Available)

		// Below zero: the pool is realigned from the database.
		f.pools["SALE"].left, f.pools["SALE"].seq = 4, 12
		require.NoError(t, s.ApplyCampaign(ctx, c, inventory.Change{Delta: -50, Seq: 12}))
		lv = campaignLevels(t, s, c)
		require.EqualValues(t, 4, lv.Available)
		require.EqualValues(t, 12, lv.Seq)
		require.EqualValues(t, 2, f.calls.Load())

		require.ErrorIs(t, s.ApplyCampaign(ctx, c, inventory.Change{SKU: "OTHER", Delta: 1, Seq: 13}), inventory.ErrInvalidArgument)
		require.EqualValues(t, 4, campaignLevels(t, s, c).Available)
		require.NoError(t, b.Flush(ctx, rdb))
		require.NoError(t, s.ApplyCampaign(ctx, c, inventory.Change{Delta: 3, Seq: 99}))
		n, err := rdb.Exists(ctx, campaignKey(c)).Result()
		require.NoError(t, err)
		require.Zero(t, n, "an apply never recreates a lost pool")
	})
}

// A cold pool under a burst on four nodes is initialised once; a pool Redis
// lost is initialised again from the database on the next admission;
// warming a warm pool asks nothing; a realign reads a changed window; a
// campaign the database does not have is not found.
func TestCampaignColdInit(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		opens, closes := window(time.Now().Add(-time.Minute))
		f := newFakeCampaigns(map[string]*fakePool{"SALE": {left: 500, seq: 1, opens: opens, closes: closes}})
		f.delay = 50 * time.Millisecond // a slow database read widens the race
		c := Campaign{ID: "SALE", SKU: "PHONE"}
		var took, soldOut atomic.Int64
		var wg sync.WaitGroup
		for range 4 { // four Stores: four processes' worth of state
			s := newCampaignStore(t, rdb, f)
			for range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 10 {
						_, err := s.AdmitCampaign(ctx, c, 1, nil, time.Now())
						switch {
						case err == nil:
							took.Add(1)
						case errors.Is(err, inventory.ErrInsufficientStock):
							soldOut.Add(1)
						default:
							t.Error(err)
							return
						}
					}
				}()
			}
		}
		wg.Wait()
		require.EqualValues(t, 1, f.calls.Load(), "exactly one cold init reached the database")
		require.EqualValues(t, 500, took.Load())
		require.EqualValues(t, 140, soldOut.Load())

		s := newCampaignStore(t, rdb, f)
		require.NoError(t, s.WarmCampaign(ctx, c))
		require.EqualValues(t, 1, f.calls.Load(), "warming a warm pool asks nothing")

		// Redis loses everything; the database recorded 493 of the sales and
		// gave 7 back to the pool meanwhile.
		f.pools["SALE"].left, f.pools["SALE"].seq = 7, 501
		require.NoError(t, b.Flush(ctx, rdb))
		adm, err := s.AdmitCampaign(ctx, c, 1, nil, time.Now())
		require.NoError(t, err)
		require.EqualValues(t, 6, adm.Remaining, "re-initialised from the callback")
		require.EqualValues(t, 2, f.calls.Load())
		lv := campaignLevels(t, s, c)
		require.Equal(t, f.pools["SALE"].epoch, lv.Epoch)
		require.EqualValues(t, 501, lv.Seq)

		require.NoError(t, b.Flush(ctx, rdb))
		require.NoError(t, s.WarmCampaign(ctx, c))
		require.EqualValues(t, 3, f.calls.Load(), "warming a cold pool initialises it")
		require.EqualValues(t, 7, campaignLevels(t, s, c).Available)

		// The database moved the opening an hour later: a realign brings the
		// new window, and the pool is closed again until then.
		f.pools["SALE"].opens, f.pools["SALE"].closes = window(time.Now().Add(time.Hour))
		require.NoError(t, s.RealignCampaign(ctx, c))
		lv = campaignLevels(t, s, c)
		require.Equal(t, f.pools["SALE"].opens, lv.Opens)
		require.Equal(t, f.pools["SALE"].closes, lv.Closes)
		_, err = s.AdmitCampaign(ctx, c, 1, nil, time.Now())
		require.ErrorIs(t, err, inventory.ErrNotStarted)

		_, err = s.AdmitCampaign(ctx, Campaign{ID: "NOPE", SKU: "PHONE"}, 1, nil, time.Now())
		require.ErrorIs(t, err, inventory.ErrNotFound)
		lv, err = s.CampaignLevels(ctx, Campaign{ID: "NOPE", SKU: "PHONE"})
		require.NoError(t, err)
		require.False(t, lv.Initialised)
	})
}

// A database that answers a pool Redis cannot hold (negative units, an empty
// window) is refused as unavailable, and nothing is written.
func TestCampaignBadBaseline(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		opens, closes := window(time.Now())
		f := newFakeCampaigns(map[string]*fakePool{
			"NEG":   {left: -1, opens: opens, closes: closes},
			"EMPTY": {left: 5, opens: opens, closes: opens},
			"NONE":  {left: 5},
		})
		s := newCampaignStore(t, rdb, f)
		for _, id := range []string{"NEG", "EMPTY", "NONE"} {
			c := Campaign{ID: id, SKU: "PHONE"}
			_, err := s.AdmitCampaign(ctx, c, 1, nil, time.Now())
			require.ErrorIs(t, err, inventory.ErrUnavailable, id)
			n, err := rdb.Exists(ctx, campaignKey(c)).Result()
			require.NoError(t, err)
			require.Zero(t, n, id)
		}
	})
}

// Bad input touches nothing: neither Redis nor the database; a Store
// without InitCampaign refuses every campaign method.
func TestCampaignBadInput(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		opens, closes := window(time.Now().Add(-time.Minute))
		f := newFakeCampaigns(map[string]*fakePool{"SALE": {left: 5, opens: opens, closes: closes}})
		s := newCampaignStore(t, rdb, f)
		good := Campaign{ID: "SALE", SKU: "PHONE"}
		now := time.Now()
		for _, c := range []Campaign{{ID: "", SKU: "PHONE"}, {ID: "a:b", SKU: "PHONE"}, {ID: "a{b}", SKU: "PHONE"},
			{ID: "SALE", SKU: ""}, {ID: "SALE", SKU: "P{X}"}, {ID: string(make([]byte, 65)), SKU: "PHONE"}} {
			_, err := s.AdmitCampaign(ctx, c, 1, nil, now)
			require.ErrorIs(t, err, inventory.ErrInvalidArgument, "%+v", c)
			require.ErrorIs(t, s.WarmCampaign(ctx, c), inventory.ErrInvalidArgument)
			require.ErrorIs(t, s.RealignCampaign(ctx, c), inventory.ErrInvalidArgument)
			require.ErrorIs(t, s.UndoCampaign(ctx, c, 1, Admission{Epoch: 1}, nil), inventory.ErrInvalidArgument)
			require.ErrorIs(t, s.ApplyCampaign(ctx, c, inventory.Change{Delta: 1, Seq: 1}), inventory.ErrInvalidArgument)
			require.ErrorIs(t, s.DropCampaigns(ctx, good, c), inventory.ErrInvalidArgument)
			_, err = s.CampaignLevels(ctx, c)
			require.ErrorIs(t, err, inventory.ErrInvalidArgument)
		}
		for _, qty := range []int64{0, -1, inventory.DefaultMaxQty + 1} {
			_, err := s.AdmitCampaign(ctx, good, qty, nil, now)
			require.ErrorIs(t, err, inventory.ErrInvalidArgument, "qty %d", qty)
		}
		_, err := s.AdmitCampaign(ctx, good, 1, nil, time.Time{})
		require.ErrorIs(t, err, inventory.ErrInvalidArgument, "no time")
		for _, b := range []Buyer{{User: "bad user", Limit: 1}, {User: "", Limit: 1}, {User: "u1", Limit: 0}} {
			_, err := s.AdmitCampaign(ctx, good, 1, &b, now)
			require.ErrorIs(t, err, inventory.ErrInvalidArgument, "%+v", b)
			require.ErrorIs(t, s.UndoCampaign(ctx, good, 1, Admission{Epoch: 1}, &b), inventory.ErrInvalidArgument)
		}
		require.Zero(t, f.calls.Load(), "no init was attempted")
		keys, err := rdb.Keys(ctx, "*").Result() // a cluster client asks one node; the others are checked below
		require.NoError(t, err)
		require.Empty(t, keys, "Redis was not touched")
		for _, k := range []string{campaignKey(good), campaignBuyersKey(good), campaignInitLockKey(good)} {
			n, err := rdb.Exists(ctx, k).Result()
			require.NoError(t, err)
			require.Zero(t, n, k)
		}

		bare := newStore(t, rdb, newFakeDB(map[string]int64{"PHONE": 5}))
		_, err = bare.AdmitCampaign(ctx, good, 1, nil, now)
		require.ErrorIs(t, err, errNoCampaigns)
		require.ErrorIs(t, bare.WarmCampaign(ctx, good), errNoCampaigns)
	})
}

// A SKU and its campaign are two pools: admissions of one never take from
// the other, and the SKU answers as before while its campaign is refused.
func TestCampaignAndSKUAreApart(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		opens, closes := window(time.Now().Add(time.Hour))
		f := newFakeCampaigns(map[string]*fakePool{"SALE": {left: 5, opens: opens, closes: closes}})
		db := newFakeDB(map[string]int64{"PHONE": 10})
		s, err := NewStore(rdb, Config{Init: db.init, InitCampaign: f.init})
		require.NoError(t, err)
		c := Campaign{ID: "SALE", SKU: "PHONE"}
		_, err = s.AdmitCampaign(ctx, c, 1, nil, time.Now())
		require.ErrorIs(t, err, inventory.ErrNotStarted)
		a, err := s.Admit(ctx, "PHONE", 3, "")
		require.NoError(t, err)
		require.EqualValues(t, 7, a.Remaining)
		_, err = s.AdmitBuyer(ctx, "PHONE", 1, Buyer{User: "u1", Limit: 1})
		require.NoError(t, err)
		adm, err := s.AdmitCampaign(ctx, c, 2, &Buyer{User: "u1", Limit: 2}, opens)
		require.NoError(t, err, "the SKU's limit is not the campaign's")
		require.EqualValues(t, 3, adm.Remaining)
		require.EqualValues(t, 6, levels(t, s, "PHONE").Available)
		require.EqualValues(t, 1, db.calls.Load())
		require.EqualValues(t, 1, f.calls.Load())
	})
}

// A campaign's buyers hash is fenced as a SKU's is, each apart from the
// other: each initialisation of the pool writes the counts the database
// has, marked with its epoch, so a buyer whose admission died (counted in
// Redis, never recorded) is not refused by that count once the pool is
// realigned, and a lost buyers hash (-10) initialises the pool again, the
// counts read from the database. A realign of the pool leaves the SKU's
// hash alone, and a SKU's lost hash the pool's.
func TestCampaignBuyersFencedAsASKUs(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		opens, closes := window(time.Now().Add(-time.Minute))
		f := newFakeCampaigns(map[string]*fakePool{"SALE": {left: 5, opens: opens, closes: closes}})
		db := newFakeDB(map[string]int64{"PHONE": 10})
		db.limit["PHONE"] = 2
		s, err := NewStore(rdb, Config{Init: db.init, InitCampaign: f.init})
		require.NoError(t, err)
		c := Campaign{ID: "SALE", SKU: "PHONE"}
		u1 := &Buyer{User: "u1", Limit: 1}
		now := time.Now()

		// u1's admission counted, and its process died before the database
		// recorded it: Redis refuses u1 by a count the database does not have.
		_, err = s.AdmitCampaign(ctx, c, 1, u1, now)
		require.NoError(t, err)
		_, err = s.AdmitCampaign(ctx, c, 1, u1, now)
		require.ErrorIs(t, err, inventory.ErrOverLimit)
		lv := campaignLevels(t, s, c)
		require.Equal(t, lv.Epoch, lv.BuyersEpoch, "the pool's buyers hash carries its epoch")
		require.NoError(t, s.RealignCampaign(ctx, c))
		_, err = s.AdmitCampaign(ctx, c, 1, u1, now)
		require.NoError(t, err, "realigned: the database's counts, without the dead admission's")
		require.EqualValues(t, 2, f.calls.Load())

		// The database recorded that sale; the pool's buyers hash is lost:
		// the next admission with a limit initialises the pool again, with
		// the database's counts, and u1 is refused by them.
		f.pools["SALE"].left, f.pools["SALE"].buyers = 4, map[string]int64{"u1": 1}
		require.NoError(t, rdb.Del(ctx, campaignBuyersKey(c)).Err())
		_, err = s.AdmitCampaign(ctx, c, 1, u1, now)
		require.ErrorIs(t, err, inventory.ErrOverLimit, "-10: initialised again, and u1's count is the database's")
		require.EqualValues(t, 3, f.calls.Load())
		require.EqualValues(t, 4, campaignLevels(t, s, c).Available)
		_, err = s.AdmitCampaign(ctx, c, 1, nil, now)
		require.NoError(t, err, "an admission without a limit reads no counts")

		// The SKU's own hash is another count, fenced by the SKU's epoch.
		_, err = s.AdmitBuyer(ctx, "PHONE", 1, Buyer{User: "u1", Limit: 2})
		require.NoError(t, err, "the campaign's counts are not the SKU's")
		before, err := rdb.HGetAll(ctx, buyersKey("PHONE")).Result()
		require.NoError(t, err)
		require.NoError(t, s.RealignCampaign(ctx, c))
		after, err := rdb.HGetAll(ctx, buyersKey("PHONE")).Result()
		require.NoError(t, err)
		require.Equal(t, before, after, "a realign of the pool leaves the SKU's buyers hash alone")
		pool, err := rdb.HGetAll(ctx, campaignBuyersKey(c)).Result()
		require.NoError(t, err)
		require.NoError(t, rdb.Del(ctx, buyersKey("PHONE")).Err())
		_, err = s.AdmitBuyer(ctx, "PHONE", 1, Buyer{User: "u1", Limit: 2})
		require.NoError(t, err)
		require.EqualValues(t, 2, db.calls.Load(), "-10 initialised the SKU again")
		after, err = rdb.HGetAll(ctx, campaignBuyersKey(c)).Result()
		require.NoError(t, err)
		require.Equal(t, pool, after, "and left the pool's buyers hash alone")
		h, err := rdb.HGetAll(ctx, stockKey("PHONE")).Result()
		require.NoError(t, err)
		require.NotContains(t, h, "o", "a SKU's hash has no window")
	})
}

// An ended campaign has nothing in Redis: an initialisation of it (a late
// buy's, a node's with a stale view) writes nothing and answers ended; a
// realign of it deletes what Redis still had; an undo or an apply that
// comes after its keys were dropped writes nothing either; and whatever
// fails, an initialisation makes the keys expire CampaignKeysLinger after
// the window's close.
func TestCampaignEndedWritesNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		opens, closes := window(time.Now().Add(-time.Minute))
		f := newFakeCampaigns(map[string]*fakePool{"SALE": {left: 5, opens: opens, closes: closes}})
		s := newCampaignStore(t, rdb, f)
		c := Campaign{ID: "SALE", SKU: "PHONE"}
		u1 := &Buyer{User: "u1", Limit: 2}
		keys := func() int64 {
			n, err := rdb.Exists(ctx, campaignKey(c), campaignBuyersKey(c), campaignInitLockKey(c)).Result()
			require.NoError(t, err)
			return n
		}
		adm, err := s.AdmitCampaign(ctx, c, 1, u1, time.Now())
		require.NoError(t, err)
		require.EqualValues(t, 2, keys())
		for _, k := range []string{campaignKey(c), campaignBuyersKey(c)} {
			require.InDelta(t, closes.Add(CampaignKeysLinger).UnixMilli(), expiresAt(t, rdb, k), 5, k)
		}

		f.pools["SALE"].ended = true // the end released the pool
		require.NoError(t, s.RealignCampaign(ctx, c), "an ended campaign is realigned to nothing")
		require.Zero(t, keys())
		_, err = s.AdmitCampaign(ctx, c, 1, u1, time.Now())
		require.ErrorIs(t, err, inventory.ErrEnded, "a buy its view let through")
		require.ErrorIs(t, s.WarmCampaign(ctx, c), inventory.ErrEnded)
		require.NoError(t, s.UndoCampaign(ctx, c, 1, adm, u1), "the sale in flight at the end, refused")
		require.NoError(t, s.ApplyCampaign(ctx, c, inventory.Change{Delta: 1, Seq: 99, Buyers: map[string]int64{"u1": -1}}))
		require.Zero(t, keys(), "nothing written again")

		// Keys an end failed to delete (Redis was away): a realign of the
		// ended campaign deletes them, as DropCampaigns does.
		f.pools["SALE"].ended = false
		require.NoError(t, s.WarmCampaign(ctx, c))
		require.EqualValues(t, 2, keys())
		require.NoError(t, s.DropCampaigns(ctx, c))
		require.Zero(t, keys())
	})
}

// Realigns of one pool asked for at once coalesce: while one runs, every
// caller that arrives shares the next one (which starts after the running
// one, so it reads what each caller's refusal or change left in the
// database), instead of each taking the pool's row lock in turn. make
// bench's openings met such bursts at the end of a sale: each sale the
// database refused asked for its own realign, 40 in a row held the pool's
// row from the group commit, and each new copy counted the admissions
// then in flight as available again, so more sales were refused.
func TestCampaignRealignsCoalesce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		opens, closes := window(time.Now().Add(-time.Minute))
		f := newFakeCampaigns(map[string]*fakePool{"SALE": {left: 5, opens: opens, closes: closes}})
		s := newCampaignStore(t, rdb, f)
		c := Campaign{ID: "SALE", SKU: "PHONE"}
		require.NoError(t, s.WarmCampaign(ctx, c))
		f.calls.Store(0)
		f.delay = 300 * time.Millisecond // the first realign is still reading when the others ask
		var wg sync.WaitGroup
		for range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				assert.NoError(t, s.RealignCampaign(ctx, c))
			}()
		}
		wg.Wait()
		require.LessOrEqual(t, f.calls.Load(), int64(2), "the running realign and one after it")
		require.EqualValues(t, 5, campaignLevels(t, s, c).Available)

		// A realign asked for while one runs is not answered by it: its
		// change may have come after that one read the database.
		f.calls.Store(0)
		f.delay, f.hold = 0, make(chan struct{})
		first := make(chan error)
		go func() { first <- s.RealignCampaign(ctx, c) }()
		for f.calls.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		f.mu.Lock()
		f.pools["SALE"].left = 4 // committed after the first realign read 5
		f.mu.Unlock()
		second := make(chan error)
		go func() { second <- s.RealignCampaign(ctx, c) }()
		time.Sleep(50 * time.Millisecond) // the second is asked for while the first runs
		close(f.hold)
		require.NoError(t, <-first)
		require.NoError(t, <-second)
		require.EqualValues(t, 2, f.calls.Load())
		require.EqualValues(t, 4, campaignLevels(t, s, c).Available)
	})
}
