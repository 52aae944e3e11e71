package maintenance_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/maintenance"
	"github.com/acme/inventory/internal/testrig"
)

// The realign job runs on one node per interval and puts a drifted Redis
// right without anybody touching the SKU.
func TestRealignerRepairsDrift(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	cat := r.Catalog
	_, err := cat.Put(ctx, "A", 10, 0)
	require.NoError(t, err)
	_, err = cat.Put(ctx, "B", 10, 0)
	require.NoError(t, err)
	// An admission whose process died before its database write: Redis lost
	// the units, the database never counted them.
	_, err = r.Stock.Admit(ctx, "A", 4, "")
	require.NoError(t, err)
	require.EqualValues(t, 6, r.RedisAvailable("A"))

	jobs := []*maintenance.Realigner{maintenance.NewRealigner(r.Reconciler(), r.Stock.Locker(), 300*time.Millisecond, nil),
		maintenance.NewRealigner(r.Reconciler(), r.Stock.Locker(), 300*time.Millisecond, nil)}
	for _, j := range jobs {
		j.Start(ctx)
	}
	require.Eventually(t, func() bool { return jobs[0].Realigned.Load()+jobs[1].Realigned.Load() >= 1 },
		30*time.Second, 10*time.Millisecond)
	for _, j := range jobs {
		j.Stop()
		j.Stop()
	}
	require.EqualValues(t, 1, jobs[0].Realigned.Load()+jobs[1].Realigned.Load(), "only A differed, and it was realigned once")
	require.EqualValues(t, 10, r.RedisAvailable("A"))
	r.CheckInvariant("A")
	r.CheckInvariant("B")
}

// A Redis that came back from before the SKU's last initialisation (a
// snapshot restore, a failover to a replica that missed the init) is found by
// its epoch even when its number happens to equal the database's.
func TestRealignFindsAnOlderEpoch(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	cat := r.Catalog
	_, err := cat.Put(ctx, "A", 10, 0)
	require.NoError(t, err)
	skus, err := r.Reconciler().Realign(ctx)
	require.NoError(t, err)
	require.Empty(t, skus, "a fresh SKU is aligned")

	old, err := r.Stock.Levels(ctx, "A")
	require.NoError(t, err)
	require.NoError(t, r.Stock.Realign(ctx, "A"))                              // a new initialisation (the one the snapshot missed)
	require.NoError(t, r.RDB.HSet(ctx, "inv:{A}:stock", "e", old.Epoch).Err()) // Redis comes back older
	skus, err = r.Reconciler().Realign(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"A"}, skus)
	lv, err := r.Stock.Levels(ctx, "A")
	require.NoError(t, err)
	require.Equal(t, r.SKU("A").RedisEpoch, lv.Epoch, "Redis carries the database's epoch again")
	require.EqualValues(t, 10, lv.Available)
	skus, err = r.Reconciler().Realign(ctx)
	require.NoError(t, err)
	require.Empty(t, skus)
}
