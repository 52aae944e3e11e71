package expiry

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/order"
	"github.com/acme/inventory/stock"
	"github.com/acme/inventory/testkit/testenv"
)

// rig is what the timeout tests expire orders on: the real MariaDB and
// Redis, a clock the test moves, and the stock store of one node (more nodes
// come from node).
type rig struct {
	t     testing.TB
	db    *gorm.DB
	rdb   *redis.Client
	st    *stock.Store
	svc   *order.Service
	clock *testenv.Clock
}

// embedded makes newRig use the embedded default's stand-ins (SQLite and
// miniredis) instead of MariaDB and Redis; set only by TestEmbeddedContract.
var embedded bool

func newRig(t testing.TB) *rig {
	t.Helper()
	r := &rig{t: t, clock: testenv.NewClock()}
	if embedded {
		r.db, r.rdb = testenv.Embedded(t)
	} else {
		r.db, r.rdb = testenv.MySQL(t), testenv.Redis(t)
	}
	st, err := stock.NewStore(r.rdb, stock.Config{Init: arbiter.InitFunc(r.db)})
	require.NoError(t, err)
	r.st = st
	r.svc = order.NewService(r.db, st, order.Config{Now: r.clock.Now})
	t.Cleanup(func() { _ = r.svc.Close() })
	return r
}

func (r *rig) addSKU(sku string, n int64) {
	r.t.Helper()
	require.NoError(r.t, r.db.Exec(`INSERT INTO skus (sku, on_hand) VALUES (?, ?)`, sku, n).Error)
}

func (r *rig) count(query string, args ...any) int64 {
	r.t.Helper()
	var n int64
	require.NoError(r.t, r.db.Raw(query, args...).Scan(&n).Error)
	return n
}

func line(sku string, qty int64) []inventory.Line { return []inventory.Line{{SKU: sku, Qty: qty}} }

// requireQty asserts sku's on_hand and reserved in the database.
func (r *rig) requireQty(sku string, onHand, reserved int64) {
	r.t.Helper()
	var rec arbiter.SKU
	require.NoError(r.t, r.db.Take(&rec, "sku = ?", sku).Error)
	require.Equal(r.t, [2]int64{onHand, reserved}, [2]int64{rec.OnHand, rec.Reserved}, "%s: [on_hand, reserved]", sku)
}

// checkInvariant asserts docs/SPEC.md section 3's invariant for sku at a
// quiet point: reserved = the sum of live reservation rows <= on_hand, and
// Redis available = on_hand - reserved.
func (r *rig) checkInvariant(sku string) {
	r.t.Helper()
	var rec arbiter.SKU
	require.NoError(r.t, r.db.Take(&rec, "sku = ?", sku).Error)
	live := r.count(`SELECT COALESCE(SUM(qty), 0) FROM stock_reservations WHERE sku = ? AND state IN ('HELD', 'COMMITTED')`, sku)
	require.Equal(r.t, live, rec.Reserved, "%s: reserved = live reservations", sku)
	require.Equal(r.t, rec.Available(), r.redisAvailable(sku), "%s: Redis available = on_hand - reserved", sku)
	if rec.OnHand != inventory.Unlimited {
		require.LessOrEqual(r.t, rec.Reserved, rec.OnHand, "%s: reserved <= on_hand", sku)
	}
}

// redisAvailable is what Redis has for sku (initialising it if needed).
func (r *rig) redisAvailable(sku string) int64 {
	r.t.Helper()
	ctx := context.Background()
	require.NoError(r.t, r.st.EnsureInit(ctx, sku))
	lv, err := r.st.Levels(ctx, sku)
	require.NoError(r.t, err)
	return lv.Available
}

// reservationState is the state of the reservation (token, sku).
func (r *rig) reservationState(token, sku string) arbiter.ResState {
	r.t.Helper()
	var res arbiter.Reservation
	require.NoError(r.t, r.db.Take(&res, "token = ? AND sku = ?", token, sku).Error, "reservation (%s, %s)", token, sku)
	return res.State
}

// TestEmbeddedContract runs the expiry tests that need no Redis Cluster or
// second process again on the embedded default's stand-ins.
func TestEmbeddedContract(t *testing.T) {
	embedded = true
	defer func() { embedded = false }()
	t.Run("SweepCatchesWhatTheQueueMissed", TestSweepCatchesWhatTheQueueMissed)
	t.Run("PaymentRacesTimeout", TestPaymentRacesTimeout)
	t.Run("EarlyClaimIsRequeued", TestEarlyClaimIsRequeued)
}
