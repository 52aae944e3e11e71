package order

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/stock"
)

func TestCatalog(t *testing.T) {
	r := newRig(t, memoryTransport(t))
	ctx := context.Background()
	cat := NewCatalog(r.db, r.st, nil)

	v, err := cat.Put(ctx, "A", 10, 2)
	require.NoError(t, err)
	require.Equal(t, &SKUView{SKU: "A", DBStock: 10, Available: 10, PerUserLimit: 2}, v)
	o, err := r.svc.Create(ctx, "u1", "", line("A", 4))
	require.NoError(t, err)
	p, err := r.svc.Create(ctx, "u2", "", line("A", 3))
	require.NoError(t, err)
	_, err = r.svc.Pay(ctx, p.ID, "pay-1")
	require.NoError(t, err)

	v, err = cat.Adjust(ctx, "A", 5, "restock")
	require.NoError(t, err)
	require.Equal(t, &SKUView{SKU: "A", DBStock: 15, Available: 8, Reserved: 4, PerUserLimit: 2}, v)
	_, err = cat.Adjust(ctx, "A", -9, "shrinkage")
	require.ErrorIs(t, err, ErrConflict, "4 held + 3 paid-unapplied stay covered")
	v, err = cat.Adjust(ctx, "A", -8, "shrinkage")
	require.NoError(t, err)
	require.EqualValues(t, 0, v.Available)
	_, err = cat.Put(ctx, "A", 6, 2)
	require.ErrorIs(t, err, ErrConflict)
	_, err = r.svc.Cancel(ctx, o.ID)
	require.NoError(t, err)
	v, err = cat.Put(ctx, "A", 6, 0)
	require.NoError(t, err)
	require.Equal(t, &SKUView{SKU: "A", DBStock: 6, Available: 3}, v)
	r.checkInvariant("A")

	for _, bad := range []func() error{
		func() error { _, err := cat.Put(ctx, "A", -2, 0); return err },
		func() error { _, err := cat.Put(ctx, "A", MaxStock+1, 0); return err },
		func() error { _, err := cat.Put(ctx, "A", 1, -1); return err },
		func() error { _, err := cat.Put(ctx, "A{b}", 1, 0); return err },
		func() error { _, err := cat.Adjust(ctx, "A", 0, "x"); return err },
		func() error { _, err := cat.Adjust(ctx, "A", 1, " "); return err },
	} {
		require.ErrorIs(t, bad(), stock.ErrInvalidArgument)
	}
	_, err = cat.Adjust(ctx, "NOPE", 1, "x")
	require.ErrorIs(t, err, stock.ErrUnknownSKU)
	_, err = cat.Get(ctx, "NOPE")
	require.ErrorIs(t, err, ErrNotFound)
	_, err = cat.Put(ctx, "U", stock.Unlimited, 0)
	require.NoError(t, err)
	_, err = cat.Adjust(ctx, "U", 5, "x")
	require.ErrorIs(t, err, ErrConflict)

	// Reconcile: drift in Redis is reported, and repaired on request.
	reports, err := cat.Reconcile(ctx, false)
	require.NoError(t, err)
	require.Empty(t, reports)
	_, err = r.st.Adjust(ctx, "A", 2) // Redis gains units the database never had
	require.NoError(t, err)
	reports, err = cat.Reconcile(ctx, true)
	require.NoError(t, err)
	require.Equal(t, []Report{{SKU: "A", DBStock: 6, Available: 5, Held: 0, Pending: 3, Diff: -2, Repaired: true}}, reports)
	reports, err = cat.Reconcile(ctx, false)
	require.NoError(t, err)
	require.Empty(t, reports, "repaired")
	r.checkInvariant("A")
}
