package order

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/maintenance"
	"github.com/acme/inventory/internal/testenv"
	"github.com/acme/inventory/mq"
)

// sums are a SKU's movement deltas summed: they must equal on_hand and
// reserved whatever was pruned.
func (r *rig) sums(sku string) [2]int64 {
	r.t.Helper()
	var s struct{ OnHand, Reserved int64 }
	require.NoError(r.t, r.db.Raw(`SELECT COALESCE(SUM(on_hand_delta), 0) AS on_hand, COALESCE(SUM(reserved_delta), 0) AS reserved
		FROM stock_movements WHERE sku = ?`, sku).Scan(&s).Error)
	return [2]int64{s.OnHand, s.Reserved}
}

func deliver(t *testing.T, r *rig, msgs ...arbiter.StockMessage) {
	t.Helper()
	var out []mq.Message
	for _, m := range msgs {
		body, err := json.Marshal(m)
		require.NoError(t, err)
		out = append(out, mq.Message{Key: m.SKU, Body: body})
	}
	require.NoError(t, r.applier.Handle(context.Background(), out))
}

// A year of history pruned: applied outbox rows and ledger rows older than
// the horizon go, in bounded batches; movements fold into one opening
// balance per SKU, so the deltas still sum to the quantities; unsent or
// unapplied rows stay; and a duplicate message arriving after its ledger row
// was pruned changes nothing (the reservation's state says it was applied).
func TestRetentionPrunesFinishedHistory(t *testing.T) {
	r := newRig(t, memoryTransport(t))
	ctx := context.Background()
	sku := testenv.Unique("RET")
	cat := NewCatalog(r.db, r.st, nil)
	_, err := cat.Put(ctx, sku, 50, 0)
	require.NoError(t, err)
	line := []inventory.Line{{SKU: sku, Qty: 2}}

	stop := r.startPipeline()
	var paid []*Order
	for i := 0; i < 7; i++ {
		o, err := r.svc.Create(ctx, "u", "", line)
		require.NoError(t, err)
		_, err = r.svc.Pay(ctx, o.ID, "pay-"+o.ID)
		require.NoError(t, err)
		paid = append(paid, o)
	}
	cancelled, err := r.svc.Create(ctx, "u", "", line)
	require.NoError(t, err)
	_, err = r.svc.Cancel(ctx, cancelled.ID)
	require.NoError(t, err)
	_, err = r.svc.Refund(ctx, paid[0].ID)
	require.NoError(t, err)
	_, err = cat.Adjust(ctx, sku, 5, "restock", "po-1")
	require.NoError(t, err)
	r.waitApplied()
	stop()
	r.requireQty(sku, 55-12, 0) // 7 sold, one refunded: 12 units gone
	held, err := r.svc.Create(ctx, "u", "", line)
	require.NoError(t, err)
	_, err = r.svc.Pay(ctx, held.ID, "pay-held") // paid, never relayed: its outbox row stays unsent
	require.NoError(t, err)
	r.requireQty(sku, 43, 2)
	before := r.sums(sku)
	require.Equal(t, [2]int64{43, 2}, before)
	movements := r.count(`SELECT COUNT(*) FROM stock_movements WHERE sku = ?`, sku)
	require.Equal(t, int64(20), movements, "a set, 9 reserves, a release, 7 sales, a refund, a restock")
	outbox := r.count(`SELECT COUNT(*) FROM stock_outbox WHERE sku = ?`, sku)
	require.Equal(t, int64(9), outbox, "8 deductions and a restore")
	ledger := r.count(`SELECT COUNT(*) FROM stock_ledger WHERE sku = ?`, sku)
	require.Equal(t, int64(8), ledger)

	// Within the horizon nothing goes.
	ret := maintenance.NewRetention(r.db, r.st.Locker(), maintenance.RetentionConfig{Horizon: time.Hour, Batch: 3, Now: time.Now})
	p, err := ret.PruneOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(0), r.count(`SELECT COUNT(*) FROM stock_movements WHERE sku = ? AND reason = ?`, sku, maintenance.OpeningReason))
	require.Equal(t, outbox, r.count(`SELECT COUNT(*) FROM stock_outbox WHERE sku = ?`, sku), "%+v", p)

	// A year later: everything finished goes, in batches of 3.
	ret = maintenance.NewRetention(r.db, r.st.Locker(), maintenance.RetentionConfig{Horizon: 30 * 24 * time.Hour, Batch: 3,
		Now: func() time.Time { return time.Now().Add(365 * 24 * time.Hour) }})
	_, err = ret.PruneOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), r.count(`SELECT COUNT(*) FROM stock_outbox WHERE sku = ?`, sku), "the unsent row stays")
	require.Equal(t, int64(1), r.count(`SELECT COUNT(*) FROM stock_outbox WHERE sku = ? AND sent_at IS NULL`, sku))
	require.Equal(t, int64(0), r.count(`SELECT COUNT(*) FROM stock_ledger WHERE sku = ?`, sku))
	require.Equal(t, int64(1), r.count(`SELECT COUNT(*) FROM stock_movements WHERE sku = ?`, sku), "one opening balance")
	require.Equal(t, before, r.sums(sku), "the deltas still sum to on_hand and reserved")
	page, err := cat.Movements(ctx, sku, 0, 10)
	require.NoError(t, err)
	require.Len(t, page.Items, 1)
	require.Equal(t, arbiter.MoveSet, page.Items[0].Kind)
	require.Equal(t, maintenance.OpeningReason, page.Items[0].Reason)

	// History goes on after the opening balance, and a second run folds the
	// old opening balance with what aged since.
	_, err = r.svc.Cancel(ctx, held.ID)
	require.ErrorIs(t, err, inventory.ErrConflict, "a paid order is not cancelled")
	o, err := r.svc.Create(ctx, "u", "", line)
	require.NoError(t, err)
	_, err = r.svc.Cancel(ctx, o.ID)
	require.NoError(t, err)
	require.Equal(t, before, r.sums(sku))
	_, err = ret.PruneOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), r.count(`SELECT COUNT(*) FROM stock_movements WHERE sku = ?`, sku))
	require.Equal(t, before, r.sums(sku))

	// Late duplicates of pruned operations: the reservations' states say
	// they were applied; nothing changes and nothing is an anomaly.
	anomalies := r.count(`SELECT COUNT(*) FROM stock_anomalies WHERE sku = ?`, sku)
	dup := r.applier.Duplicate.Load()
	deliver(t, r, arbiter.StockMessage{Token: paid[1].ReservationToken, SKU: sku, Op: arbiter.OpDeduct, Qty: 2},
		arbiter.StockMessage{Token: paid[0].ReservationToken, SKU: sku, Op: arbiter.OpRestore, Qty: 2})
	r.requireQty(sku, 43, 2)
	require.Equal(t, anomalies, r.count(`SELECT COUNT(*) FROM stock_anomalies WHERE sku = ?`, sku))
	require.Equal(t, dup+2, r.applier.Duplicate.Load())
	r.checkInvariant(sku)
}

// Two runs overlapping (a lock that expired under a slow run) never fold a
// movement twice: the sums hold whatever interleaving happens.
func TestRetentionConcurrentRuns(t *testing.T) {
	r := newRig(t, memoryTransport(t))
	ctx := context.Background()
	sku := testenv.Unique("RET")
	_, err := NewCatalog(r.db, r.st, nil).Put(ctx, sku, 1000, 0)
	require.NoError(t, err)
	for i := 0; i < 60; i++ {
		o, err := r.svc.Create(ctx, "u", "", []inventory.Line{{SKU: sku, Qty: 1}})
		require.NoError(t, err)
		if i%3 != 0 {
			_, err = r.svc.Cancel(ctx, o.ID)
			require.NoError(t, err)
		}
	}
	before := r.sums(sku)
	require.Equal(t, [2]int64{1000, 20}, before)
	later := func() time.Time { return time.Now().Add(365 * 24 * time.Hour) }
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func(batch int) {
			defer wg.Done()
			ret := maintenance.NewRetention(r.db, r.st.Locker(), maintenance.RetentionConfig{Batch: batch, Now: later})
			_, _ = ret.PruneOnce(ctx) // a run that lost a race rolls its batch back
		}(5 + i)
	}
	wg.Wait()
	_, err = maintenance.NewRetention(r.db, r.st.Locker(), maintenance.RetentionConfig{Batch: 7, Now: later}).PruneOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, before, r.sums(sku))
	require.Equal(t, int64(1), r.count(`SELECT COUNT(*) FROM stock_movements WHERE sku = ?`, sku))
	r.requireQty(sku, 1000, 20)
}
