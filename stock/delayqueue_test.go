package stock

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// The delay queue's Redis operations on every backend: entries wait in
// their shard until due, a claim takes them under a lease (so a second
// claim before the lease ends takes nothing, and one after it takes them
// again: their poller died), Done drops them, Remove drops a due entry, a
// claim reports the earliest entry left, and the legacy queue is drained.
func TestDelayQueue(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		q := NewDelayQueue(rdb, 4)
		all := []Queue{0, 1, 2, 3}
		base := time.UnixMilli(1_700_000_000_000)
		var entries []Entry
		for i := range 12 {
			entries = append(entries, Entry{ID: fmt.Sprintf("o%02d", i), Deadline: base.Add(time.Duration(i) * time.Second)})
		}
		require.NoError(t, q.Add(ctx, entries...))
		shards := map[Queue]bool{}
		for _, e := range entries {
			shards[q.ShardOf(e.ID)] = true
			score, err := rdb.ZScore(ctx, timeoutDueKey(int(q.ShardOf(e.ID))), e.ID).Result()
			require.NoError(t, err)
			require.Equal(t, float64(e.Deadline.UnixMilli()), score)
		}
		require.Greater(t, len(shards), 1, "ids spread over shards")

		claimAll := func(now time.Time, limit int) (ids []string, next int64) {
			t.Helper()
			out, err := q.Claim(ctx, all, now, limit, 10*time.Second)
			require.NoError(t, err)
			next = -1
			for _, c := range out {
				require.True(t, c.OK)
				ids = append(ids, c.IDs...)
				if c.Next >= 0 && (next < 0 || c.Next < next) {
					next = c.Next
				}
			}
			slices.Sort(ids)
			return ids, next
		}

		ids, next := claimAll(base.Add(-time.Millisecond), 100)
		require.Empty(t, ids, "nothing is due yet")
		require.Equal(t, base.UnixMilli(), next)

		require.NoError(t, q.Remove(ctx, "o03"))
		ids, next = claimAll(base.Add(4*time.Second), 100)
		require.Equal(t, []string{"o00", "o01", "o02", "o04"}, ids, "due by now, o03 removed")
		require.Equal(t, base.Add(5*time.Second).UnixMilli(), next)
		ids, _ = claimAll(base.Add(5*time.Second-time.Millisecond), 100)
		require.Empty(t, ids, "claimed entries are leased; nothing else is due")

		// The poller died: after the lease its claims come back.
		ids, _ = claimAll(base.Add(14*time.Second+time.Millisecond), 100)
		require.Len(t, ids, 11, "the expired claims and everything due by now")
		done := map[Queue][]string{}
		for _, id := range ids {
			done[q.ShardOf(id)] = append(done[q.ShardOf(id)], id)
		}
		require.NoError(t, q.Done(ctx, done))
		ids, next = claimAll(base.Add(time.Hour), 100)
		require.Empty(t, ids)
		require.Equal(t, int64(-1), next, "both sets of every shard are empty")

		// The legacy queue is claimed from like a shard.
		require.NoError(t, rdb.ZAdd(ctx, legacyTimeoutDueKey, redis.Z{Score: float64(base.UnixMilli()), Member: "old"}).Err())
		out, err := q.Claim(ctx, []Queue{Legacy}, base, 10, time.Second)
		require.NoError(t, err)
		require.Equal(t, []Claimed{{OK: true, IDs: []string{"old"}, Next: base.Add(time.Second).UnixMilli()}}, out)
		require.NoError(t, q.Done(ctx, map[Queue][]string{Legacy: {"old"}}))
		n, err := rdb.Exists(ctx, legacyTimeoutDueKey, legacyTimeoutClaimedKey).Result()
		require.NoError(t, err)
		require.Zero(t, n)

		// A server that lost its scripts (a restart, a new master) still
		// answers a claim: NOSCRIPT sends the script itself.
		require.NoError(t, q.Add(ctx, Entry{ID: "late", Deadline: base}))
		flushScripts(t, rdb)
		out, err = q.Claim(ctx, []Queue{q.ShardOf("late")}, base, 10, time.Second)
		require.NoError(t, err)
		require.Equal(t, []string{"late"}, out[0].IDs)
	})
}

// flushScripts empties the script cache of every server behind rdb.
func flushScripts(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	if c, ok := rdb.(*redis.ClusterClient); ok {
		require.NoError(t, c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			return n.ScriptFlush(ctx).Err()
		}))
		return
	}
	require.NoError(t, rdb.ScriptFlush(ctx).Err())
}
