package stocksync_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/stocksync"
	"github.com/acme/inventory/testkit/testrig"
	"github.com/stretchr/testify/require"
)

// The process dies after the payment committed and before anything was sent:
// the outbox row waits, and the next relay sends it; it is applied once.
func TestCrashBetweenCommitAndSend(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	r.AddSKU("A", 10)
	o, err := r.Orders.Create(ctx, "u1", "", testrig.Line("A", 3))
	require.NoError(t, err)
	_, err = r.Orders.Pay(ctx, o.ID, "pay-1") // no relay runs: "crashed"
	require.NoError(t, err)
	r.RequireQty("A", 10, 3) // paid-unapplied stays reserved
	require.Equal(t, arbiter.Committed, r.ReservationState(o.ID, "A"))
	r.CheckInvariant("A")

	r.StartPipeline() // the restarted node
	r.WaitApplied()
	r.RequireQty("A", 7, 0)
	require.Equal(t, arbiter.Sold, r.ReservationState(o.ID, "A"))
	require.EqualValues(t, 1, r.Count(`SELECT COUNT(*) FROM stock_ledger`))
	r.CheckInvariant("A")
}

// The relay dies after sending and before marking the rows sent: the next
// relay sends them again, and the ledger absorbs the duplicates.
func TestCrashBetweenSendAndMark(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	r.AddSKU("A", 20)
	for i := 0; i < 4; i++ {
		o, err := r.Orders.Create(ctx, fmt.Sprintf("u%d", i), "", testrig.Line("A", 2))
		require.NoError(t, err)
		_, err = r.Orders.Pay(ctx, o.ID, fmt.Sprintf("pay-%d", i))
		require.NoError(t, err)
	}
	crashing := stocksync.NewRelay(r.DB, r.Transport.Producer, r.Stock.Locker(), stocksync.RelayConfig{AfterSend: func(row arbiter.OutboxRow) error {
		return errors.New("killed")
	}})
	n, err := crashing.RelayOnce(ctx)
	require.Error(t, err)
	require.Zero(t, n)
	require.EqualValues(t, 4, r.Count(`SELECT COUNT(*) FROM stock_outbox WHERE sent_at IS NULL`), "nothing marked sent")

	r.StartPipeline()
	r.WaitApplied()
	// The crashed send already carried all four rows, so the ledger may be
	// complete before the new relay's resend arrives; wait for it to be absorbed.
	// The consumer may absorb the resend before the relay marks the rows
	// sent: wait for both.
	require.Eventually(t, func() bool { return r.Applier.Duplicate.Load() == 4 && r.Relay.Sent.Load() == 4 },
		30*time.Second, 10*time.Millisecond, "the first send (all four rows of A) was delivered twice and applied once")
	require.EqualValues(t, 0, r.Count(`SELECT COUNT(*) FROM stock_outbox WHERE sent_at IS NULL`))
	r.RequireQty("A", 12, 0)
	require.EqualValues(t, 4, r.Count(`SELECT COUNT(*) FROM stock_ledger`))
	r.CheckInvariant("A")
}
