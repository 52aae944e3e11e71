package main

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/campaign"
	"github.com/acme/inventory/internal/tokens"
	"github.com/acme/inventory/testkit/testrig"
)

// The campaign churn, small, on the real MariaDB and Redis: campaigns
// created, sold and ended, half by the end route and half by their
// window's close and the timeout sweep, leave the Redis keys of their SKUs
// as they were before them (the SKUs' own: their stock and buyers hashes),
// and the soak's output says so.
func TestCampaignChurnLeavesNoKeys(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	// The churn waits for windows to close by the wall clock: the campaigns
	// and the sweep read it, not the rig's hand-moved clock.
	node := churnNode{Catalog: r.Catalog, Campaigns: campaign.New(r.DB, r.Stock, r.Orders, campaign.Config{}),
		Orders: r.Orders, Tokens: tokens.New(r.DB, r.Stock, r.Commits, tokens.Config{TTL: testrig.TTL}), Stock: r.Stock, RDB: r.RDB}
	run := campaignChurn(context.Background(), node, "t", 20, 4)

	left, gone := run.leftBehind()
	require.Empty(t, left, "keys the ended campaigns left behind")
	require.Empty(t, gone)
	require.Len(t, run.before, 2*(4+10), "each SKU's stock and buyers hashes: 4 callers' SKUs, 10 SKUs of a window each")
	require.Equal(t, 40, run.sold)
	require.Equal(t, 20, run.refusedLate)
	table := run.table()
	require.True(t, strings.Contains(table, "| 20 | 10 / 10 | 40 | 28 | 28 | 0 | 0 |"), table)
	c := churnCheck(run)
	require.Equal(t, met, c.state, c.measured)
	require.Equal(t, "20 campaigns: 28 keys before, 28 after (0 left behind, 0 gone)", c.measured)
}
