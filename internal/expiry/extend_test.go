package expiry

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/order"
)

// An extended order moves on the delay queue: the poller does not fire it
// at its first deadline, and releases it at its new one.
func TestExtensionMovesTheQueueEntry(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.addSKU("A", 10)
	n := r.node(fastTimeouts)
	o, err := n.svc.Create(ctx, "u1", "", line("A", 2))
	require.NoError(t, err)
	ext, err := n.svc.Extend(ctx, o.ID, "u1", "", 40*time.Minute)
	require.NoError(t, err)
	score, err := r.rdb.ZScore(ctx, shardOf(n.tm, o.ID).due, o.ID).Result()
	require.NoError(t, err)
	require.EqualValues(t, dueAt(o.ID, ext.ExpiresAt).Score, score, "the entry waits for the new deadline")

	r.clock.Advance(15*time.Minute + time.Millisecond)
	expired, _, err := n.tm.PollOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, expired)
	r.requireQty("A", 10, 2)

	r.clock.Advance(25 * time.Minute)
	expired, _, err = n.tm.PollOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, expired)
	r.requireStockBack(map[string]int64{"A": 10})
}

// The delay queue never learns of an extension (the node that extended lost
// its Redis write): the old entry fires at the old deadline, the
// conditional expiry refuses (the database's deadline is later), and the
// order goes back on the queue at the database's deadline, to be released
// then.
func TestLostExtensionWriteIsRequeuedAtTheDatabaseDeadline(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.addSKU("A", 10)
	n := r.node(fastTimeouts)
	o, err := n.svc.Create(ctx, "u1", "", line("A", 2))
	require.NoError(t, err)
	lost := order.NewService(r.db, n.st, order.Config{TTL: 15 * time.Minute, Now: r.clock.Now}) // no OnExtended: the write is lost
	t.Cleanup(func() { _ = lost.Close() })
	ext, err := lost.Extend(ctx, o.ID, "u1", "", 40*time.Minute)
	require.NoError(t, err)
	score, err := r.rdb.ZScore(ctx, shardOf(n.tm, o.ID).due, o.ID).Result()
	require.NoError(t, err)
	require.EqualValues(t, dueAt(o.ID, o.ExpiresAt).Score, score, "the queue still has the first deadline")

	r.clock.Advance(15*time.Minute + time.Millisecond)
	expired, _, err := n.tm.PollOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, expired, "the conditional expiry refuses an order whose deadline moved")
	got, err := n.svc.Get(ctx, o.ID)
	require.NoError(t, err)
	require.Equal(t, order.Pending, got.Status)
	score, err = r.rdb.ZScore(ctx, shardOf(n.tm, o.ID).due, o.ID).Result()
	require.NoError(t, err, "the order is back on the queue")
	require.EqualValues(t, dueAt(o.ID, ext.ExpiresAt).Score, score, "at the database's deadline")
	claimed, err := r.rdb.ZCard(ctx, shardOf(n.tm, o.ID).claimed).Result()
	require.NoError(t, err)
	require.Zero(t, claimed)
	r.requireQty("A", 10, 2)

	r.clock.Advance(25 * time.Minute)
	expired, _, err = n.tm.PollOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, expired)
	r.requireStockBack(map[string]int64{"A": 10})
}
