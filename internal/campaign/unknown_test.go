package campaign_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/campaign"
	"github.com/acme/inventory/internal/groupcommit"
	"github.com/acme/inventory/order"
	"github.com/acme/inventory/testkit/testrig"
)

// A campaign sale whose commit's answer was lost while the database
// recorded it: its unit is not given back to the pool in Redis, which is
// realigned at once (a campaign sells out before the periodic realign
// comes), so Redis's pool is the database's, never more.
func TestCampaignSaleOfUnknownOutcomeKeepsItsAdmission(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	u := r.UnansweredCommits()
	orders := order.NewService(r.DB, r.Stock, order.Config{TTL: testrig.TTL, Now: r.Clock.Now, Writer: u.Writer})
	sales := campaign.New(r.DB, r.Stock, orders, campaign.Config{Now: r.Clock.Now})
	id, sku := put(t, r, 50, 20, 0, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	ctx := context.Background()
	_, err := sales.Buy(ctx, id, "u1", "") // the first sale, which announces the opening
	require.NoError(t, err)
	require.EqualValues(t, 19, poolInRedis(t, r, id, sku))
	realigns := r.Stock.Stats().Realigns.Load()

	short, cancel := u.AnswerLost(ctx)
	_, err = sales.Buy(short, id, "u2", "")
	cancel()
	require.ErrorIs(t, err, groupcommit.ErrUnknownOutcome)
	require.NoError(t, u.Heal())
	require.EqualValues(t, 2, r.Count(`SELECT COUNT(*) FROM orders`), "the database recorded the sale")
	require.EqualValues(t, 18, poolInRedis(t, r, id, sku), "Redis's pool is the database's, not the unit given back")
	require.Eventually(t, func() bool { return r.Stock.Stats().Realigns.Load() > realigns },
		10*time.Second, 5*time.Millisecond, "the pool was realigned")
	r.RequireQty(sku, 50, 20)
	r.CheckInvariant(sku)
}
