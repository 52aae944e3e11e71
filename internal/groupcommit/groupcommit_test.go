package groupcommit

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/batchq"
	"github.com/acme/inventory/internal/breaker"
	"github.com/acme/inventory/internal/mysqlconn"
	"github.com/acme/inventory/internal/rawtx"
	"github.com/acme/inventory/testkit/testenv"
)

// rig is a database for the group commit's tests: the real MariaDB, or
// the embedded default's SQLite while embedded is set.
type rig struct {
	t  testing.TB
	db *gorm.DB
}

// embedded makes newRig use SQLite; set only by TestEmbeddedContract.
var embedded bool

func newRig(t testing.TB) *rig {
	t.Helper()
	if embedded {
		db, _ := testenv.Embedded(t)
		return &rig{t: t, db: db}
	}
	return &rig{t: t, db: testenv.MySQL(t)}
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

// requireQty asserts sku's on_hand and reserved.
func (r *rig) requireQty(sku string, onHand, reserved int64) {
	r.t.Helper()
	got := [2]int64{r.count(`SELECT on_hand FROM skus WHERE sku = ?`, sku), r.count(`SELECT reserved FROM skus WHERE sku = ?`, sku)}
	require.Equal(r.t, [2]int64{onHand, reserved}, got, "%s: [on_hand, reserved]", sku)
}

// orderColumns are the orders table's, as the order lifecycle writes a new
// order (package order's orderRecord).
var orderColumns = []string{"id", "user_id", "idempotency_key", "status", "reservation_token", "payment_id",
	"expires_at", "paid_at", "created_at", "updated_at"}

// orderWrite is a write of a PENDING order id of user holding one unit of
// each of skus, expiring at expires.
func orderWrite(id, user string, expires time.Time, skus ...string) *Request {
	now := time.Now().UTC().Truncate(time.Microsecond)
	req := &Request{Buyer: user, Records: []*Record{{Table: "orders", Columns: orderColumns,
		Values: []any{id, user, nil, "PENDING", id, nil, expires, nil, now, now}}}}
	for _, sku := range skus {
		req.Rows = append(req.Rows, arbiter.Reservation{Token: id, SKU: sku, OrderID: &id, Qty: 1, State: arbiter.Held,
			ExpiresAt: expires, CreatedAt: now, UpdatedAt: now})
	}
	return req
}

// oneUnitOrder is a write of order id (user u) holding one unit of sku.
func oneUnitOrder(id, sku string) *Request {
	return orderWrite(id, "u", time.Now().UTC().Truncate(time.Microsecond), sku)
}

// testBatcher is a group commit on db whose writers' connections the
// test's end gives back.
func testBatcher(t testing.TB, db *gorm.DB) *Writer {
	b := New(db)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// Concurrent writes share transactions, and a duplicate in a batch fails
// alone: every other order of that batch is written, with its reservation.
func TestBatcherGroupCommit(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.addSKU("A", 1000)
	b := testBatcher(t, r.db)
	mk := func(id string) *Request { return oneUnitOrder(id, "A") }
	_, err := b.Write(ctx, mk("dup"))
	require.NoError(t, err)

	var inserts atomic.Int64
	defer rawtx.Observe(r.db, func(s rawtx.Statement) {
		if insertsInto(s, "orders") {
			inserts.Add(1)
		}
	})()

	const n = 64
	writeAll := func(prefix string, dupAt int) []error {
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := fmt.Sprintf("%s%02d", prefix, i)
				if i == dupAt {
					id = "dup"
				}
				var fences map[string]arbiter.Fence
				fences, errs[i] = b.Write(ctx, mk(id))
				if errs[i] == nil && fences["A"].Seq < 1 {
					t.Errorf("order %s: no mark of A's change: %v", id, fences)
				}
			}()
		}
		wg.Wait()
		return errs
	}

	for _, err := range writeAll("a", -1) {
		require.NoError(t, err)
	}
	require.Less(t, inserts.Load(), int64(n/2), "concurrent orders share INSERT statements")
	t.Logf("%d concurrent orders in %d INSERT statements", n, inserts.Load())

	for i, err := range writeAll("b", 17) {
		if i == 17 {
			require.True(t, arbiter.IsDuplicate(err), "the duplicate fails: %v", err)
			continue
		}
		require.NoError(t, err, "a duplicate in the batch does not fail the others (order %d)", i)
	}
	require.EqualValues(t, 2*n, r.count(`SELECT COUNT(*) FROM orders`))
	require.Zero(t, r.count(`SELECT COUNT(*) FROM order_items`), "an order's lines are its reservations: no item rows")
	require.EqualValues(t, 2*n, r.count(`SELECT COUNT(*) FROM stock_reservations WHERE state = 'HELD'`))
	require.EqualValues(t, 2*n, r.count(`SELECT reserved FROM skus WHERE sku = 'A'`), "each written order reserved its unit once")
}

// A batch whose total a SKU cannot cover is written request by request, so
// each caller gets its own answer: exactly the units there are succeed, the
// rest are refused, and an unknown SKU fails alone.
func TestBatcherRefusesPerRequest(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.addSKU("B", 10)
	b := testBatcher(t, r.db)
	raw := func(token, sku string) *Request {
		now := time.Now().UTC().Truncate(time.Microsecond)
		return &Request{Rows: []arbiter.Reservation{{Token: "t." + token, SKU: sku, Qty: 1, State: arbiter.Held,
			ExpiresAt: now.Add(time.Minute), CreatedAt: now, UpdatedAt: now}}}
	}
	const n = 24
	errs := make([]error, n+1)
	var wg sync.WaitGroup
	for i := 0; i <= n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i == n {
				_, errs[i] = b.Write(ctx, raw("ghost", "NOPE"))
				return
			}
			_, errs[i] = b.Write(ctx, raw(fmt.Sprintf("k%d", i), "B"))
		}()
	}
	wg.Wait()
	require.ErrorIs(t, errs[n], inventory.ErrUnknownSKU)
	var ok, refused int
	for _, err := range errs[:n] {
		var ref arbiter.RefusedError
		switch {
		case err == nil:
			ok++
		case errors.As(err, &ref):
			require.Equal(t, "B", ref.SKU)
			refused++
		default:
			t.Fatalf("unexpected error: %v", err)
		}
	}
	require.Equal(t, 10, ok, "exactly the units there are")
	require.Equal(t, n-10, refused)
	r.requireQty("B", 10, 10)
	require.EqualValues(t, 10, r.count(`SELECT COUNT(*) FROM stock_reservations`), "a refused request leaves no row")
}

// Two group commits run at once (writers), on the same hot SKUs and the same
// buyers' quota rows: carts of two SKUs, buyers with a per-user limit, more
// requests than stock. They overlap, nothing deadlocks into a failure, and
// the database holds exactly what it answered: every unit once, every buyer
// within the limit.
func TestBatcherConcurrentCommitsArbitrate(t *testing.T) {
	t.Run("default", func(t *testing.T) {
		r := newRig(t)
		concurrentCommits(t, r, r.db)
	})
	// A session as MariaDB 11.6.2 and later open it by default: without
	// mysqlconn.Prepare, overlapping commits fail with error 1020.
	t.Run("snapshot isolation", func(t *testing.T) {
		r := newRig(t)
		var name string
		require.NoError(t, r.db.Raw(`SELECT DATABASE()`).Scan(&name).Error)
		cfg, err := mysql.ParseDSN(testenv.MySQLDSN())
		require.NoError(t, err)
		cfg.DBName = name
		cfg.Params = map[string]string{"innodb_snapshot_isolation": "ON"}
		require.NoError(t, mysqlconn.Prepare(context.Background(), cfg))
		db, err := gorm.Open(gormmysql.Open(cfg.FormatDSN()), &gorm.Config{Logger: logger.Discard, TranslateError: true})
		require.NoError(t, err)
		sqlDB, err := db.DB()
		require.NoError(t, err)
		t.Cleanup(func() { _ = sqlDB.Close() })
		var on string
		require.NoError(t, db.Raw(`SELECT @@SESSION.innodb_snapshot_isolation`).Scan(&on).Error)
		require.Equal(t, "0", on, "Prepare keeps the classic REPEATABLE READ")
		concurrentCommits(t, r, db)
	})
}

// insertsInto reports whether the group commit's statement s inserted
// into table (it writes its rows with arbiter's InsertRows, past GORM).
func insertsInto(s rawtx.Statement, table string) bool {
	return strings.HasPrefix(s.SQL, "INSERT INTO "+table+" (")
}

func concurrentCommits(t *testing.T, r *rig, db *gorm.DB) {
	ctx := context.Background()
	r.addSKU("C", 60)
	r.addSKU("D", 1000)
	require.NoError(t, r.db.Exec(`UPDATE skus SET per_user_limit = 3 WHERE sku = 'C'`).Error)
	b := testBatcher(t, db)

	// Each batch stays a moment after its orders INSERT, so batches
	// overlap if the batcher lets them.
	var inflight, most atomic.Int64
	defer rawtx.Observe(db, func(s rawtx.Statement) {
		if insertsInto(s, "orders") {
			n := inflight.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(3 * time.Millisecond)
			inflight.Add(-1)
		}
	})()

	const n, buyers = 160, 40 // 40 buyers × limit 3 = 120 > 60 units of C
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("o%03d", i)
			expires := time.Now().UTC().Truncate(time.Microsecond).Add(time.Minute)
			// Not sorted: the group commit must order its locks itself.
			_, errs[i] = b.Write(ctx, orderWrite(id, fmt.Sprintf("u%02d", i%buyers), expires, "D", "C"))
		}()
	}
	wg.Wait()
	require.Greater(t, most.Load(), int64(1), "group commits overlap")
	require.LessOrEqual(t, most.Load(), int64(writers), "up to writers at once")

	var ok int
	for i, err := range errs {
		var ref arbiter.RefusedError
		var limit arbiter.OverLimitError
		switch {
		case err == nil:
			ok++
		case errors.As(err, &ref):
			require.Equal(t, "C", ref.SKU)
		case errors.As(err, &limit):
		default:
			t.Fatalf("order %d: unexpected error: %v", i, err)
		}
	}
	require.Equal(t, 60, ok, "exactly C's units are sold")
	r.requireQty("C", 60, 60)
	r.requireQty("D", 1000, 60)
	require.EqualValues(t, 60, r.count(`SELECT COUNT(*) FROM orders`))
	require.EqualValues(t, 120, r.count(`SELECT COUNT(*) FROM stock_reservations`))
	require.EqualValues(t, 0, r.count(`SELECT COUNT(*) FROM (SELECT user_id FROM orders GROUP BY user_id HAVING COUNT(*) > 3) x`))
	require.EqualValues(t, 60, r.count(`SELECT COALESCE(SUM(qty), 0) FROM buyer_quotas WHERE sku = 'C'`), "every buyer's quota counts what it holds")
	require.EqualValues(t, 60, r.count(`SELECT COUNT(*) FROM stock_reservations WHERE sku = 'C' AND buyer IS NOT NULL`))
}

// Deadlines in the group commit: while the hot SKU's row is locked (a
// database that does not answer), two writers' batches wait on it: one
// whose caller has a deadline ends at that deadline (an error the HTTP layer
// answers 503, nothing written), one whose caller has none waits. The callers
// queued behind them leave the queue at their deadline, nothing written.
// Once the row is free the waiting batch commits, and so does the next write.
func TestBatcherDeadlines(t *testing.T) {
	r := newRig(t)
	r.addSKU("A", 1000)
	b := testBatcher(t, r.db)
	lock := r.db.Begin()
	unlock := sync.OnceFunc(func() { require.NoError(t, lock.Rollback().Error) })
	defer unlock()
	require.NoError(t, lock.Exec(`SELECT on_hand FROM skus WHERE sku = 'A' FOR UPDATE`).Error)

	writing := func(n int) func() bool {
		return func() bool { flying, queued := b.q.Load(); return flying == n && queued == 0 }
	}
	var inFlight sync.WaitGroup
	var timedErr, patientErr error
	inFlight.Add(2)
	go func() {
		defer inFlight.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, timedErr = b.Write(ctx, oneUnitOrder("timed", "A"))
	}()
	require.Eventually(t, writing(1), 10*time.Second, time.Millisecond)
	go func() {
		defer inFlight.Done()
		_, patientErr = b.Write(context.Background(), oneUnitOrder("patient", "A"))
	}()
	require.Eventually(t, writing(2), 10*time.Second, time.Millisecond)

	const n = 10 // both writers busy: these queue
	errs := make([]error, n)
	var queued sync.WaitGroup
	for i := range n {
		queued.Add(1)
		go func() {
			defer queued.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			_, errs[i] = b.Write(ctx, oneUnitOrder(fmt.Sprintf("queued-%02d", i), "A"))
		}()
	}
	queued.Wait() // every queued caller answered, though the row is still locked
	for i, err := range errs {
		require.ErrorIs(t, err, errTooLate, "queued caller %d", i)
	}
	_, left := b.q.Load()
	require.Zero(t, left, "callers that gave up left the queue")

	require.Eventually(t, writing(1), 10*time.Second, time.Millisecond, "the timed batch ended at its deadline")
	unlock()
	inFlight.Wait()
	require.True(t, breaker.Unreachable(timedErr), "%v", timedErr)
	require.NoError(t, patientErr)

	_, err := b.Write(context.Background(), oneUnitOrder("after", "A"))
	require.NoError(t, err)
	var ids []string
	require.NoError(t, r.db.Raw(`SELECT id FROM orders ORDER BY id`).Scan(&ids).Error)
	var reservations, reserved int64
	require.NoError(t, r.db.Raw(`SELECT COUNT(*) FROM stock_reservations`).Scan(&reservations).Error)
	require.NoError(t, r.db.Raw(`SELECT reserved FROM skus WHERE sku = 'A'`).Scan(&reserved).Error)
	require.Equal(t, []string{"after", "patient"}, ids, "only the writes that were not given up exist")
	require.Equal(t, []int64{2, 2}, []int64{reservations, reserved})
}

// A full queue sheds load at once instead of piling up.
func TestBatcherQueueIsBounded(t *testing.T) {
	b := New(nil)
	release := make(chan struct{})
	b.q = batchq.New(queueConfig(), func(context.Context, []*Request) bool { <-release; return true })
	var wg sync.WaitGroup
	for range writers + maxQueued { // both writers busy, then a full queue
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = b.Write(context.Background(), &Request{})
		}()
	}
	require.Eventually(t, func() bool { flying, queued := b.q.Load(); return flying == writers && queued == maxQueued },
		10*time.Second, time.Millisecond)
	_, err := b.Write(context.Background(), &Request{})
	require.ErrorIs(t, err, errQueueFull)
	require.ErrorIs(t, err, inventory.ErrUnavailable)
	_, queued := b.q.Load()
	require.Equal(t, maxQueued, queued)
	close(release)
	wg.Wait()
}

// However slow the commits before it were (a partition, an overload), a
// request with most of its deadline left is written: the time a request
// needs left to be taken is capped, and failed commits do not count.
func TestBatcherSlowHistoryShedsNotEverything(t *testing.T) {
	r := newRig(t)
	r.addSKU("A", 10)
	b := testBatcher(t, r.db)
	b.q.SetAverage(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := b.Write(ctx, oneUnitOrder("slow", "A"))
	require.NoError(t, err)
	require.Less(t, b.q.Average(), 10*time.Second, "the successful commit moved the average")
}

// The group commit's writers send the sale's statements prepared on
// connections of their own, through the breaker's pool: after a few
// batches each text is prepared and later batches only execute it; with
// the database cut off, a writer's BEGIN fails at the caller's deadline and
// opens the breaker (which then refuses at once), and a COMMIT that goes
// unanswered is an unknown outcome, as on the pool; once the network heals
// the writers write again on fresh connections, their statements prepared
// again.
func TestBatcherWritersPrepareOnceUnderTheBreaker(t *testing.T) {
	r := newRig(t)
	r.addSKU("P", 1_000_000)
	ctx := context.Background()
	var name string
	require.NoError(t, r.db.Raw(`SELECT DATABASE()`).Scan(&name).Error)
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN())
	require.NoError(t, err)
	cfg.DBName = name
	require.NoError(t, mysqlconn.Prepare(ctx, cfg))
	link := testenv.NewLink(t, cfg.Addr)
	cfg.Addr = link.Addr()
	connector, err := mysql.NewConnector(cfg)
	require.NoError(t, err)
	sqlDB := sql.OpenDB(connector)
	t.Cleanup(func() { _ = sqlDB.Close() })
	br := breaker.New("database", breaker.Settings{Trip: 1, Open: 20 * time.Millisecond,
		Probe: func(ctx context.Context) error { return sqlDB.PingContext(ctx) }})
	db, err := gorm.Open(gormmysql.New(gormmysql.Config{Conn: br.ConnPool(sqlDB)}),
		&gorm.Config{Logger: logger.Discard, TranslateError: true})
	require.NoError(t, err)
	b := testBatcher(t, db)
	require.Len(t, b.own, writers)

	n := 0
	write := func(ctx context.Context) error {
		n++
		_, err := b.Write(ctx, oneUnitOrder(fmt.Sprintf("o%03d", n), "P"))
		return err
	}
	for range 10 {
		require.NoError(t, write(ctx))
	}
	warm := b.PreparedStats()
	require.Positive(t, warm.Prepares)
	for range 40 {
		require.NoError(t, write(ctx))
	}
	st := b.PreparedStats()
	require.Equal(t, warm.Prepares, st.Prepares, "later batches prepare nothing")
	// The first batch alone reads the SKU's limit (the writers keep it).
	require.Equal(t, 5*(warm.Executions-1)+1, st.Executions, "each batch executes as many prepared statements")
	require.Equal(t, warm.Statements, st.Statements)
	require.Zero(t, st.Texts)
	r.requireQty("P", 1_000_000, 50)

	// Cut off before a batch: its BEGIN waits for the deadline, and the
	// breaker opens.
	require.NoError(t, link.Blackhole())
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	err = write(short)
	cancel()
	require.True(t, breaker.Unreachable(err), "%v", err)
	require.Equal(t, "open", br.State())
	require.ErrorIs(t, write(ctx), breaker.ErrOpen)
	require.NoError(t, link.Heal())
	healed := func() {
		for i := 0; ; i++ {
			require.Less(t, i, 1000, "no write succeeded after the network healed")
			if err := write(ctx); err == nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	healed()

	// Cut off after the batch's last statement: its COMMIT goes unanswered.
	var cut atomic.Bool
	defer rawtx.Observe(db, func(s rawtx.Statement) {
		if strings.HasPrefix(s.SQL, "INSERT INTO stock_movements") && cut.CompareAndSwap(true, false) {
			require.NoError(t, link.Blackhole())
		}
	})()
	cut.Store(true)
	short, cancel = context.WithTimeout(ctx, 2*time.Second)
	err = write(short)
	cancel()
	require.ErrorIs(t, err, ErrUnknownOutcome)
	require.False(t, cut.Load(), "the cut came after the statements")
	require.NoError(t, link.Heal())
	healed()

	after := b.PreparedStats()
	require.Greater(t, after.Connections, st.Connections, "the failed connections were replaced")
	require.Greater(t, after.Prepares, st.Prepares, "and their statements prepared again")
	require.LessOrEqual(t, after.Statements, 2*warm.Statements)
}

// TestEmbeddedContract runs the group commit's arbitration again on the
// embedded default's SQLite.
func TestEmbeddedContract(t *testing.T) {
	embedded = true
	defer func() { embedded = false }()
	t.Run("RefusesPerRequest", TestBatcherRefusesPerRequest)
	t.Run("DuplicateInABatchIsTranslated", TestBatcherDuplicateInABatchIsTranslated)
	t.Run("ChecksTheLimitItKnows", TestBatcherChecksTheLimitItKnows)
}

// A duplicate in a batch, past GORM: the batch's transaction fails on the
// duplicate key and is written again request by request, and the caller of
// the duplicate gets the error GORM's translation gave it
// (gorm.ErrDuplicatedKey, what arbiter.IsDuplicate and the order and token
// services' replays look for; on SQLite the only sign of a duplicate),
// while the others of the batch are written.
func TestBatcherDuplicateInABatchIsTranslated(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.addSKU("T", 100)
	b := testBatcher(t, r.db)
	_, err := b.Write(ctx, oneUnitOrder("taken", "T"))
	require.NoError(t, err)
	batch := []*Request{oneUnitOrder("first", "T"), oneUnitOrder("taken", "T"), oneUnitOrder("third", "T")}
	require.False(t, b.writeBatch(ctx, batch), "the batch's own transaction failed")
	require.NoError(t, batch[0].err)
	require.NoError(t, batch[2].err)
	require.ErrorIs(t, batch[1].err, gorm.ErrDuplicatedKey, "translated as GORM did: %v", batch[1].err)
	require.True(t, arbiter.IsDuplicate(batch[1].err))
	require.False(t, batch[1].unknown)
	require.EqualValues(t, 3, r.count(`SELECT COUNT(*) FROM orders`))
	r.requireQty("T", 100, 3)
}

// The writers keep each SKU's per-user limit as they last read it and do
// not read it again: the batch's UPDATE checks the limit its quotas were
// counted under. A limit lowered under them (a PUT of the SKU from
// another node) refuses the batch counted under the old one, which runs
// again under the new one; a limit raised under them lets buyers take
// what the new limit allows. Raced by many buyers, no buyer ever holds
// more than the limit in force when the buy committed.
func TestBatcherChecksTheLimitItKnows(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.addSKU("L", 1000)
	require.NoError(t, r.db.Exec(`UPDATE skus SET per_user_limit = 3 WHERE sku = 'L'`).Error)
	b := testBatcher(t, r.db)
	expires := time.Now().UTC().Truncate(time.Microsecond).Add(time.Minute)

	// The first buy reads the limit (3) and keeps it.
	_, err := b.Write(ctx, orderWrite("a1", "u1", expires, "L"))
	require.NoError(t, err)
	known, ok := b.limits.Get("L")
	require.True(t, ok)
	require.EqualValues(t, 3, known)

	// Lowered to 1 behind the writers' back: u1 holds 1 already, so under
	// the old limit a second unit would pass; under the one in force it
	// must not.
	require.NoError(t, r.db.Exec(`UPDATE skus SET per_user_limit = 1 WHERE sku = 'L'`).Error)
	_, err = b.Write(ctx, orderWrite("a2", "u1", expires, "L"))
	var over arbiter.OverLimitError
	require.ErrorAs(t, err, &over)
	require.EqualValues(t, 1, over.Limit)
	r.requireQty("L", 1000, 1)
	require.EqualValues(t, 1, r.count(`SELECT qty FROM buyer_quotas WHERE sku = 'L' AND user_id = 'u1'`))
	known, _ = b.limits.Get("L")
	require.EqualValues(t, 1, known, "the writers learned the limit in force")

	// Raised to 4 behind their back: u1's second unit is refused under the
	// limit the writers know (1) and taken under the one in force.
	require.NoError(t, r.db.Exec(`UPDATE skus SET per_user_limit = 4 WHERE sku = 'L'`).Error)
	_, err = b.Write(ctx, orderWrite("a3", "u1", expires, "L"))
	require.NoError(t, err, "a limit raised is a limit in force")
	require.EqualValues(t, 2, r.count(`SELECT qty FROM buyer_quotas WHERE sku = 'L' AND user_id = 'u1'`))
	known, _ = b.limits.Get("L")
	require.EqualValues(t, 4, known)

	// Lowered to 3 and raised to 4 again, then buyers race: each of 20
	// buyers tries 6 single units; whatever the writers knew when, each
	// ends with exactly 4 (u1: 2 + 2).
	require.NoError(t, r.db.Exec(`UPDATE skus SET per_user_limit = 3 WHERE sku = 'L'`).Error)
	_, err = b.Write(ctx, orderWrite("a4", "u1", expires, "L"))
	require.NoError(t, err)
	require.NoError(t, r.db.Exec(`UPDATE skus SET per_user_limit = 4 WHERE sku = 'L'`).Error)
	const buyers, tries = 20, 6
	var wg sync.WaitGroup
	errs := make(chan error, buyers*tries)
	for u := range buyers {
		for k := range tries {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := b.Write(ctx, orderWrite(fmt.Sprintf("b%02d-%d", u, k), fmt.Sprintf("u%d", u+1), expires, "L"))
				if err != nil && !errors.As(err, new(arbiter.OverLimitError)) {
					errs <- err
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a buy failed otherwise than over the limit: %v", err)
	}
	require.EqualValues(t, 0, r.count(`SELECT COUNT(*) FROM buyer_quotas WHERE sku = 'L' AND qty <> 4`), "every buyer at the limit in force")
	require.EqualValues(t, buyers, r.count(`SELECT COUNT(*) FROM buyer_quotas WHERE sku = 'L'`))
	r.requireQty("L", 1000, 4*buyers)
	require.EqualValues(t, 4*buyers, r.count(`SELECT COUNT(*) FROM stock_reservations WHERE sku = 'L'`))
}
