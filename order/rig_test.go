package order

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/glebarez/sqlite"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/acme/inventory/internal/testenv"
	"github.com/acme/inventory/migrations"
	"github.com/acme/inventory/mq"
	"github.com/acme/inventory/stock"
)

// orderRedisDB is this package's database on the shared single-node Redis.
const orderRedisDB = 2

// transport is the ordered queue between the relay and the applier.
type transport struct {
	producer mq.Producer
	consumer func(t testing.TB, h mq.Handler) mq.Consumer
}

func memoryTransport(t testing.TB) transport {
	m := mq.NewMemory(8)
	return transport{
		producer: m.Producer(),
		consumer: func(t testing.TB, h mq.Handler) mq.Consumer { return m.Consumer(h, 32, 20*time.Millisecond) },
	}
}

// clock is an injectable clock tests move by hand.
type clock struct{ now atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.now.Store(time.Now().UnixNano())
	return c
}
func (c *clock) Now() time.Time          { return time.Unix(0, c.now.Load()) }
func (c *clock) Advance(d time.Duration) { c.now.Add(int64(d)) }

// rig is one node of the service on the real MariaDB and Redis.
type rig struct {
	t       testing.TB
	db      *gorm.DB
	rdb     *redis.Client
	st      *stock.Store
	svc     *Service
	applier *Applier
	relay   *Relay
	tr      transport
	clock   *clock
}

// embedded makes newRig use the embedded default's stand-ins (SQLite and
// miniredis) instead of MariaDB and Redis; set only by TestEmbeddedContract.
var embedded bool

func newRig(t testing.TB, tr transport) *rig {
	t.Helper()
	r := &rig{t: t, tr: tr, clock: newClock()}
	if embedded {
		r.db, r.rdb = embeddedStores(t)
	} else {
		r.db, r.rdb = testenv.MySQL(t), testenv.Redis(t, orderRedisDB)
	}
	st, err := stock.NewStore(r.rdb, stock.Config{Init: Snapshot(r.db), Now: r.clock.Now})
	require.NoError(t, err)
	r.st = st
	r.applier = NewApplier(r.db, nil)
	r.relay = NewRelay(r.db, tr.producer, st.Locker(), RelayConfig{Interval: 20 * time.Millisecond})
	r.svc = NewService(r.db, st, Config{TTL: 15 * time.Minute, Now: r.clock.Now, OnOutbox: r.relay.Wake})
	return r
}

func (r *rig) addSKU(sku string, n int64) {
	r.t.Helper()
	require.NoError(r.t, r.db.Exec(`INSERT INTO skus (sku, stock) VALUES (?, ?)`, sku, n).Error)
}

func (r *rig) dbStock(sku string) int64 {
	r.t.Helper()
	var n int64
	require.NoError(r.t, r.db.Raw(`SELECT stock FROM skus WHERE sku = ?`, sku).Scan(&n).Error)
	return n
}

func (r *rig) count(query string, args ...any) int64 {
	r.t.Helper()
	var n int64
	require.NoError(r.t, r.db.Raw(query, args...).Scan(&n).Error)
	return n
}

// startPipeline runs the relay and a consumer feeding the applier.
func (r *rig) startPipeline() (stop func()) {
	r.t.Helper()
	c := r.tr.consumer(r.t, r.applier.Handle)
	require.NoError(r.t, c.Start())
	r.relay.Start(context.Background())
	var once sync.Once
	stop = func() {
		once.Do(func() {
			r.relay.Stop()
			require.NoError(r.t, c.Close())
		})
	}
	r.t.Cleanup(stop)
	return stop
}

// waitApplied waits until every outbox row is in the ledger or the anomalies.
func (r *rig) waitApplied() {
	r.t.Helper()
	require.Eventually(r.t, func() bool {
		return r.count(`SELECT COUNT(*) FROM stock_outbox ob
			LEFT JOIN stock_ledger l ON l.order_id = ob.order_id AND l.sku = ob.sku AND l.op = ob.op
			LEFT JOIN stock_anomalies a ON a.order_id = ob.order_id AND a.sku = ob.sku AND a.op = ob.op
			WHERE l.id IS NULL AND a.id IS NULL`) == 0
	}, 90*time.Second, 20*time.Millisecond, "the outbox drains into the ledger")
}

// checkInvariant asserts the spec's invariant for sku at a quiet point:
// database stock = Redis available + held by unpaid reservations + paid but
// not yet applied (read from the database snapshot).
func (r *rig) checkInvariant(sku string) {
	r.t.Helper()
	ctx := context.Background()
	snap, err := Snapshot(r.db)(ctx, sku)
	require.NoError(r.t, err)
	lv, err := r.st.Levels(ctx, sku)
	require.NoError(r.t, err)
	require.True(r.t, lv.Initialised)
	var dbHeld int64
	for _, h := range snap.Holds {
		dbHeld += h.Qty
	}
	require.Equal(r.t, dbHeld, lv.Held, "%s: Redis holds what the pending orders hold", sku)
	require.Equal(r.t, snap.Stock, lv.Available+lv.Held+snap.Pending,
		"%s: database stock = available + held + paid-unapplied", sku)
}

func line(sku string, qty int64) []stock.Line { return []stock.Line{{SKU: sku, Qty: qty}} }

// embeddedStores opens what `make run` uses: SQLite behind one connection,
// migrated with the sqlite migrations, and miniredis with wall-clock TTLs.
func embeddedStores(t testing.TB) (*gorm.DB, *redis.Client) {
	t.Helper()
	db, err := gorm.Open(sqlite.Open("file:"+t.TempDir()+"/inventory.db?_pragma=busy_timeout(5000)"),
		&gorm.Config{Logger: logger.Discard, TranslateError: true})
	require.NoError(t, err)
	raw, err := db.DB()
	require.NoError(t, err)
	raw.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = raw.Close() })
	require.NoError(t, migrations.Up(context.Background(), raw, migrations.SQLite))
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)
	require.NoError(t, m.StartAddr("127.0.0.1:0"))
	t.Cleanup(m.Close)
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), PoolSize: 128})
	t.Cleanup(func() { _ = c.Close() })
	return db, c
}

// TestEmbeddedContract runs the order suite again on the embedded default's
// stand-ins (SQLite, miniredis, the in-process queue).
func TestEmbeddedContract(t *testing.T) {
	embedded = true
	defer func() { embedded = false }()
	for _, tc := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"CreateReservesFirst", TestCreateReservesFirst},
		{"IdempotentCreate", TestIdempotentCreate},
		{"PayCancelRefund", TestPayCancelRefund},
		{"CancelPayRaceOneWinner", TestCancelPayRaceOneWinner},
		{"LatePayment", TestLatePayment},
		{"EndToEnd", TestEndToEndMemory},
		{"ApplyExactlyOnce", TestApplyExactlyOnce},
		{"CrashBetweenCommitAndSend", TestCrashBetweenCommitAndSend},
		{"CrashBetweenSendAndMark", TestCrashBetweenSendAndMark},
		{"ConsumerCrashMidBatch", TestConsumerCrashMidBatch},
		{"KeyLossWithPendingAndUnapplied", TestKeyLossWithPendingAndUnapplied},
		{"Catalog", TestCatalog},
		{"SweepCatchesWhatTheQueueMissed", TestSweepCatchesWhatTheQueueMissed},
		{"PaymentRacesTimeout", TestPaymentRacesTimeout},
		{"EarlyClaimIsRequeued", TestEarlyClaimIsRequeued},
	} {
		t.Run(tc.name, tc.fn)
	}
}
