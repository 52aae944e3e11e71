package maintenance_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/maintenance"
	"github.com/acme/inventory/testkit/testrig"
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

// recordHeld records a HELD reservation of qty of sku under token in the
// database, as the group commit records an admitted sale (campaign: a sale
// from that campaign's pool, for an order named token).
func recordHeld(t *testing.T, r *testrig.Rig, token, sku, campaign string, qty int64) {
	t.Helper()
	now := time.Now().UTC().Truncate(time.Microsecond)
	row := arbiter.Reservation{Token: token, SKU: sku, Qty: qty, State: arbiter.Held, ExpiresAt: now.Add(time.Hour),
		CreatedAt: now, UpdatedAt: now}
	if campaign != "" {
		row.OrderID, row.CampaignID = &token, &campaign
	}
	require.NoError(t, arbiter.Transact(context.Background(), r.DB, func(tx *gorm.DB) error {
		_, err := arbiter.In(tx).Reserve([]arbiter.Hold{{Row: row}})
		return err
	}))
}

// releaseHeld releases token's reservations in the database and brings
// nothing into Redis: a give-back Redis lost.
func releaseHeld(t *testing.T, r *testrig.Rig, token string) {
	t.Helper()
	require.NoError(t, arbiter.Transact(context.Background(), r.DB, func(tx *gorm.DB) error {
		_, err := arbiter.In(tx).Release(token, "")
		return err
	}))
}

// The periodic realign does not fight a live sale: a SKU whose Redis value
// is behind the database only by an admission in flight (Redis took the
// unit, the group commit records it while the realign watches) is left as
// it is: same initialisation, and the sale lands in it. A real drift is
// still put right in the same round: a give-back Redis lost (behind, and
// nothing moves while the realign watches), and a Redis ahead of the
// database (no admission in flight puts it there: at once, without
// watching).
func TestRealignLeavesAdmissionsInFlight(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	sku := r.PutSKU("RA", 10, 0)
	require.NoError(t, r.Stock.EnsureInit(ctx, sku))
	before, err := r.Stock.Levels(ctx, sku)
	require.NoError(t, err)
	rec := r.Reconciler()
	var watched int
	lands := func(ctx context.Context) { watched++; recordHeld(t, r, "t.flight", sku, "", 1) }
	maintenance.SetSettleWait(rec, lands)

	_, err = r.Stock.Admit(ctx, sku, 1, "") // in flight: the database has not recorded it yet
	require.NoError(t, err)
	done, err := rec.Realign(ctx)
	require.NoError(t, err)
	require.Empty(t, done, "a realign during a sale moved %s, only behind by an admission in flight", sku)
	require.Equal(t, 1, watched)
	lv, err := r.Stock.Levels(ctx, sku)
	require.NoError(t, err)
	require.Equal(t, before.Epoch, lv.Epoch, "the initialisation the sale was admitted from stays")
	require.EqualValues(t, 9, lv.Available)
	r.RequireQty(sku, 10, 1)
	r.CheckInvariant(sku)

	// A give-back Redis lost: behind, and nothing moves while it watches.
	maintenance.SetSettleWait(rec, func(context.Context) { watched++ })
	releaseHeld(t, r, "t.flight")
	require.EqualValues(t, 9, r.RedisAvailable(sku))
	done, err = rec.Realign(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{sku}, done, "a real drift is realigned in the round")
	require.Equal(t, 2, watched)
	require.EqualValues(t, 10, r.RedisAvailable(sku))
	r.CheckInvariant(sku)

	// Redis ahead of the database (it came back with units the database
	// gave to nobody): realigned at once.
	require.NoError(t, r.RDB.HIncrBy(ctx, "inv:{"+sku+"}:stock", "a", 3).Err())
	done, err = rec.Realign(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{sku}, done)
	require.Equal(t, 2, watched, "ahead: nothing to watch")
	require.EqualValues(t, 10, r.RedisAvailable(sku))
	r.CheckInvariant(sku)
}

// The same for a campaign's pool: a sale in flight (admitted from the pool
// in Redis, recorded while the realign watches) leaves the pool as it is;
// a unit given back to the pool that Redis lost is put right in the round.
func TestRealignLeavesCampaignAdmissionsInFlight(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	c := putCampaign(t, r, 10, time.Now().Add(-time.Minute))
	before, err := r.Stock.CampaignLevels(ctx, c)
	require.NoError(t, err)
	require.True(t, before.Initialised)
	rec := r.Reconciler()
	var watched int
	maintenance.SetSettleWait(rec, func(context.Context) { watched++; recordHeld(t, r, "o-flight", c.SKU, c.ID, 1) })

	_, err = r.Stock.AdmitCampaign(ctx, c, 1, nil, time.Now())
	require.NoError(t, err)
	done, err := rec.RealignCampaigns(ctx)
	require.NoError(t, err)
	require.Empty(t, done, "a realign during a sale moved %s, only behind by an admission in flight", c)
	require.Equal(t, 1, watched)
	lv, err := r.Stock.CampaignLevels(ctx, c)
	require.NoError(t, err)
	require.Equal(t, before.Epoch, lv.Epoch, "the initialisation the sale was admitted from stays")
	require.EqualValues(t, 9, lv.Available)
	n, err := arbiter.CountCampaign(r.DB, c.ID)
	require.NoError(t, err)
	require.EqualValues(t, 9, n.Left)

	// The sale released back into the pool, and Redis lost the give-back.
	maintenance.SetSettleWait(rec, func(context.Context) { watched++ })
	releaseHeld(t, r, "o-flight")
	done, err = rec.RealignCampaigns(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{c.ID}, done, "a real drift is realigned in the round")
	require.Equal(t, 2, watched)
	lv, err = r.Stock.CampaignLevels(ctx, c)
	require.NoError(t, err)
	require.EqualValues(t, 10, lv.Available)

	// Ahead of the pool: at once.
	require.NoError(t, r.RDB.HIncrBy(ctx, "inv:{"+c.SKU+"}:c:"+c.ID, "a", 2).Err())
	done, err = rec.RealignCampaigns(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{c.ID}, done)
	require.Equal(t, 2, watched, "ahead: nothing to watch")
	lv, err = r.Stock.CampaignLevels(ctx, c)
	require.NoError(t, err)
	require.EqualValues(t, 10, lv.Available)
}
