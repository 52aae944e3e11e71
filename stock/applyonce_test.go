package stock

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
)

// twiceHook sends every run of the apply script twice while on: what Redis
// sees when a reply is lost and go-redis sends the command again.
type twiceHook struct{ on atomic.Bool }

func (*twiceHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *twiceHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.on.Load() && isApply(cmd) {
			_ = next(ctx, cmd) // the first delivery, whose reply is lost
		}
		return next(ctx, cmd)
	}
}

func (*twiceHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// isApply is whether cmd runs applyScript (EVALSHA, or EVAL after NOSCRIPT).
func isApply(cmd redis.Cmder) bool {
	args := cmd.Args()
	if len(args) < 2 {
		return false
	}
	name, _ := args[0].(string)
	body, _ := args[1].(string)
	switch strings.ToLower(name) {
	case "evalsha":
		return body == applyScript.Hash()
	case "eval":
		sum := sha1.Sum([]byte(body))
		return hex.EncodeToString(sum[:]) == applyScript.Hash()
	}
	return false
}

// A committed change counts once in Redis however often it is delivered:
// sent again by go-redis after a lost reply, applied again by a caller,
// interleaved with other changes or out of seq order, on a SKU's stock and
// on a campaign's pool alike.
func TestApplyCountsEachChangeOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		db := newFakeDB(map[string]int64{"A": 10})
		s := newStore(t, rdb, db)
		require.EqualValues(t, 10, levels(t, s, "A").Available)
		avail := func() int64 { t.Helper(); return levels(t, s, "A").Available }

		// A release (seq 1), sent twice on the wire as a retry after a lost
		// reply does.
		twice := &twiceHook{}
		rdb.AddHook(twice)
		twice.on.Store(true)
		require.NoError(t, s.Apply(ctx, inventory.Change{SKU: "A", Delta: 2, Seq: 1}))
		twice.on.Store(false)
		require.EqualValues(t, 12, avail(), "a change sent twice counts once")

		// Delivered again by the caller, interleaved with another change.
		require.NoError(t, s.Apply(ctx, inventory.Change{SKU: "A", Delta: 3, Seq: 2}))
		require.NoError(t, s.Apply(ctx, inventory.Change{SKU: "A", Delta: 2, Seq: 1}))
		require.NoError(t, s.Apply(ctx, inventory.Change{SKU: "A", Delta: 3, Seq: 2}))
		require.EqualValues(t, 15, avail(), "each of two changes counts once, in any order")

		// A reservation that committed after a re-init (taken again from
		// the new value), delivered twice: taken once.
		old := levels(t, s, "A").Epoch + 1
		require.NoError(t, s.Apply(ctx, inventory.Change{SKU: "A", Delta: -4, Seq: 3, Epoch: old}))
		require.NoError(t, s.Apply(ctx, inventory.Change{SKU: "A", Delta: -4, Seq: 3, Epoch: old}))
		require.EqualValues(t, 11, avail())
		// Two reservations of one group commit share its seq: their refs
		// (their tokens) tell them apart; each counts, once.
		for range 2 {
			for _, ref := range []string{"o1", "t.o2"} {
				require.NoError(t, s.Apply(ctx, inventory.Change{SKU: "A", Delta: -1, Seq: 3, Epoch: old, Ref: ref}))
			}
		}
		require.EqualValues(t, 9, avail())
		require.NoError(t, s.Apply(ctx, inventory.Change{SKU: "A", Delta: 2, Seq: 3, Ref: "t.o2"}),
			"a ref names the change within its seq, not alone")
		require.EqualValues(t, 9, avail())
		require.ErrorIs(t, s.Apply(ctx, inventory.Change{SKU: "A", Delta: 1, Seq: 99, Ref: "o 3"}), inventory.ErrInvalidArgument)
		require.EqualValues(t, 9, avail())

		// Out of order: seq 6 lands before 4 and 5 (two nodes applying their
		// follow-ups at once; a gap is legal), then everything again.
		for range 2 {
			for _, c := range []inventory.Change{{SKU: "A", Delta: 1, Seq: 6}, {SKU: "A", Delta: -2, Seq: 4}, {SKU: "A", Delta: 5, Seq: 5}} {
				require.NoError(t, s.Apply(ctx, c))
			}
		}
		require.EqualValues(t, 13, avail(), "late changes count, once each")

		// A change the initialisation read is not counted again; after a
		// re-init, a later change counts once in the new value.
		db.mu.Lock()
		db.reserved["A"], db.seq["A"] = -3, 6 // the database's level, as Redis now has it
		db.mu.Unlock()
		require.NoError(t, s.Realign(ctx, "A"))
		require.EqualValues(t, 13, avail())
		h, err := rdb.HGetAll(ctx, stockKey("A")).Result()
		require.NoError(t, err)
		require.Equal(t, []string{"a", "e", "s"}, slices.Sorted(maps.Keys(h)), "the re-init forgot the replaced value's changes")
		require.NoError(t, s.Apply(ctx, inventory.Change{SKU: "A", Delta: 5, Seq: 5}))
		for range 2 {
			require.NoError(t, s.Apply(ctx, inventory.Change{SKU: "A", Delta: 1, Seq: 7}))
		}
		require.EqualValues(t, 14, avail())
	})
}

// The same on a campaign's pool, which applyScript fences with the pool's
// own seq and epoch.
func TestApplyCampaignCountsEachChangeOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		opens, closes := window(time.Now().Add(-time.Minute))
		f := newFakeCampaigns(map[string]*fakePool{"SALE": {left: 10, seq: 5, opens: opens, closes: closes}})
		s := newCampaignStore(t, rdb, f)
		c := Campaign{ID: "SALE", SKU: "PHONE"}
		require.NoError(t, s.WarmCampaign(ctx, c))
		left := func() int64 { t.Helper(); return campaignLevels(t, s, c).Available }

		twice := &twiceHook{}
		rdb.AddHook(twice)
		twice.on.Store(true)
		require.NoError(t, s.ApplyCampaign(ctx, c, inventory.Change{Delta: 1, Seq: 6}))
		twice.on.Store(false)
		require.EqualValues(t, 11, left(), "a unit released into the pool, sent twice, counts once")

		require.NoError(t, s.ApplyCampaign(ctx, c, inventory.Change{Delta: 1, Seq: 8}))
		require.NoError(t, s.ApplyCampaign(ctx, c, inventory.Change{Delta: 1, Seq: 6}))
		require.NoError(t, s.ApplyCampaign(ctx, c, inventory.Change{Delta: 1, Seq: 7}))
		require.NoError(t, s.ApplyCampaign(ctx, c, inventory.Change{Delta: 1, Seq: 8}))
		require.NoError(t, s.ApplyCampaign(ctx, c, inventory.Change{Delta: 1, Seq: 7}))
		require.EqualValues(t, 13, left(), "out of order and again: each once")

		old := campaignLevels(t, s, c).Epoch + 1
		for range 2 {
			require.NoError(t, s.ApplyCampaign(ctx, c, inventory.Change{Delta: -1, Seq: 9, Epoch: old}))
		}
		require.EqualValues(t, 12, left())
	})
}

// Redis remembers a bounded number of the changes it applied: the stock
// hash never holds more than appliedKept of them, however many a SKU sees
// between two initialisations. A change older than every one it still
// remembers cannot be told apart from one it forgot: it realigns the SKU
// (the database counted it either way), whether it is a duplicate or a
// first delivery that came very late.
func TestApplyRemembersBoundedly(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		db := newFakeDB(map[string]int64{"A": 1000})
		db.reserved["A"] = 500
		s := newStore(t, rdb, db)
		require.EqualValues(t, 500, levels(t, s, "A").Available)
		kept := func() int {
			t.Helper()
			h, err := rdb.HGetAll(ctx, stockKey("A")).Result()
			require.NoError(t, err)
			n := 0
			for f := range h {
				if strings.HasPrefix(f, "#") {
					n++
				}
			}
			require.LessOrEqual(t, len(h), 5+appliedKept, "a, e, s, m, n and the ids kept: %v", h)
			return n
		}

		// 200 releases, applied in pairs out of order, each twice.
		var chs []inventory.Change
		for range 200 {
			chs = append(chs, inventory.Change{SKU: "A", Delta: 1, Seq: db.release("A", 1)})
		}
		realigns := s.Stats().Realigns.Load()
		for i := 0; i < len(chs); i += 2 {
			for _, c := range []inventory.Change{chs[i+1], chs[i], chs[i+1], chs[i]} {
				require.NoError(t, s.Apply(ctx, c))
			}
		}
		require.Equal(t, db.available("A"), levels(t, s, "A").Available, "each counted once")
		require.Equal(t, realigns, s.Stats().Realigns.Load(), "out of order within the window: nothing to realign")
		require.Equal(t, appliedKept, kept())

		// A duplicate of a forgotten change: realigned, not counted again.
		require.NoError(t, s.Apply(ctx, chs[0]))
		require.Equal(t, realigns+1, s.Stats().Realigns.Load())
		require.Equal(t, db.available("A"), levels(t, s, "A").Available)
		require.Zero(t, kept(), "the realign is a new initialisation")

		// A first delivery that comes after more than appliedKept later
		// changes were applied: realigned, so it counts (once).
		late := inventory.Change{SKU: "A", Delta: 1, Seq: db.release("A", 1)}
		for range appliedKept + 1 {
			require.NoError(t, s.Apply(ctx, inventory.Change{SKU: "A", Delta: 1, Seq: db.release("A", 1)}))
		}
		require.Equal(t, db.available("A")-1, levels(t, s, "A").Available)
		require.NoError(t, s.Apply(ctx, late))
		require.Equal(t, realigns+2, s.Stats().Realigns.Load())
		require.Equal(t, db.available("A"), levels(t, s, "A").Available)
		require.NoError(t, s.Apply(ctx, late))
		require.Equal(t, db.available("A"), levels(t, s, "A").Available)
	})
}
