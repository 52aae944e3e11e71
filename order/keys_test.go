package order_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/migrations"
	"github.com/acme/inventory/testkit/testrig"
)

// A key that a release before idempotency_keys recorded only in its
// order's row still makes a retry a duplicate, before the contract (read
// through orders_idempotency) and after it (the contract copied it). A
// node that serves across the contract reads orders for a key it does not
// find once more, finds the index gone, and never again: a miss costs one
// read of idempotency_keys, and no statement scans orders.
func TestKeysBeforeTheirTableAnswerAcrossTheContract(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t)) // the order in the sale's commit, its key in its row too
	ctx := context.Background()
	raw, err := r.DB.DB()
	require.NoError(t, err)
	for range 2 { // the rig's new database was contracted by migrate: undo it
		_, err := migrations.Down(ctx, raw, migrations.MySQL)
		require.NoError(t, err)
	}
	var mu sync.Mutex
	var hinted []string // statements that read orders through orders_idempotency
	testrig.ObserveStatements(t, r.DB, func(sql string, _ error) {
		if strings.Contains(sql, "orders_idempotency") {
			mu.Lock()
			hinted = append(hinted, sql)
			mu.Unlock()
		}
	})
	reads := func() int { mu.Lock(); defer mu.Unlock(); return len(hinted) }

	sku := r.PutSKU("KEYS", 10, 0)
	old, err := r.Orders.Create(ctx, "u1", "old-key", testrig.Line(sku, 2))
	require.NoError(t, err)
	require.Equal(t, 1, reads(), "a new key, before the contract: looked for in orders too")
	// As an older release left it: the key in the order's row alone.
	require.NoError(t, r.DB.Exec(`DELETE FROM idempotency_keys WHERE order_id = ?`, old.ID).Error)

	again, err := r.Orders.Create(ctx, "u1", "old-key", testrig.Line(sku, 2))
	require.NoError(t, err)
	require.Equal(t, old.ID, again.ID, "before the contract: found through orders_idempotency")
	require.Equal(t, 2, reads())

	n, err := migrations.Contract(ctx, raw, migrations.MySQL)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.EqualValues(t, 1, r.Raw(`SELECT COUNT(*) FROM idempotency_keys WHERE order_id = ?`, old.ID))

	again, err = r.Orders.Create(ctx, "u1", "old-key", testrig.Line(sku, 2))
	require.NoError(t, err)
	require.Equal(t, old.ID, again.ID, "after the contract: found through the key the contract copied")
	require.Equal(t, 2, reads(), "found in idempotency_keys: orders not read")

	first, err := r.Orders.Create(ctx, "u1", "new-key-1", testrig.Line(sku, 1))
	require.NoError(t, err)
	require.Equal(t, 3, reads(), "the first miss after the contract reads orders once, and finds the index gone")
	second, err := r.Orders.Create(ctx, "u1", "new-key-2", testrig.Line(sku, 1))
	require.NoError(t, err)
	require.Equal(t, 3, reads(), "and the node never reads orders for a key again")
	require.NotEqual(t, first.ID, second.ID)
	again, err = r.Orders.Create(ctx, "u1", "new-key-1", testrig.Line(sku, 1))
	require.NoError(t, err)
	require.Equal(t, first.ID, again.ID)
	require.EqualValues(t, 3, r.Raw(`SELECT COUNT(*) FROM orders WHERE user_id = 'u1'`))
	r.RequireQty(sku, 10, 4)
}
