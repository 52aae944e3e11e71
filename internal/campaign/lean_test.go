package campaign_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/order"
	"github.com/acme/inventory/testkit/testrig"
)

// TestLeanContract runs the campaign suite again with every rig selling
// as the lean sale does, a campaign's holds numbered by the campaign
// (order.Config.LeanCampaigns): the contract the embedded default runs
// too, and after it the tests the lean run adds.
func TestLeanContract(t *testing.T) {
	testrig.RunLean(t, append(slices.Clone(contract),
		TestAnEndedCampaignLeavesNoKeys,
		TestBuysDuringTheSaleReadNoCounts,
		TestADeadAdmissionDoesNotCountAgainstTheBuyer,
		TestCampaignSaleOfUnknownOutcomeKeepsItsAdmission,
	)...)
}

// lean has the test's rigs sell as the lean sale does.
func lean(t *testing.T) {
	testrig.Lean = true
	t.Cleanup(func() { testrig.Lean = false })
}

// A campaign's lean holds are rows of holds numbered by the campaign
// (PoolID, its hold_seq), not by the SKU: the SKU's row is not touched by
// its sales. Without the projector, the campaign's counts, payment,
// cancel and the sweep all find them; projected, they write no RESERVE
// movement (the units came from the pool, reserved already).
func TestLeanCampaignHoldsWithoutTheProjector(t *testing.T) {
	lean(t)
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	id, sku := put(t, r, 20, 10, 0, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	skuSeq := r.Raw(`SELECT seq FROM skus WHERE sku = ?`, sku)
	var orders []*order.Order
	for i := range 4 {
		o, err := r.Campaigns.Buy(ctx, id, fmt.Sprintf("u%d", i), "")
		require.NoError(t, err)
		orders = append(orders, o)
	}
	require.Equal(t, skuSeq, r.Raw(`SELECT seq FROM skus WHERE sku = ?`, sku), "the SKU's row untouched")
	require.Zero(t, r.Raw(`SELECT COUNT(*) FROM stock_reservations WHERE campaign_id = ? AND order_id IS NOT NULL`, id))
	require.Equal(t, int64(4), r.Raw(`SELECT COUNT(*) FROM holds WHERE campaign_id = ? AND sku_id = ? AND seq BETWEEN 1 AND 4`,
		id, arbiter.PoolID(id)))
	require.Equal(t, int64(4), r.Raw(`SELECT result FROM stock_reservations WHERE token = ?`, arbiter.CampaignToken(id)), "numbered by the pool's changes")
	counts := func() arbiter.CampaignCounts {
		n, err := arbiter.CountCampaign(r.DB, id)
		require.NoError(t, err)
		return n
	}
	require.Equal(t, arbiter.CampaignCounts{Held: 4, Left: 6}, counts(), "the unprojected holds are counted")

	_, err := r.Orders.Pay(ctx, orders[0].ID, "pay-0")
	require.NoError(t, err)
	_, err = r.Orders.Cancel(ctx, orders[1].ID)
	require.NoError(t, err)
	require.Equal(t, arbiter.CampaignCounts{Sold: 1, Held: 2, Left: 7}, counts(), "projected and changed: counted once")

	r.Clock.Advance(testrig.TTL + time.Second)
	ids, err := r.Orders.ExpiredIDs(ctx, 10)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{orders[2].ID, orders[3].ID}, ids, "found by the sweep with the projector down")
	for _, id := range ids {
		expired, err := r.Orders.Expire(ctx, id)
		require.NoError(t, err)
		require.True(t, expired)
	}
	require.Equal(t, arbiter.CampaignCounts{Sold: 1, Left: 9}, counts())
	moves := r.Raw(`SELECT COUNT(*) FROM stock_movements WHERE sku = ?`, sku)
	r.Catch()
	require.Equal(t, moves, r.Raw(`SELECT COUNT(*) FROM stock_movements WHERE sku = ?`, sku), "no movement for a campaign's hold")
	require.Equal(t, int64(7), r.Raw(`SELECT projected_seq FROM campaigns WHERE id = ? AND holds_dirty = 1`, id),
		"past the pool's last change (4 sales, 3 give-backs), dirty while it sells")
	require.Equal(t, arbiter.CampaignCounts{Sold: 1, Left: 9}, counts())
	r.RequireQty(sku, 20, 10)
	r.CheckInvariant(sku)

	// Ended, its pool released: no sale can follow, and the projector's
	// next round clears it for good.
	_, err = r.Campaigns.End(ctx, id)
	require.NoError(t, err)
	require.Equal(t, int64(1), r.Raw(`SELECT holds_dirty FROM campaigns WHERE id = ?`, id))
	r.Catch()
	require.Zero(t, r.Raw(`SELECT holds_dirty FROM campaigns WHERE id = ?`, id), "cleared once the pool is released")
	r.RequireQty(sku, 20, 1)
	r.CheckInvariant(sku)
}

// Reconcile's repair counts a SKU's live reservations while a campaign of
// it sells lean: a sale that commits between the projection of the
// campaign's holds and the count would leave its unit counted neither in
// the pool (taken) nor among the reservations (not projected), and
// reserved would be set one short, a unit sold twice. Every repair must
// leave reserved at exactly what the campaign carved out, while buyers,
// cancels and the projector race it.
func TestLeanCampaignSalesRaceTheRepair(t *testing.T) {
	lean(t)
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	id, sku := put(t, r, 200, 60, 0, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	var done atomic.Bool
	var buyers, sold, cancelled atomic.Int64
	buyers.Store(40)
	var repairs []int64
	testrig.Race(42, func(i int) {
		switch i {
		case 0:
			for !done.Load() {
				if err := arbiter.Transact(ctx, r.DB, func(tx *gorm.DB) error { return arbiter.In(tx).FixReserved(sku) }); err != nil {
					t.Error(err)
					return
				}
				var reserved int64
				if err := r.DB.Raw(`SELECT reserved FROM skus WHERE sku = ?`, sku).Scan(&reserved).Error; err != nil {
					t.Error(err)
					return
				}
				repairs = append(repairs, reserved)
			}
		case 1:
			for !done.Load() {
				if _, err := r.Projector.Round(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		default:
			defer func() {
				if buyers.Add(-1) == 0 {
					done.Store(true)
				}
			}()
			for k := range 3 {
				o, err := r.Campaigns.Buy(ctx, id, fmt.Sprintf("u%d-%d", i, k), "")
				if errors.Is(err, inventory.ErrInsufficientStock) {
					continue
				}
				if err != nil {
					t.Errorf("buyer %d: %v", i, err)
					return
				}
				sold.Add(1)
				if k == 1 {
					if _, err := r.Orders.Cancel(ctx, o.ID); err != nil {
						t.Errorf("cancel %s: %v", o.ID, err)
						return
					}
					cancelled.Add(1)
				}
			}
		}
	})
	require.NotEmpty(t, repairs)
	for k, reserved := range repairs {
		require.Equal(t, int64(60), reserved, "repair %d of %d", k, len(repairs))
	}
	held := sold.Load() - cancelled.Load()
	n, err := arbiter.CountCampaign(r.DB, id)
	require.NoError(t, err)
	require.Equal(t, arbiter.CampaignCounts{Held: held, Left: 60 - held}, n)
	r.RequireQty(sku, 200, 60)
	r.CheckInvariant(sku)
}

// Live campaigns stay dirty while they sell, with nothing to project most
// of the time: a round that finds a full page of them idle says there is
// no more, reads none of their holds and writes no cursor, so an idle
// projector pauses however many campaigns are live.
func TestIdleLiveCampaignsLeaveTheProjectorIdle(t *testing.T) {
	lean(t)
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	for i := range 3 {
		id, _ := put(t, r, 10, 5, 0, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
		_, err := r.Campaigns.Buy(ctx, id, fmt.Sprintf("u%d", i), "")
		require.NoError(t, err)
	}
	round := func() arbiter.Projected {
		var p arbiter.Projected
		require.NoError(t, arbiter.Transact(ctx, r.DB, func(tx *gorm.DB) (err error) {
			p, err = arbiter.In(tx).ProjectBacklog(arbiter.Backlog{SKUs: 2, PerSKU: 10, Holds: 100})
			return err
		}))
		return p
	}
	busy := round()
	require.Equal(t, 2, busy.N, "a page of two campaigns, a hold each")
	require.True(t, busy.More, "the third waits for the next round")
	require.NoError(t, arbiter.In(r.DB).MoveCursors(busy.Cursors))
	r.Catch()
	idle := round()
	require.Zero(t, idle.N, "a full page of idle campaigns: nothing read")
	require.Empty(t, idle.Cursors, "no cursor written")
	require.False(t, idle.More, "and no more")
}
