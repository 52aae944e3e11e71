package order_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/order"
	"github.com/acme/inventory/testkit/testrig"
)

// A seckill through Buy is admitted under the SKU's own per-user limit,
// which the order layer reads (the caller passes none) and keeps a few
// seconds: a change of the limit is seen once the cached one is old, or
// at once on the node that made it (LimitChanged).
func TestBuySeckillReadsTheSKUsLimit(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	sku := r.PutSKU("LIM", 10, 1)
	seckill := func(user string) error {
		_, err := r.Orders.Buy(ctx, order.Buy{Kind: order.Seckill, User: user, Lines: []inventory.Line{{SKU: sku, Qty: 1}}})
		return err
	}
	require.NoError(t, seckill("ann"))
	require.ErrorIs(t, seckill("ann"), inventory.ErrConflict, "a limit of 1")
	r.RequireQty(sku, 10, 1)

	_, err := r.Catalog.Put(ctx, sku, 10, 2)
	require.NoError(t, err)
	require.ErrorIs(t, seckill("ann"), inventory.ErrConflict, "the limit read a moment ago stands")
	r.Clock.Advance(6 * time.Second)
	require.NoError(t, seckill("ann"), "past its few seconds, the new limit is read")
	require.ErrorIs(t, seckill("ann"), inventory.ErrConflict)

	_, err = r.Catalog.Put(ctx, sku, 10, 3)
	require.NoError(t, err)
	r.Orders.LimitChanged(sku)
	require.NoError(t, seckill("ann"), "the node that changed the limit sees it at once")
	r.RequireQty(sku, 10, 3)
	require.EqualValues(t, 3, r.Quota(sku, "ann"))
	r.CheckInvariant(sku)

	_, err = r.Orders.Buy(ctx, order.Buy{Kind: order.Seckill, User: "ann", Lines: []inventory.Line{{SKU: "NO-SUCH-SKU", Qty: 1}}})
	require.ErrorIs(t, err, inventory.ErrUnknownSKU)
}

// A seckill is one unit of one SKU and takes no Idempotency-Key; anything
// else is refused before Redis is asked, and nothing is taken.
func TestBuyRefusesAMalformedSeckill(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	sku := r.PutSKU("MAL", 10, 0)
	other := r.PutSKU("MAL", 10, 0)
	for name, b := range map[string]order.Buy{
		"two units":          {Lines: []inventory.Line{{SKU: sku, Qty: 2}}},
		"two SKUs":           {Lines: []inventory.Line{{SKU: sku, Qty: 1}, {SKU: other, Qty: 1}}},
		"no line":            {},
		"an Idempotency-Key": {Key: "k1", Lines: []inventory.Line{{SKU: sku, Qty: 1}}},
	} {
		b.Kind, b.User = order.Seckill, "ann"
		_, err := r.Orders.Buy(ctx, b)
		require.ErrorIs(t, err, inventory.ErrInvalidArgument, name)
	}
	r.RequireQty(sku, 10, 0)
	r.RequireQty(other, 10, 0)
	require.EqualValues(t, 10, r.RedisAvailable(sku), "nothing admitted")
	require.EqualValues(t, 10, r.RedisAvailable(other))
}
