package catalog_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/maintenance"
	"github.com/acme/inventory/testkit/testrig"
)

// An adjust carrying a reference already applied to the SKU is answered
// without applying again (an operator's retry after a time-out); another
// delta under the same reference is a conflict. The record of applied
// references is never pruned.
func TestAdjustByReferenceOnce(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	cat := r.Catalog
	sku := r.PutSKU("PO", 110, 0)
	other := r.PutSKU("PO", 5, 0)

	v, err := cat.Adjust(ctx, sku, 10, "restock", "po-99")
	require.NoError(t, err)
	require.EqualValues(t, 120, v.OnHand)
	v, err = cat.Adjust(ctx, sku, 10, "restock", "po-99")
	require.NoError(t, err, "a retry is answered")
	require.EqualValues(t, 120, v.OnHand, "and applied once")
	_, err = cat.Adjust(ctx, sku, 7, "restock", "po-99")
	require.ErrorIs(t, err, inventory.ErrConflict, "another delta under the same reference")
	_, err = cat.Adjust(ctx, sku, 10, "restock", "PO-99")
	require.NoError(t, err, "references are exact: another reference")
	_, err = cat.Adjust(ctx, other, 10, "restock", "po-99")
	require.NoError(t, err, "a reference is per SKU: a purchase order restocks many")
	r.RequireQty(sku, 130, 0)
	r.RequireQty(other, 15, 0)

	_, err = maintenance.NewRetention(r.DB, r.Stock.Locker(), maintenance.RetentionConfig{
		Now: func() time.Time { return time.Now().Add(365 * 24 * time.Hour) }}).PruneOnce(ctx)
	require.NoError(t, err)
	_, err = cat.Adjust(ctx, sku, 10, "restock", "po-99")
	require.NoError(t, err)
	_, err = cat.Adjust(ctx, sku, -3, "damaged", "po-99")
	require.ErrorIs(t, err, inventory.ErrConflict)
	r.RequireQty(sku, 130, 0)

	// Without a reference every adjust applies.
	_, err = cat.Adjust(ctx, other, 1, "found", "")
	require.NoError(t, err)
	_, err = cat.Adjust(ctx, other, 1, "found", "")
	require.NoError(t, err)
	r.RequireQty(other, 17, 0)
	require.Equal(t, [2]int64{130, 0}, r.MovementSums(sku), "one RESTOCK movement per applied reference")
	r.CheckInvariant(sku)
}

// Operators writing one SKU under the version they read (If-Match): of many
// racing under one version exactly one wins, the others fail their
// precondition and change nothing; reservations never move the version.
func TestSKUWritesUnderAVersionOneWinner(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	cat := r.Catalog
	sku := r.PutSKU("VER", 100, 0)
	v, err := cat.Get(ctx, sku)
	require.NoError(t, err)
	require.Equal(t, "100.0", v.Version)
	_, err = r.Orders.Create(ctx, "u", "", testrig.Line(sku, 3))
	require.NoError(t, err)
	v2, err := cat.Get(ctx, sku)
	require.NoError(t, err)
	require.Equal(t, v.Version, v2.Version, "a reservation does not move the version")

	var wins, lost atomic.Int64
	testrig.Race(16, func(i int) {
		var err error
		if i%2 == 0 {
			_, err = cat.Put(ctx, sku, int64(200+i), 0, v.Version)
		} else {
			_, err = cat.Adjust(ctx, sku, int64(i), "restock", "", v.Version)
		}
		switch {
		case err == nil:
			wins.Add(1)
		case errors.Is(err, inventory.ErrPrecondition):
			lost.Add(1)
		default:
			t.Errorf("write %d: %v", i, err)
		}
	})
	require.EqualValues(t, 1, wins.Load(), "one write under the version")
	require.EqualValues(t, 15, lost.Load())
	moves := r.Count(`SELECT COUNT(*) FROM stock_movements WHERE sku = ? AND kind IN ('SET', 'RESTOCK')`, sku)
	require.EqualValues(t, 2, moves, "the creation and the one winning write")
	_, err = cat.Put(ctx, sku, 1, 0, arbiter.AnyVersion)
	require.ErrorIs(t, err, inventory.ErrConflict, "a version check does not lift the reserved floor")
	_, err = cat.Put(ctx, "NO-SUCH-"+sku, 1, 0, arbiter.AnyVersion)
	require.ErrorIs(t, err, inventory.ErrPrecondition)
	require.EqualValues(t, 0, r.Count(`SELECT COUNT(*) FROM skus WHERE sku = ?`, "NO-SUCH-"+sku))
	r.CheckInvariant(sku)
}

// The low-stock threshold is one of the settings a version names: a put
// that changes only the threshold moves the version, so a write under the
// version read before it fails its precondition; a SKU without a
// threshold keeps the version it had before thresholds existed.
func TestThresholdMovesTheVersion(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	cat := r.Catalog
	sku := r.PutSKU("THR", 100, 0)
	before, err := cat.Get(ctx, sku)
	require.NoError(t, err)
	require.Equal(t, "100.0", before.Version)

	after, err := cat.PutSettings(ctx, sku, arbiter.Settings{OnHand: 100, LowStockThreshold: 5}, before.Version)
	require.NoError(t, err)
	require.Equal(t, "100.0.5", after.Version)
	_, err = cat.PutSettings(ctx, sku, arbiter.Settings{OnHand: 100, LowStockThreshold: 9}, before.Version)
	require.ErrorIs(t, err, inventory.ErrPrecondition, "a write under the version before the threshold changed")
	_, err = cat.Adjust(ctx, sku, 1, "restock", "", before.Version)
	require.ErrorIs(t, err, inventory.ErrPrecondition)
	got, err := cat.Get(ctx, sku)
	require.NoError(t, err)
	require.Equal(t, int64(5), got.LowStockThreshold)
	require.Equal(t, int64(100), got.OnHand)

	back, err := cat.PutSettings(ctx, sku, arbiter.Settings{OnHand: 100}, after.Version)
	require.NoError(t, err)
	require.Equal(t, "100.0", back.Version)
}
