package order_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/groupcommit"
	"github.com/acme/inventory/order"
	"github.com/acme/inventory/testkit/testrig"
)

// unknownOutcome is a rig whose order service writes through a group commit
// that can lose a COMMIT's answer (testrig.UnansweredCommits).
func unknownOutcome(t *testing.T) (*testrig.Rig, *order.Service, *testrig.UnansweredCommits) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	u := r.UnansweredCommits()
	return r, order.NewService(r.DB, r.Stock, order.Config{TTL: testrig.TTL, Now: r.Clock.Now, Writer: u.Writer}), u
}

// lostCommit runs write with the next COMMIT's answer lost, within a
// deadline: the database records the write and the caller is told its
// outcome is unknown.
func lostCommit(t *testing.T, u *testrig.UnansweredCommits, write func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := u.AnswerLost(context.Background())
	err := write(ctx)
	cancel()
	require.ErrorIs(t, err, groupcommit.ErrUnknownOutcome)
	require.ErrorIs(t, err, inventory.ErrUnavailable, "a 503: it may have been recorded")
	require.NoError(t, u.Heal())
}

// realigned waits until sku was realigned since before (the realign a
// caller starts goes on when the caller stops waiting for it).
func realigned(t *testing.T, r *testrig.Rig, before int64, n int64) {
	t.Helper()
	require.Eventually(t, func() bool { return r.Stock.Stats().Realigns.Load() >= before+n },
		10*time.Second, 5*time.Millisecond, "the SKUs were realigned")
}

// A seckill whose commit's answer was lost while the database recorded it:
// its unit is not given back to Redis (nor its buyer's count), so Redis
// holds on_hand - reserved, never more, and the buyer's count is the
// database's; the SKU is realigned to make sure.
func TestSeckillOfUnknownOutcomeKeepsItsAdmission(t *testing.T) {
	r, svc, u := unknownOutcome(t)
	sku := r.PutSKU("SKU", 10, 2)
	require.EqualValues(t, 10, r.RedisAvailable(sku))
	realigns := r.Stock.Stats().Realigns.Load()

	lostCommit(t, u, func(ctx context.Context) error {
		_, err := svc.Seckill(ctx, "ann", sku, 2)
		return err
	})
	r.RequireQty(sku, 10, 1)
	require.EqualValues(t, 1, r.Quota(sku, "ann"), "the database recorded the sale")
	require.EqualValues(t, 9, r.RedisAvailable(sku), "Redis holds on_hand - reserved, not the unit given back")
	realigned(t, r, realigns, 1)
	r.CheckInvariant(sku)
	counts, _, err := r.Stock.Buyers(context.Background(), sku)
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"ann": 1}, counts, "the buyer's count is the database's")

	// The buyer's limit holds across Redis and the database alike.
	_, err = svc.Seckill(context.Background(), "ann", sku, 2)
	require.NoError(t, err)
	_, err = svc.Seckill(context.Background(), "ann", sku, 2)
	require.ErrorIs(t, err, inventory.ErrConflict)
	r.RequireQty(sku, 10, 2)
	r.CheckInvariant(sku)
}

// A cart whose commit's answer was lost while the database recorded it:
// no line's units are given back to Redis; every SKU is realigned, and a
// retry with the order's Idempotency-Key finds the order and takes nothing.
func TestCartOfUnknownOutcomeKeepsItsAdmission(t *testing.T) {
	r, svc, u := unknownOutcome(t)
	a, b := r.PutSKU("CARTA", 10, 0), r.PutSKU("CARTB", 10, 0)
	cart := []inventory.Line{{SKU: a, Qty: 2}, {SKU: b, Qty: 3}}
	require.EqualValues(t, 10, r.RedisAvailable(a))
	require.EqualValues(t, 10, r.RedisAvailable(b))
	realigns := r.Stock.Stats().Realigns.Load()

	lostCommit(t, u, func(ctx context.Context) error {
		_, err := svc.Create(ctx, "bob", "cart-1", cart)
		return err
	})
	r.RequireQty(a, 10, 2)
	r.RequireQty(b, 10, 3)
	require.EqualValues(t, 8, r.RedisAvailable(a), "Redis holds on_hand - reserved, not the units given back")
	require.EqualValues(t, 7, r.RedisAvailable(b))
	realigned(t, r, realigns, 2)
	r.CheckInvariant(a)
	r.CheckInvariant(b)

	o, err := svc.Create(context.Background(), "bob", "cart-1", cart)
	require.NoError(t, err)
	require.Equal(t, order.Pending, o.Status)
	require.EqualValues(t, 1, r.Count(`SELECT COUNT(*) FROM orders WHERE user_id = 'bob'`))
	r.CheckInvariant(a)
	r.CheckInvariant(b)
}
