package testrig_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/testkit/testrig"
)

// The rig assembles one working node, on the real servers and on the
// embedded stand-ins alike: an order reserves, its payment travels the
// outbox, the relay and the applier, and the invariant holds at each
// quiet point.
func TestRigAssemblesOneNode(t *testing.T) {
	for _, embedded := range []bool{false, true} {
		name := map[bool]string{false: "real", true: "embedded"}[embedded]
		t.Run(name, func(t *testing.T) {
			testrig.Embedded = embedded
			defer func() { testrig.Embedded = false }()
			r := testrig.New(t, testrig.MemoryTransport(t))
			ctx := context.Background()
			sku := r.PutSKU("A", 10, 0) // through the catalog: its history opens with its stock
			o, err := r.Orders.Create(ctx, "u", "", testrig.Line(sku, 2))
			require.NoError(t, err)
			r.RequireQty(sku, 10, 2)
			r.CheckInvariant(sku)
			_, err = r.Orders.Pay(ctx, o.ID, "pay-1")
			require.NoError(t, err)
			require.Equal(t, []arbiter.StockMessage{{Token: o.ID, SKU: sku, Op: arbiter.OpDeduct, Qty: 2}}, r.Outbox())
			r.StartPipeline()
			r.WaitApplied()
			r.RequireQty(sku, 8, 0)
			require.Equal(t, arbiter.Sold, r.ReservationState(o.ID, sku))
			require.Equal(t, [2]int64{8, 0}, r.MovementSums(sku))
			r.CheckInvariant(sku)
		})
	}
}
