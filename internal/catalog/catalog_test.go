package catalog_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/catalog"
	"github.com/acme/inventory/internal/maintenance"
	"github.com/acme/inventory/mq"
	"github.com/acme/inventory/testkit/testrig"
)

func ptr[T any](v T) *T { return &v }

func TestCatalog(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	cat := r.Catalog

	v, err := cat.Put(ctx, "A", 10, 5)
	require.NoError(t, err)
	require.Equal(t, &catalog.SKUView{SKU: "A", OnHand: 10, Available: 10, RedisAvailable: 10, PerUserLimit: 5, Version: "10.5"}, v)
	o, err := r.Orders.Create(ctx, "u1", "", testrig.Line("A", 4))
	require.NoError(t, err)
	p, err := r.Orders.Create(ctx, "u2", "", testrig.Line("A", 3))
	require.NoError(t, err)
	_, err = r.Orders.Pay(ctx, p.ID, "pay-1") // paid, not applied: still reserved
	require.NoError(t, err)

	v, err = cat.Adjust(ctx, "A", 5, "restock", "PO-1")
	require.NoError(t, err)
	require.Equal(t, &catalog.SKUView{SKU: "A", OnHand: 15, Reserved: 7, Available: 8, RedisAvailable: 8, PerUserLimit: 5, Version: "15.5"}, v)
	_, err = cat.Adjust(ctx, "A", -9, "shrinkage", "")
	require.ErrorIs(t, err, inventory.ErrConflict, "4 held + 3 paid-unapplied stay covered")
	r.RequireQty("A", 15, 7)
	v, err = cat.Adjust(ctx, "A", -8, "shrinkage", "")
	require.NoError(t, err)
	require.Equal(t, &catalog.SKUView{SKU: "A", OnHand: 7, Reserved: 7, Available: 0, RedisAvailable: 0, PerUserLimit: 5, Version: "7.5"}, v)
	_, err = r.Orders.Create(ctx, "u3", "", testrig.Line("A", 1))
	require.ErrorIs(t, err, inventory.ErrInsufficientStock)
	_, err = cat.Put(ctx, "A", 6, 5)
	require.ErrorIs(t, err, inventory.ErrConflict, "on_hand cannot go below reserved")
	_, err = r.Orders.Cancel(ctx, o.ID)
	require.NoError(t, err)
	v, err = cat.Put(ctx, "A", 6, 0)
	require.NoError(t, err)
	require.Equal(t, &catalog.SKUView{SKU: "A", OnHand: 6, Reserved: 3, Available: 3, RedisAvailable: 3, Version: "6.0"}, v)
	got, err := cat.Get(ctx, "A")
	require.NoError(t, err)
	require.Equal(t, v, got)
	r.CheckInvariant("A")

	for _, bad := range []func() error{
		func() error { _, err := cat.Put(ctx, "A", -2, 0); return err },
		func() error { _, err := cat.Put(ctx, "A", arbiter.MaxStock+1, 0); return err },
		func() error { _, err := cat.Put(ctx, "A", 1, -1); return err },
		func() error { _, err := cat.Put(ctx, "A{b}", 1, 0); return err },
		func() error { _, err := cat.Adjust(ctx, "A", 0, "x", ""); return err },
		func() error { _, err := cat.Adjust(ctx, "A", 1, " ", ""); return err },
		func() error { _, err := cat.Adjust(ctx, "A", 1, "x", strings.Repeat("r", 129)); return err },
		func() error { _, err := cat.Adjust(ctx, "A", arbiter.MaxStock, "x", ""); return err }, // 6 + arbiter.MaxStock > arbiter.MaxStock
	} {
		require.ErrorIs(t, bad(), inventory.ErrInvalidArgument)
	}
	r.RequireQty("A", 6, 3)
	_, err = cat.Adjust(ctx, "NOPE", 1, "x", "")
	require.ErrorIs(t, err, inventory.ErrNotFound)
	_, err = cat.Get(ctx, "NOPE")
	require.ErrorIs(t, err, inventory.ErrNotFound)
	v, err = cat.Put(ctx, "U", inventory.Unlimited, 0)
	require.NoError(t, err)
	require.Equal(t, &catalog.SKUView{SKU: "U", OnHand: inventory.Unlimited, Available: inventory.Unlimited, RedisAvailable: inventory.Unlimited, Unlimited: true, Version: "-1.0"}, v)
	_, err = cat.Adjust(ctx, "U", 5, "x", "")
	require.ErrorIs(t, err, inventory.ErrConflict)

	// Reconcile: Redis drifting from the database is reported, and repaired on request.
	reports, err := r.Reconciler().Reconcile(ctx, false)
	require.NoError(t, err)
	require.Empty(t, reports)
	drift(t, r, "A", 2) // Redis gains units the database never had
	reports, err = r.Reconciler().Reconcile(ctx, true)
	require.NoError(t, err)
	require.Equal(t, []maintenance.Report{{SKU: "A", OnHand: 6, Reserved: 3, Live: 3, Available: 3, RedisAvailable: ptr[int64](5),
		Problem: "redis", Repaired: true}}, reports)
	reports, err = r.Reconciler().Reconcile(ctx, false)
	require.NoError(t, err)
	require.Empty(t, reports, "repaired")
	r.CheckInvariant("A")

	// reserved drifting from the live reservations (a hand edit) is repaired
	// from the rows; Redis follows.
	require.NoError(t, r.DB.Exec(`UPDATE skus SET reserved = reserved + 1 WHERE sku = 'A'`).Error)
	reports, err = r.Reconciler().Reconcile(ctx, false)
	require.NoError(t, err)
	require.Equal(t, []maintenance.Report{{SKU: "A", OnHand: 6, Reserved: 4, Live: 3, Available: 2, RedisAvailable: ptr[int64](3),
		Problem: "redis,reserved"}}, reports)
	reports, err = r.Reconciler().Reconcile(ctx, true)
	require.NoError(t, err)
	require.Len(t, reports, 1)
	require.True(t, reports[0].Repaired)
	r.RequireQty("A", 6, 3)
	reports, err = r.Reconciler().Reconcile(ctx, false)
	require.NoError(t, err)
	require.Empty(t, reports)
	r.CheckInvariant("A")

	// An anomaly is reported until an operator resolves it; repair does not touch it.
	require.NoError(t, r.Applier.Handle(ctx, []mq.Message{{Key: "A", Body: []byte(`{"token":"x","sku":"A","op":"DEDUCT","qty":1}`)}}))
	require.EqualValues(t, 1, r.Applier.Anomalies.Load())
	reports, err = r.Reconciler().Reconcile(ctx, true)
	require.NoError(t, err)
	require.Equal(t, []maintenance.Report{{SKU: "A", OnHand: 6, Reserved: 3, Live: 3, Available: 3, RedisAvailable: ptr[int64](3),
		Anomalies: 1, Problem: "anomalies"}}, reports)
	require.NoError(t, r.DB.Exec(`UPDATE stock_anomalies SET resolved_at = ?`, time.Now().UTC()).Error)
	reports, err = r.Reconciler().Reconcile(ctx, false)
	require.NoError(t, err)
	require.Empty(t, reports)

	// The periodic realign fixes only the SKUs that differ.
	drift(t, r, "A", -1)
	done, err := r.Reconciler().Realign(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"A"}, done)
	done, err = r.Reconciler().Realign(ctx)
	require.NoError(t, err)
	require.Empty(t, done)
	r.CheckInvariant("A")
	r.CheckInvariant("U")
}

// drift moves sku's Redis value by n without the database: a change no
// initialisation saw, as a Redis restored from an old snapshot would have.
func drift(t *testing.T, r *testrig.Rig, sku string, n int64) {
	t.Helper()
	ctx := context.Background()
	before := r.RedisAvailable(sku)
	lv, err := r.Stock.Levels(ctx, sku)
	require.NoError(t, err)
	require.NoError(t, r.Stock.Apply(ctx, inventory.Change{SKU: sku, Delta: n, Seq: lv.Seq + 1_000_000}))
	require.Equal(t, before+n, r.RedisAvailable(sku))
}
