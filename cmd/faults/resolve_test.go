package main

// An unanswered create with an Idempotency-Key is resolved by its key:
// the lean sale's projection leaves orders.idempotency_key empty (the key
// is in idempotency_keys, written by both write paths), so a lookup of
// orders alone took an order the database holds for one it never took,
// and its holds vanished from the history the checker judges (a false
// "NO" of redis-flushall run lean).

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/testkit/testrig"
)

func TestResolveFindsALeanKeyedOrder(t *testing.T) {
	for _, lean := range []bool{false, true} {
		name := "default"
		if lean {
			name = "lean"
		}
		t.Run(name, func(t *testing.T) {
			was := testrig.Lean
			testrig.Lean = lean
			defer func() { testrig.Lean = was }()
			r := testrig.New(t, testrig.MemoryTransport(t))
			ctx := context.Background()
			base := time.Now()
			r.AddSKU("RL", 10)
			lines := []inventory.Line{{SKU: "RL", Qty: 3}}
			o, err := r.Orders.Create(ctx, "u1", "k1", lines)
			require.NoError(t, err)
			if lean {
				r.Catch() // as the run's settle waits for the projector
			}
			// The client's view: the create was sent, its answer never came.
			lost := histOp{Kind: opCreate, Out: outUnknown, Call: 0, Ret: maxTime, User: "u1", Key: "k1",
				Lines: []line{{"RL", 3}}}
			sqlDB, err := r.DB.DB()
			require.NoError(t, err)
			kept, never, err := resolveUnknowns(ctx, sqlDB, []histOp{lost}, base)
			require.NoError(t, err)
			require.Empty(t, never, "the database took the order, yet resolve says it never did")
			require.Len(t, kept, 1)
			require.Equal(t, outOK, kept[0].Out)
			require.Equal(t, o.ID, kept[0].Order)
		})
	}
}

// The attempts of one Idempotency-Key are one operation once one was
// answered (foldRetries): it took effect after the first attempt was
// sent, and, as the database tells (resolveUnknowns reads when it made
// the order), not before the order was made, less the slack. A refused
// attempt took nothing and opens nothing.
func TestAKeysAttemptsAreOneOperationFromWhenTheHoldWasMade(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	base := time.Now().Add(-time.Second) // the history began a second ago
	r.AddSKU("RK", 10)
	o, err := r.Orders.Create(ctx, "u1", "k1", []inventory.Line{{SKU: "RK", Qty: 1}})
	require.NoError(t, err)
	var created time.Time
	require.NoError(t, r.DB.Raw(`SELECT created_at FROM orders WHERE id = ?`, o.ID).Scan(&created).Error)
	made := created.Sub(base) // about a second into the history

	refused := histOp{Kind: opCreate, Out: outRefused, Call: 100 * time.Millisecond, Ret: 200 * time.Millisecond, User: "u1", Key: "k1", Lines: []line{{"RK", 1}}}
	early := histOp{Kind: opCreate, Out: outUnknown, Call: 300 * time.Millisecond, Ret: maxTime, User: "u1", Key: "k1", Lines: []line{{"RK", 1}}}
	late := histOp{Kind: opCreate, Out: outUnknown, Call: made, Ret: maxTime, User: "u1", Key: "k1", Lines: []line{{"RK", 1}}}
	answered := histOp{Kind: opCreate, Out: outOK, Call: made + 2*time.Second, Ret: made + 3*time.Second, User: "u1", Key: "k1",
		Order: o.ID, Lines: []line{{"RK", 1}}}
	sqlDB, err := r.DB.DB()
	require.NoError(t, err)
	kept, never, err := resolveUnknowns(ctx, sqlDB, []histOp{refused, early, late, answered}, base)
	require.NoError(t, err)
	require.Empty(t, never)
	require.Len(t, kept, 4)
	require.Equal(t, made, kept[3].Made)
	want := answered
	want.Call, want.Made = made-expirySlack, made
	require.Equal(t, []histOp{refused, want}, foldRetries(kept), "the unanswered attempts folded, opened back to the hold's making, not to the first attempt")

	// Without the database's word, back to the first attempt that may have made it.
	want.Call, want.Made = early.Call, 0
	require.Equal(t, []histOp{refused, want}, foldRetries([]histOp{refused, early, late, answered}))
}
