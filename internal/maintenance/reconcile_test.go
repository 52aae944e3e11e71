package maintenance_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/testkit/testrig"
)

// Reconcile compares each buyer's count in Redis (the per-user limit's
// pre-filter) with buyer_quotas, reports the buyers that differ, and its
// repair restores them from the database with the level: afterwards each
// buyer buys exactly what the database allows.
func TestReconcileReportsAndRepairsBuyersCounts(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	sku := r.PutSKU("RQ", 12, 3)
	buyersKey := "inv:{" + sku + "}:buyers"
	buy := func(user string, n int) int {
		t.Helper()
		won := 0
		for range n {
			if _, err := r.Orders.Seckill(ctx, user, sku, 3); err == nil {
				won++
			}
		}
		return won
	}
	require.Equal(t, 2, buy("uma", 2))
	require.Equal(t, 1, buy("vic", 1))
	_, err := r.Orders.Create(ctx, "wes", "", testrig.Line(sku, 1)) // counted by the database alone
	require.NoError(t, err)
	reports, err := r.Reconciler().Reconcile(ctx, false)
	require.NoError(t, err)
	require.Empty(t, reports, "Redis counts what the database counts")

	// The hash is overwritten: uma above the database, vic gone, a buyer
	// the database never counted.
	require.NoError(t, r.RDB.HSet(ctx, buyersKey, "uma", 3, "xen", 1).Err())
	require.NoError(t, r.RDB.HDel(ctx, buyersKey, "vic").Err())
	want := fmt.Sprintf(`[{"sku":%q,"on_hand":12,"reserved":4,"live_reservations":4,"available":8,"redis_available":8,`+
		`"buyers_differ":3,"anomalies":0,"problem":"buyers","repaired":%%t}]`, sku)
	asJSON := func(v any) string {
		b, err := json.Marshal(v)
		require.NoError(t, err)
		return string(b)
	}
	reports, err = r.Reconciler().Reconcile(ctx, false)
	require.NoError(t, err)
	require.JSONEq(t, fmt.Sprintf(want, false), asJSON(reports))
	// The periodic realign compares each buyer too (a Redis failed over to
	// a replica that missed some counts keeps the right epoch marks: make
	// faults' redis-failover found it reported forever).
	skus, err := r.Reconciler().Realign(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{sku}, skus)
	reports, err = r.Reconciler().Reconcile(ctx, false)
	require.NoError(t, err)
	require.Empty(t, reports, "realigned")
	// Overwritten again: reconcile's repair does the same.
	require.NoError(t, r.RDB.HSet(ctx, buyersKey, "uma", 3, "xen", 1).Err())
	require.NoError(t, r.RDB.HDel(ctx, buyersKey, "vic").Err())
	reports, err = r.Reconciler().Reconcile(ctx, true)
	require.NoError(t, err)
	require.JSONEq(t, fmt.Sprintf(want, true), asJSON(reports))
	reports, err = r.Reconciler().Reconcile(ctx, false)
	require.NoError(t, err)
	require.Empty(t, reports, "repaired")

	require.Equal(t, 1, buy("uma", 3), "uma holds 2 of 3")
	require.Equal(t, 2, buy("vic", 3), "vic holds 1 of 3")
	require.Equal(t, 2, buy("wes", 3), "wes holds 1 of 3")
	require.Equal(t, 3, buy("xen", 4), "xen holds none")
	for u, q := range map[string]int64{"uma": 3, "vic": 3, "wes": 3, "xen": 3} {
		require.Equal(t, q, r.Quota(sku, u), u)
	}
	r.RequireQty(sku, 12, 12)
	require.EqualValues(t, 0, r.RedisAvailable(sku))
	reports, err = r.Reconciler().Reconcile(ctx, false)
	require.NoError(t, err)
	require.Empty(t, reports)

	// A buyers hash from another initialisation than the stock's (Redis
	// came back inconsistent): reported whole, and the periodic realign
	// finds it by its epoch.
	require.NoError(t, r.RDB.HSet(ctx, buyersKey, "{e}", 12345).Err())
	reports, err = r.Reconciler().Reconcile(ctx, false)
	require.NoError(t, err)
	require.Len(t, reports, 1)
	require.Equal(t, "buyers", reports[0].Problem)
	require.EqualValues(t, 4, reports[0].BuyersDiffer)
	skus, err = r.Reconciler().Realign(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{sku}, skus)
	reports, err = r.Reconciler().Reconcile(ctx, false)
	require.NoError(t, err)
	require.Empty(t, reports)
	r.CheckInvariant(sku)
}

// TestEmbeddedContract runs the reconcile, realign and holds' retention
// tests again on the embedded default's stand-ins (SQLite, miniredis).
func TestEmbeddedContract(t *testing.T) {
	testrig.RunEmbedded(t,
		TestRealignerRepairsDrift,
		TestRealignFindsAnOlderEpoch,
		TestReconcileReportsAndRepairsBuyersCounts,
		TestRetentionPrunesProjectedHolds,
	)
}
