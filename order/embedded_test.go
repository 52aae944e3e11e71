package order

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/maintenance"
	"github.com/acme/inventory/internal/stocksync"
	"github.com/acme/inventory/internal/testenv"
	"github.com/acme/inventory/mq"
	"github.com/acme/inventory/stock"
)

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

// rig is one node of the service on the real MariaDB and Redis.
type rig struct {
	t       testing.TB
	db      *gorm.DB
	rdb     *redis.Client
	st      *stock.Store
	svc     *Service
	applier *stocksync.Applier
	relay   *stocksync.Relay
	tr      transport
	clock   *testenv.Clock
}

// embedded makes newRig use the embedded default's stand-ins (SQLite and
// miniredis) instead of MariaDB and Redis; set only by TestEmbeddedContract.
var embedded bool

func newRig(t testing.TB, tr transport) *rig {
	t.Helper()
	if embedded {
		db, rdb := testenv.Embedded(t)
		return assemble(t, tr, db, rdb, rigOpts{})
	}
	return assemble(t, tr, testenv.MySQL(t), testenv.Redis(t), rigOpts{})
}

// rigOpts adjusts what assemble builds (the scenarios inject faults with them).
type rigOpts struct {
	// wrapInit wraps the inventory.InitFunc (to pause a cold init).
	wrapInit func(inventory.InitFunc) inventory.InitFunc
	// hooks are added to the Redis client (fault injection).
	hooks []redis.Hook
	// cfg adjusts the stock config.
	cfg func(*stock.Config)
	// lenientApply logs (instead of failing on) an applier's Redis Apply
	// error: under injected chaos a realign may find the init lock taken.
	lenientApply bool
}

// assemble builds one node of the service on db and rdb.
func assemble(t testing.TB, tr transport, db *gorm.DB, rdb *redis.Client, opts rigOpts) *rig {
	t.Helper()
	for _, h := range opts.hooks {
		rdb.AddHook(h)
	}
	r := &rig{t: t, tr: tr, clock: testenv.NewClock(), db: db, rdb: rdb}
	init := arbiter.InitFunc(db)
	if opts.wrapInit != nil {
		init = opts.wrapInit(init)
	}
	cfg := stock.Config{Init: init}
	if opts.cfg != nil {
		opts.cfg(&cfg)
	}
	st, err := stock.NewStore(rdb, cfg)
	require.NoError(t, err)
	r.st = st
	r.applier = stocksync.NewApplier(db, nil)
	r.applier.OnApplied = func(ctx context.Context, chs []inventory.Change) {
		for _, c := range chs {
			if err := st.Apply(ctx, c); err != nil {
				if opts.lenientApply {
					t.Logf("applier: bringing %+v into Redis: %v (the realign repairs it)", c, err)
				} else {
					t.Errorf("applier: bringing %+v into Redis: %v", c, err)
				}
			}
		}
	}
	r.relay = stocksync.NewRelay(db, tr.producer, st.Locker(), stocksync.RelayConfig{Interval: 20 * time.Millisecond})
	r.svc = NewService(db, st, Config{TTL: 15 * time.Minute, Now: r.clock.Now, OnOutbox: r.relay.Wake})
	t.Cleanup(func() { _ = r.svc.Close() })
	return r
}

func (r *rig) addSKU(sku string, n int64) {
	r.t.Helper()
	require.NoError(r.t, r.db.Exec(`INSERT INTO skus (sku, on_hand) VALUES (?, ?)`, sku, n).Error)
}

// putSKU puts a new SKU named after prefix through the catalog, as an admin
// does, and returns its name.
func (r *rig) putSKU(prefix string, onHand, perUserLimit int64) string {
	r.t.Helper()
	sku := testenv.Unique(prefix)
	_, err := NewCatalog(r.db, r.st, nil).Put(context.Background(), sku, onHand, perUserLimit)
	require.NoError(r.t, err)
	return sku
}

// reconciler is a Reconciler on the rig's stores.
func (r *rig) reconciler() *maintenance.Reconciler { return maintenance.NewReconciler(r.db, r.st, nil) }

// sku reads sku's database record (its quantity states).
func (r *rig) sku(sku string) arbiter.SKU {
	r.t.Helper()
	var rec arbiter.SKU
	require.NoError(r.t, r.db.Take(&rec, "sku = ?", sku).Error)
	return rec
}

// onHand is sku's on_hand in the database.
func (r *rig) onHand(sku string) int64 { return r.sku(sku).OnHand }

// live is the sum of sku's live (HELD or COMMITTED) reservation rows.
func (r *rig) live(sku string) int64 {
	r.t.Helper()
	return r.count(`SELECT COALESCE(SUM(qty), 0) FROM stock_reservations WHERE sku = ? AND state IN ('HELD', 'COMMITTED')`, sku)
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
			LEFT JOIN stock_ledger l ON l.token = ob.token AND l.sku = ob.sku AND l.op = ob.op
			LEFT JOIN stock_anomalies a ON a.token = ob.token AND a.sku = ob.sku AND a.op = ob.op
			WHERE l.id IS NULL AND a.id IS NULL`) == 0
	}, 90*time.Second, 20*time.Millisecond, "the outbox drains into the ledger")
}

// checkInvariant asserts docs/SPEC.md section 3's invariant for sku at a quiet point:
// reserved <= on_hand (limited SKUs), reserved = the sum of live reservation
// rows, and Redis available = on_hand - reserved.
func (r *rig) checkInvariant(sku string) {
	r.t.Helper()
	rec := r.sku(sku)
	require.Equal(r.t, r.live(sku), rec.Reserved, "%s: reserved = live reservations", sku)
	require.Equal(r.t, rec.Available(), r.redisAvailable(sku), "%s: Redis available = on_hand - reserved", sku)
	if rec.OnHand != inventory.Unlimited {
		require.LessOrEqual(r.t, rec.Reserved, rec.OnHand, "%s: reserved <= on_hand", sku)
	}
}

func line(sku string, qty int64) []inventory.Line { return []inventory.Line{{SKU: sku, Qty: qty}} }

// requireQty asserts sku's on_hand and reserved in the database.
func (r *rig) requireQty(sku string, onHand, reserved int64) {
	r.t.Helper()
	rec := r.sku(sku)
	require.Equal(r.t, [2]int64{onHand, reserved}, [2]int64{rec.OnHand, rec.Reserved}, "%s: [on_hand, reserved]", sku)
}

// reservationState is the state of the reservation (token, sku).
func (r *rig) reservationState(token, sku string) arbiter.ResState {
	r.t.Helper()
	var res arbiter.Reservation
	require.NoError(r.t, r.db.Take(&res, "token = ? AND sku = ?", token, sku).Error, "reservation (%s, %s)", token, sku)
	return res.State
}

// outbox is every outbox row, in id order, as the message it becomes.
func (r *rig) outbox() []arbiter.StockMessage {
	r.t.Helper()
	var rows []arbiter.OutboxRow
	require.NoError(r.t, r.db.Order("id").Find(&rows).Error)
	out := make([]arbiter.StockMessage, len(rows))
	for i, row := range rows {
		out[i] = arbiter.StockMessage{Token: row.Token, SKU: row.SKU, Op: row.Op, Qty: row.Qty}
	}
	return out
}

// redisApplied reports each change the applier brings into Redis. Those land
// after the delivery commits, so after waitApplied can see its ledger row:
// wait(n) blocks until n more changes have been applied to Redis. Call it
// before startPipeline.
func (r *rig) redisApplied() (wait func(n int)) {
	ch := make(chan inventory.Change, 4096)
	next := r.applier.OnApplied
	r.applier.OnApplied = func(ctx context.Context, chs []inventory.Change) {
		next(ctx, chs)
		for _, c := range chs {
			ch <- c
		}
	}
	return func(n int) {
		r.t.Helper()
		for i := 0; i < n; i++ {
			select {
			case <-ch:
			case <-time.After(60 * time.Second):
				r.t.Fatalf("%d of %d changes reached Redis", i, n)
			}
		}
	}
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
		{"ItemsAreTheReservations", TestItemsAreTheReservations},
		{"ItemsOfOrdersBeforeReservations", TestItemsOfOrdersBeforeReservations},
		{"EndToEnd", TestEndToEndMemory},
		{"ApplyExactlyOnce", TestApplyExactlyOnce},
		{"CrashBetweenCommitAndSend", TestCrashBetweenCommitAndSend},
		{"CrashBetweenSendAndMark", TestCrashBetweenSendAndMark},
		{"ConsumerCrashMidBatch", TestConsumerCrashMidBatch},
		{"KeyLossWithPendingAndUnapplied", TestKeyLossWithPendingAndUnapplied},
		{"DatabaseRefusesWhatRedisOverAdmits", TestDatabaseRefusesWhatRedisOverAdmits},
		{"BatcherRefusesPerRequest", TestBatcherRefusesPerRequest},
		{"Catalog", TestCatalog},
		{"RealignerRepairsDrift", TestRealignerRepairsDrift},
		{"PerUserLimitIsArbitratedByTheDatabase", TestPerUserLimitIsArbitratedByTheDatabase},
		{"PerUserLimitSetLater", TestPerUserLimitSetLater},
		{"PerUserLimitRace", TestPerUserLimitRace},
		{"RetentionPrunesFinishedHistory", TestRetentionPrunesFinishedHistory},
		{"RetentionConcurrentRuns", TestRetentionConcurrentRuns},
	} {
		t.Run(tc.name, tc.fn)
	}
}
