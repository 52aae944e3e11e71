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
