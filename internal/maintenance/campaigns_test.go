package maintenance_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/campaign"
	"github.com/acme/inventory/internal/maintenance"
	"github.com/acme/inventory/stock"
	"github.com/acme/inventory/testkit/testenv"
	"github.com/acme/inventory/testkit/testrig"
)

func putCampaign(t *testing.T, r *testrig.Rig, allotment int64, starts time.Time, perUser ...int64) stock.Campaign {
	t.Helper()
	sku := r.PutSKU("MC", 20, 0)
	id := testenv.Unique("c")
	spec := campaign.Spec{SKU: sku, Allotment: allotment, StartsAt: starts, EndsAt: starts.Add(time.Hour)}
	if len(perUser) > 0 {
		spec.PerUserLimit = perUser[0]
	}
	_, err := r.Campaigns.Put(context.Background(), id, spec, nil)
	require.NoError(t, err)
	return stock.Campaign{ID: id, SKU: sku}
}

func redisLeft(t *testing.T, r *testrig.Rig, c stock.Campaign) (int64, bool) {
	t.Helper()
	lv, err := r.Stock.CampaignLevels(context.Background(), c)
	require.NoError(t, err)
	return lv.Available, lv.Initialised
}

// Redis's copy of a live campaign's pool came back older (a rollback: more
// units than the pool has): reconcile reports it, and the realign writes
// the pool again, so Redis never admits what the pool cannot cover. A
// campaign that opens soon and that Redis lost is written ahead of its
// opening (the warm-up); one that opens later is left to its time.
func TestCampaignPoolsRealignedAndWarmed(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	live := putCampaign(t, r, 10, time.Now().Add(-time.Minute))
	for i := range 3 {
		_, err := r.Campaigns.Buy(ctx, live.ID, fmt.Sprintf("u%d", i), "")
		require.NoError(t, err)
	}
	left, _ := redisLeft(t, r, live)
	require.EqualValues(t, 7, left)
	require.NoError(t, r.RDB.HSet(ctx, "inv:{"+live.SKU+"}:c:"+live.ID, "a", 10).Err()) // the rollback
	rec := r.Reconciler()
	reports, err := rec.ReconcileCampaigns(ctx, false)
	require.NoError(t, err)
	require.Len(t, reports, 1)
	require.Equal(t, live.ID, reports[0].ID)
	require.Equal(t, "Redis has 10 units left; the pool has 7", reports[0].Problem)
	require.False(t, reports[0].Repaired)

	soon := putCampaign(t, r, 5, time.Now().Add(5*time.Minute))
	later := putCampaign(t, r, 5, time.Now().Add(maintenance.WarmAhead+time.Hour))
	for _, c := range []stock.Campaign{soon, later} {
		require.NoError(t, r.RDB.Del(ctx, "inv:{"+c.SKU+"}:c:"+c.ID).Err()) // Redis lost them
	}
	done, err := rec.RealignCampaigns(ctx)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{live.ID, soon.ID}, done)
	left, _ = redisLeft(t, r, live)
	require.EqualValues(t, 7, left, "realigned from the pool")
	left, ok := redisLeft(t, r, soon)
	require.True(t, ok, "warmed ahead of its opening")
	require.EqualValues(t, 5, left)
	_, ok = redisLeft(t, r, later)
	require.False(t, ok, "an opening an hour away is left to its first buyer")
	reports, err = rec.ReconcileCampaigns(ctx, false)
	require.NoError(t, err)
	require.Empty(t, reports)
}

// An ended campaign's Redis keys are deleted by its end; when that
// deletion failed (Redis was away, the node died right after the end's
// commit), the realign deletes them: those of every campaign that ended
// within EndedKeysHorizon, never a live campaign's. A buy after the end is
// answered sale_ended without writing them again.
func TestEndedCampaignKeysAreDroppedAgain(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	ended := putCampaign(t, r, 10, time.Now().Add(-time.Minute), 2) // a limit: the buyers' counts are kept
	live := putCampaign(t, r, 10, time.Now().Add(-time.Minute), 2)
	for _, c := range []stock.Campaign{ended, live} {
		_, err := r.Campaigns.Buy(ctx, c.ID, "ann", "")
		require.NoError(t, err)
	}
	keys := func(c stock.Campaign) int64 {
		n, err := r.RDB.Exists(ctx, "inv:{"+c.SKU+"}:c:"+c.ID, "inv:{"+c.SKU+"}:cb:"+c.ID).Result()
		require.NoError(t, err)
		return n
	}
	left, err := r.RDB.HGetAll(ctx, "inv:{"+ended.SKU+"}:c:"+ended.ID).Result()
	require.NoError(t, err)
	_, err = r.Campaigns.End(ctx, ended.ID)
	require.NoError(t, err)
	require.Zero(t, keys(ended), "the end deleted them")
	require.NoError(t, r.RDB.HSet(ctx, "inv:{"+ended.SKU+"}:c:"+ended.ID, left).Err()) // as if it had failed
	require.NoError(t, r.RDB.HSet(ctx, "inv:{"+ended.SKU+"}:cb:"+ended.ID, "ann", 1).Err())

	rec := r.Reconciler()
	require.NoError(t, rec.DropEndedCampaigns(ctx, time.Now().Add(maintenance.EndedKeysHorizon+time.Hour)))
	require.EqualValues(t, 2, keys(ended), "an end older than the horizon is not looked at")
	_, err = rec.RealignCampaigns(ctx)
	require.NoError(t, err)
	require.Zero(t, keys(ended), "deleted by the realign")
	require.EqualValues(t, 2, keys(live), "a live campaign keeps its keys")

	_, err = r.Campaigns.Buy(ctx, ended.ID, "bob", "")
	require.ErrorIs(t, err, inventory.ErrEnded)
	require.Zero(t, keys(ended), "a late buy does not write them again")
}
