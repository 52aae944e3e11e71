package counts_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/counts"
	"github.com/acme/inventory/internal/maintenance"
)

// Retention keeps what a count's rebase reads for as long as a count may
// reach back: an order line's shipping record goes once it was sold and
// shipped (or given back) before the horizon; one still on the shelf
// stays however old. A count older than the horizon is refused.
func TestRetentionKeepsWhatRebasingNeeds(t *testing.T) {
	f := newFixture(t, counts.Config{})
	sku := f.PutSKU("RET", 100, 0)
	shipped := f.pay(f.order(sku, 2))
	f.settle(shipped)
	f.ship(shipped)
	onShelf := f.pay(f.order(sku, 3))
	f.settle(onShelf)
	refunded := f.pay(f.order(sku, 1))
	f.settle(refunded)
	_, err := f.Orders.Refund(f.ctx, refunded.ID)
	require.NoError(t, err)
	f.Deliver(arbiter.StockMessage{Token: refunded.ReservationToken, SKU: sku, Op: arbiter.OpRestore, Qty: 1})
	require.EqualValues(t, 3, f.Count(`SELECT COUNT(*) FROM stock_shipping WHERE sku = ?`, sku))

	// Within the horizon nothing goes.
	ret := maintenance.NewRetention(f.DB, f.Stock.Locker(), maintenance.RetentionConfig{Horizon: time.Hour, Now: time.Now})
	p, err := ret.PruneOnce(f.ctx)
	require.NoError(t, err)
	require.Zero(t, p.Shipping)

	// A year on: the shipped and the refunded lines go, the one on the
	// shelf stays, and a count now still finds its 3 units unshipped.
	ret = maintenance.NewRetention(f.DB, f.Stock.Locker(), maintenance.RetentionConfig{Horizon: 30 * 24 * time.Hour, Batch: 1,
		Now: func() time.Time { return time.Now().Add(365 * 24 * time.Hour) }})
	p, err = ret.PruneOnce(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, p.Shipping)
	require.EqualValues(t, 1, f.Count(`SELECT COUNT(*) FROM stock_shipping WHERE sku = ? AND token = ?`, sku, onShelf.ReservationToken))
	res, err := f.counts.Apply(f.ctx, counts.Request{CountID: "after-retention", CountedAt: instant(),
		Lines: []counts.Line{{SKU: sku, Counted: 100 - 2 - 1}}})
	require.NoError(t, err)
	require.EqualValues(t, 3, res.Lines[0].Unshipped)
	require.Equal(t, arbiter.CountCorrected, res.Lines[0].Outcome, "97 on the shelf: 95 in on_hand and 3 sold, not shipped, less one missing")
	require.EqualValues(t, -1, res.Lines[0].Applied)
	f.RequireQty(sku, 94, 0)

	// How far back a count may reach: the retention less an hour.
	require.Equal(t, 719*time.Hour, arbiter.CountHorizon(720*time.Hour))
	require.Equal(t, 57*time.Minute+30*time.Second, arbiter.CountHorizon(time.Hour))
	old := counts.New(f.DB, f.Stock, counts.Config{Retention: 720 * time.Hour})
	_, err = old.Apply(f.ctx, counts.Request{CountID: "too-old", CountedAt: time.Now().Add(-720 * time.Hour),
		Lines: []counts.Line{{SKU: sku, Counted: 1}}})
	require.ErrorContains(t, err, "counted_at may be at most 719h0m0s back (INVENTORY_RETENTION less an hour)")
}
