// Package testrig assembles one node of the service on the real servers
// (testkit/testenv) or on the embedded default's stand-ins, for the tests
// of every package that needs the whole write path: the order lifecycle,
// the token API, the catalog, the listings, the group commit, the sync
// path and maintenance. Nothing here skips: a server that does not answer
// fails the test.
package testrig

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/campaign"
	"github.com/acme/inventory/internal/catalog"
	"github.com/acme/inventory/internal/groupcommit"
	"github.com/acme/inventory/internal/listing"
	"github.com/acme/inventory/internal/maintenance"
	"github.com/acme/inventory/internal/mysqlconn"
	"github.com/acme/inventory/internal/projection"
	"github.com/acme/inventory/internal/rawtx"
	"github.com/acme/inventory/internal/stocksync"
	"github.com/acme/inventory/internal/tokens"
	"github.com/acme/inventory/mq"
	"github.com/acme/inventory/order"
	"github.com/acme/inventory/stock"
	"github.com/acme/inventory/testkit/testenv"
	"github.com/acme/inventory/testkit/wirecount"
)

// Transport is the ordered queue between the relay and the applier.
type Transport struct {
	Producer mq.Producer
	Consumer func(t testing.TB, h mq.Handler) mq.Consumer
}

// MemoryTransport is the in-process ordered queue.
func MemoryTransport(t testing.TB) Transport {
	m := mq.NewMemory(8)
	return Transport{
		Producer: m.Producer(),
		Consumer: func(t testing.TB, h mq.Handler) mq.Consumer { return m.Consumer(h, 32, 20*time.Millisecond) },
	}
}

// Rig is one node of the service on a database and a Redis.
type Rig struct {
	T         testing.TB
	DB        *gorm.DB
	RDB       *redis.Client
	Stock     *stock.Store
	Orders    *order.Service
	Tokens    *tokens.Service
	Catalog   *catalog.Catalog
	Campaigns *campaign.Service
	Listing   *listing.Reader
	Commits   *groupcommit.Writer
	Applier   *stocksync.Applier
	Relay     *stocksync.Relay
	Transport Transport
	Clock     *testenv.Clock
	// MultiStatements is DB on the pool the order service sends its
	// one-round-trip texts on (order.Config.MultiStatements); nil on the
	// embedded stand-ins.
	MultiStatements *gorm.DB
	// Wire counts the commands New's rig sends MariaDB on all its
	// connections (testkit/wirecount); nil on the embedded stand-ins and
	// for Assemble's rigs.
	Wire *wirecount.Counter
	// Projector is the lean sale's projector on DB, not started: Catch
	// runs it until it is done (Lean's rigs' sales are projected by it, or
	// by the first path that reads them).
	Projector *projection.Job
	lean      bool
}

// TTL is how long the rig's orders and token reservations hold stock.
const TTL = 15 * time.Minute

// Lean has New's and Assemble's rigs sell as the lean sale does
// (order.Config.Lean, tokens.Config.Lean); set only by a package's lean
// contract test, around the subtests it runs again so (RunLean).
var Lean bool

// NewLean is New with Lean set while it builds the rig: one node selling
// as the lean sale does, whatever Lean is around it.
func NewLean(t testing.TB, tr Transport) *Rig {
	t.Helper()
	was := Lean
	Lean = true
	defer func() { Lean = was }()
	return New(t, tr)
}

// Embedded makes New use the embedded default's stand-ins (SQLite and
// miniredis) instead of MariaDB and Redis; set only by a package's
// embedded contract test, around the subtests it runs again there.
var Embedded bool

// New is one node on the real MariaDB and Redis (a fresh database, a
// flushed Redis database), or on the stand-ins while Embedded is set.
func New(t testing.TB, tr Transport) *Rig {
	t.Helper()
	if Embedded {
		db, rdb := testenv.Embedded(t)
		return Assemble(t, tr, db, rdb, Opts{})
	}
	// Every connection of the rig dialed through a network of its own,
	// whose commands are counted.
	wire := wirecount.Network(fmt.Sprintf("testrig%d", rigs.Add(1)))
	dsn, ok := wire.DSN(testenv.MySQLDatabase(t))
	require.True(t, ok, "the test DSN names no tcp(...) address: the rig's round trips are not counted")
	db := testenv.MySQLAt(t, dsn)
	cfg, err := mysql.ParseDSN(dsn)
	require.NoError(t, err)
	multi, err := mysqlconn.MultiStatements(cfg, 8)
	require.NoError(t, err)
	t.Cleanup(func() { _ = multi.Close() })
	r := Assemble(t, tr, db, testenv.Redis(t), Opts{MultiStatements: order.OnPool(db, multi)})
	r.Wire = wire
	return r
}

// rigs numbers New's rigs (each counts its connections on a network of
// its own).
var rigs atomic.Int64

// Opts adjusts what Assemble builds (the scenarios inject faults with them).
type Opts struct {
	// WrapInit wraps the inventory.InitFunc (to pause a cold init).
	WrapInit func(inventory.InitFunc) inventory.InitFunc
	// Hooks are added to the Redis client (fault injection).
	Hooks []redis.Hook
	// Stock adjusts the stock config.
	Stock func(*stock.Config)
	// LenientApply logs (instead of failing on) an applier's Redis Apply
	// error: under injected chaos a realign may find the init lock taken.
	LenientApply bool
	// MultiStatements is the order service's handle on a pool for
	// one-round-trip texts (order.Config.MultiStatements); nil: none.
	MultiStatements *gorm.DB
}

// Assemble builds one node of the service on db and rdb.
func Assemble(t testing.TB, tr Transport, db *gorm.DB, rdb *redis.Client, opts Opts) *Rig {
	t.Helper()
	for _, h := range opts.Hooks {
		rdb.AddHook(h)
	}
	r := &Rig{T: t, Transport: tr, Clock: testenv.NewClock(), DB: db, RDB: rdb, MultiStatements: opts.MultiStatements, lean: Lean}
	init := arbiter.InitFunc(db)
	if opts.WrapInit != nil {
		init = opts.WrapInit(init)
	}
	cfg := stock.Config{Init: init, InitCampaign: campaign.InitFunc(db)}
	if opts.Stock != nil {
		opts.Stock(&cfg)
	}
	st, err := stock.NewStore(rdb, cfg)
	require.NoError(t, err)
	r.Stock = st
	r.Applier = stocksync.NewApplier(db, nil)
	r.Applier.OnApplied = func(ctx context.Context, chs []inventory.Change) {
		for _, c := range chs {
			if err := st.Apply(ctx, c); err != nil {
				if opts.LenientApply {
					t.Logf("applier: bringing %+v into Redis: %v (the realign repairs it)", c, err)
				} else {
					t.Errorf("applier: bringing %+v into Redis: %v", c, err)
				}
			}
		}
	}
	r.Relay = stocksync.NewRelay(db, tr.Producer, st.Locker(), stocksync.RelayConfig{Interval: 20 * time.Millisecond})
	r.Commits = groupcommit.New(db)
	t.Cleanup(func() { _ = r.Commits.Close() })
	r.Orders = order.NewService(db, st, order.Config{TTL: TTL, Now: r.Clock.Now, OnOutbox: r.Relay.Wake, Writer: r.Commits,
		MultiStatements: opts.MultiStatements, Lean: Lean, LeanCampaigns: Lean})
	r.Tokens = tokens.New(db, st, r.Commits, tokens.Config{TTL: TTL, Now: r.Clock.Now, OnOutbox: r.Relay.Wake, Lean: Lean})
	r.Projector = projection.New(db, st.Locker(), projection.Config{})
	r.Catalog = catalog.New(db, st, nil)
	r.Campaigns = campaign.New(db, st, r.Orders, campaign.Config{Now: r.Clock.Now})
	r.Listing = listing.New(db)
	return r
}

func (r *Rig) AddSKU(sku string, n int64) {
	r.T.Helper()
	require.NoError(r.T, r.DB.Exec(`INSERT INTO skus (sku, on_hand) VALUES (?, ?)`, sku, n).Error)
}

// PutSKU puts a new SKU named after prefix through the catalog, as an admin
// does, and returns its name.
func (r *Rig) PutSKU(prefix string, onHand, perUserLimit int64) string {
	r.T.Helper()
	sku := testenv.Unique(prefix)
	_, err := r.Catalog.Put(context.Background(), sku, onHand, perUserLimit)
	require.NoError(r.T, err)
	return sku
}

// Reconciler is a Reconciler on the rig's stores. Its realign watches a
// pool that is only behind the database for RealignSettle: a test calls it
// at a quiet point, with nothing in flight.
func (r *Rig) Reconciler() *maintenance.Reconciler {
	return maintenance.NewReconciler(r.DB, r.Stock, nil).WithSettle(RealignSettle)
}

// RealignSettle is the settle of the rig's Reconciler.
const RealignSettle = 20 * time.Millisecond

// SKU reads sku's database record (its quantity states).
func (r *Rig) SKU(sku string) arbiter.SKU {
	r.T.Helper()
	var rec arbiter.SKU
	require.NoError(r.T, r.DB.Take(&rec, "sku = ?", sku).Error)
	return rec
}

// OnHand is sku's on_hand in the database.
func (r *Rig) OnHand(sku string) int64 { return r.SKU(sku).OnHand }

// Live is the sum of sku's live (HELD or COMMITTED) reservation rows,
// once the projector has written every hold the lean sale recorded.
func (r *Rig) Live(sku string) int64 {
	r.T.Helper()
	return r.Count(`SELECT COALESCE(SUM(qty), 0) FROM stock_reservations WHERE sku = ? AND state IN ('HELD', 'COMMITTED')`, sku)
}

// RedisAvailable is what Redis has for sku (initialising it if needed).
// A cold-init lock another caller leaked (its release lost to a Redis
// fault) holds the key for up to the lock's TTL, past a caller's InitWait:
// that answer (unavailable) is waited out a few times, as a client would.
func (r *Rig) RedisAvailable(sku string) int64 {
	r.T.Helper()
	ctx := context.Background()
	err := r.Stock.EnsureInit(ctx, sku)
	for try := 0; try < 3 && errors.Is(err, inventory.ErrUnavailable); try++ {
		err = r.Stock.EnsureInit(ctx, sku)
	}
	require.NoError(r.T, err)
	lv, err := r.Stock.Levels(ctx, sku)
	require.NoError(r.T, err)
	return lv.Available
}

// Count is query's one number, read once the projector has written every
// hold a lean rig's sales recorded (what the test reads is then what the
// sale made, behind it by no lag).
func (r *Rig) Count(query string, args ...any) int64 {
	r.T.Helper()
	if r.lean {
		r.Catch()
	}
	var n int64
	require.NoError(r.T, r.DB.Raw(query, args...).Scan(&n).Error)
	return n
}

// StartPipeline runs the relay and a consumer feeding the applier.
func (r *Rig) StartPipeline() (stop func()) {
	r.T.Helper()
	c := r.Transport.Consumer(r.T, r.Applier.Handle)
	require.NoError(r.T, c.Start())
	r.Relay.Start(context.Background())
	var once sync.Once
	stop = func() {
		once.Do(func() {
			r.Relay.Stop()
			require.NoError(r.T, c.Close())
		})
	}
	r.T.Cleanup(stop)
	return stop
}

// WaitApplied waits until every outbox row is in the ledger or the anomalies.
func (r *Rig) WaitApplied() {
	r.T.Helper()
	require.Eventually(r.T, func() bool {
		n, err := arbiter.OutboxOf(r.DB).Unsettled()
		require.NoError(r.T, err)
		return n == 0
	}, 90*time.Second, 20*time.Millisecond, "the outbox drains into the ledger")
}

// CheckInvariant asserts docs/SPEC.md section 3's invariant for sku at a quiet point:
// reserved <= on_hand (limited SKUs), reserved = the sum of live reservation
// rows, and Redis available = on_hand - reserved.
func (r *Rig) CheckInvariant(sku string) {
	r.T.Helper()
	rec := r.SKU(sku)
	require.Equal(r.T, r.Live(sku), rec.Reserved, "%s: reserved = live reservations", sku)
	require.Equal(r.T, rec.Available(), r.RedisAvailable(sku), "%s: Redis available = on_hand - reserved", sku)
	if rec.OnHand != inventory.Unlimited {
		require.LessOrEqual(r.T, rec.Reserved, rec.OnHand, "%s: reserved <= on_hand", sku)
	}
}

// Line is a one-line cart.
func Line(sku string, qty int64) []inventory.Line { return []inventory.Line{{SKU: sku, Qty: qty}} }

// RequireQty asserts sku's on_hand and reserved in the database.
func (r *Rig) RequireQty(sku string, onHand, reserved int64) {
	r.T.Helper()
	rec := r.SKU(sku)
	require.Equal(r.T, [2]int64{onHand, reserved}, [2]int64{rec.OnHand, rec.Reserved}, "%s: [on_hand, reserved]", sku)
}

// ReservationState is the state of the reservation (token, sku).
func (r *Rig) ReservationState(token, sku string) arbiter.ResState {
	r.T.Helper()
	if r.lean {
		r.Catch()
	}
	var res arbiter.Reservation
	require.NoError(r.T, r.DB.Take(&res, "token = ? AND sku = ?", token, sku).Error, "reservation (%s, %s)", token, sku)
	return res.State
}

// Outbox is every outbox row, in id order, as the message it becomes.
func (r *Rig) Outbox() []arbiter.StockMessage {
	r.T.Helper()
	rows, err := arbiter.OutboxOf(r.DB).Rows()
	require.NoError(r.T, err)
	out := make([]arbiter.StockMessage, len(rows))
	for i, row := range rows {
		out[i] = arbiter.StockMessage{Token: row.Token, SKU: row.SKU, Op: row.Op, Qty: row.Qty}
	}
	return out
}

// RedisApplied reports each change the applier brings into Redis. Those land
// after the delivery commits, so after waitApplied can see its ledger row:
// wait(n) blocks until n more changes have been applied to Redis. Call it
// before startPipeline.
func (r *Rig) RedisApplied() (wait func(n int)) {
	ch := make(chan inventory.Change, 4096)
	next := r.Applier.OnApplied
	r.Applier.OnApplied = func(ctx context.Context, chs []inventory.Change) {
		next(ctx, chs)
		for _, c := range chs {
			ch <- c
		}
	}
	return func(n int) {
		r.T.Helper()
		for i := 0; i < n; i++ {
			select {
			case <-ch:
			case <-time.After(60 * time.Second):
				r.T.Fatalf("%d of %d changes reached Redis", i, n)
			}
		}
	}
}

// Quota is what buyer_quotas counts for user of sku.
func (r *Rig) Quota(sku, user string) int64 {
	r.T.Helper()
	return r.Count(`SELECT COALESCE(SUM(qty), 0) FROM buyer_quotas WHERE sku = ? AND user_id = ?`, sku, user)
}

// MovementSums are sku's movement deltas summed ([on_hand, reserved]):
// they must equal on_hand and reserved whatever retention pruned.
func (r *Rig) MovementSums(sku string) [2]int64 {
	r.T.Helper()
	var s struct{ OnHand, Reserved int64 }
	require.NoError(r.T, r.DB.Raw(`SELECT COALESCE(SUM(on_hand_delta), 0) AS on_hand, COALESCE(SUM(reserved_delta), 0) AS reserved
		FROM stock_movements WHERE sku = ?`, sku).Scan(&s).Error)
	return [2]int64{s.OnHand, s.Reserved}
}

// Deliver hands msgs to the applier as one delivery of the queue.
func (r *Rig) Deliver(msgs ...arbiter.StockMessage) {
	r.T.Helper()
	var out []mq.Message
	for _, m := range msgs {
		body, err := json.Marshal(m)
		require.NoError(r.T, err)
		out = append(out, mq.Message{Key: m.SKU, Body: body})
	}
	require.NoError(r.T, r.Applier.Handle(context.Background(), out))
}

// Race runs fn(0..n-1) in n goroutines released at once, and waits for
// them: the shape of every race test.
func Race(n int, fn func(i int)) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			fn(i)
		}()
	}
	close(start)
	wg.Wait()
}

// Raw is query's number as the database has it now, the projector's lag
// included (Count catches the projector up first).
func (r *Rig) Raw(query string, args ...any) int64 {
	r.T.Helper()
	var n int64
	require.NoError(r.T, r.DB.Raw(query, args...).Scan(&n).Error)
	return n
}

// IsLean reports whether the rig sells as the lean sale does.
func (r *Rig) IsLean() bool { return r.lean }

// Catch runs the projector until every hold the lean sale recorded is
// projected.
func (r *Rig) Catch() {
	r.T.Helper()
	require.NoError(r.T, r.Projector.CatchUp(context.Background()))
	var dirty int64
	require.NoError(r.T, r.DB.Raw(arbiter.BacklogSQL).Scan(&dirty).Error)
	require.Zero(r.T, dirty, "the projector caught up")
}

// RunLean runs tests again with every rig selling as the lean sale does,
// each as a subtest named after it: a package's lean contract.
func RunLean(t *testing.T, tests ...func(*testing.T)) { runWith(t, &Lean, tests) }

// RunEmbedded runs tests again on the embedded default's stand-ins (SQLite,
// miniredis, the in-process queue), each as a subtest named after it, with
// Embedded set around them: a package's embedded contract.
func RunEmbedded(t *testing.T, tests ...func(*testing.T)) { runWith(t, &Embedded, tests) }

// runWith runs tests as subtests named after them with *flag set.
func runWith(t *testing.T, flag *bool, tests []func(*testing.T)) {
	was := *flag
	*flag = true
	defer func() { *flag = was }()
	for _, fn := range tests {
		name := runtime.FuncForPC(reflect.ValueOf(fn).Pointer()).Name()
		t.Run(strings.TrimPrefix(name[strings.LastIndex(name, ".")+1:], "Test"), fn)
	}
}

// CountStatements counts every statement GORM sends on db while fn runs
// (queries, inserts, updates, deletes, raw SQL), from any goroutine, and
// those the group commit sends on it past GORM (internal/rawtx).
func CountStatements(t testing.TB, db *gorm.DB, fn func()) int64 {
	t.Helper()
	var n atomic.Int64
	stop := ObserveStatements(t, db, func(string, error) { n.Add(1) })
	defer stop()
	fn()
	return n.Load()
}

// ObserveStatements calls fn with each statement GORM sends on db
// (queries, inserts, updates, deletes, raw SQL) and each the group commit
// sends on it past GORM (internal/rawtx), from any goroutine, with its
// error, once it ran, until stop (or t's end).
func ObserveStatements(t testing.TB, db *gorm.DB, fn func(sql string, err error)) (stop func()) {
	t.Helper()
	stopRaw := rawtx.Observe(db, func(s rawtx.Statement) { fn(s.SQL, s.Err) })
	name := fmt.Sprintf("observe:%s:%d", t.Name(), observers.Add(1))
	after := func(tx *gorm.DB) { fn(tx.Statement.SQL.String(), tx.Error) }
	cb := db.Callback()
	require.NoError(t, cb.Query().After("gorm:query").Register(name, after))
	require.NoError(t, cb.Create().After("gorm:create").Register(name, after))
	require.NoError(t, cb.Update().After("gorm:update").Register(name, after))
	require.NoError(t, cb.Delete().After("gorm:delete").Register(name, after))
	require.NoError(t, cb.Raw().After("gorm:raw").Register(name, after))
	require.NoError(t, cb.Row().After("gorm:row").Register(name, after))
	var once sync.Once
	stop = func() {
		once.Do(func() {
			stopRaw()
			_ = cb.Query().Remove(name)
			_ = cb.Create().Remove(name)
			_ = cb.Update().Remove(name)
			_ = cb.Delete().Remove(name)
			_ = cb.Raw().Remove(name)
			_ = cb.Row().Remove(name)
		})
	}
	t.Cleanup(stop)
	return stop
}

// observers numbers ObserveStatements' callbacks, whose names must differ.
var observers atomic.Int64
