// Command benchtable measures, side by side in one run on one machine, what a
// deduction of one hot SKU costs done five ways, and prints a table of
// throughput, latency and the ratios docs/SPEC.md section 7 sets targets for:
//
//	mysql-hot-row     UPDATE hot_row SET stock = stock - 1 WHERE sku = ? AND stock >= 1
//	redis-lock        lock (SET NX PX), GET, SET, compare-and-delete unlock
//	lua               this project's deduction: one EVALSHA per request (stock.Store.Admit)
//	lua-pipelined     the same script, 64 deductions per round trip (stock.Store.AdmitMany)
//	redis-benchmark   redis-benchmark running the same script by EVALSHA, -P 64 (the ceiling)
//
// and the ordered database sync of one hot SKU: the applier fed deliveries of
// 32 consecutive messages (merged into one UPDATE) against deliveries of one;
// then the HTTP phases of the real service (see seckill.go), a campaign's
// openings (campaign.go) and the selling phase with a webhook subscription
// beside none (webhooks.go).
//
// Before the lua variant the hot SKU sells a million units, and each Redis
// variant's window reports the server's own time per EVALSHA of the script
// (redisstats.go). Every phase's CPU time per process is sampled from /proc
// (cpu.go); the table marks each target of SPEC section 7 met or missed, and
// comes with a chart (chart.go) and, when a target is missed, the top of the
// HTTP phases' CPU profile. A progress bar runs on stderr (progress.go).
//
// It needs the servers of `make up`.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/mysqlconn"
	"github.com/acme/inventory/internal/stocksync"
	"github.com/acme/inventory/migrations"
	"github.com/acme/inventory/mq"
	"github.com/acme/inventory/stock"
	"github.com/acme/inventory/testkit/redislease"
)

var (
	duration  = flag.Duration("duration", 5*time.Second, "how long each variant runs")
	workers   = flag.Int("workers", 64, "concurrent callers per variant")
	redisAddr = flag.String("redis", "127.0.0.1:6379", "Redis address")
	redisDB   = flag.Int("redis-db", redislease.BenchDB, "Redis database the benchmark flushes (at its start and its end): by default the one no test process is handed (testkit/redislease)")
	mysqlDSN  = flag.String("mysql", "inventory:inventory@tcp(127.0.0.1:3306)/", "MySQL server DSN (the run creates its databases there, see -db-prefix)")
	dbPrefix  = flag.String("db-prefix", benchPrefix, "names of the MySQL databases the benchmark resets and drops when it ends (PREFIX, PREFIX_http, PREFIX_campaign, ...): with -redis-db, another prefix keeps two runs on one machine from resetting each other's")
	out       = flag.String("out", "bench-results/results.md", "where to write the table too (its chart goes beside it, as .png)")
	soakFor   = flag.Duration("soak", 2*time.Minute, "how long the memory soak keeps the seckill load on (0: skip)")
	churnN    = flag.Int("churn", 1000, "with the soak (and in -only history): how many campaigns the campaign churn creates, sells and ends, counting Redis keys before and after (0: skip)")
	cpuProf   = flag.String("cpuprofile", "", "write a CPU profile of the HTTP phases (service and load in this process) to this file")
	profPhase = flag.String("cpuprofile-phases", "", "with -cpuprofile: profile only the HTTP phases whose name this regular expression matches (e.g. 'selling|soak'); empty: all of them")
	only      = flag.String("only", "", `run one group only: "http" (the HTTP phases), "campaign" (a campaign's openings and the hold extensions), "webhooks" (the seckill selling phase with one webhook subscription beside none, and a 2,000-unit sale's sku.sold_out), "sync" (the ordered database sync), "dbcost" (the database's cost of a sale, statement by statement), "lean" (the classic and the lean sale side by side, each way's phases on a node of its own) or "history" (the soak of -orders orders through one SKU)`)
	projectOn = flag.Bool("projector", true, `false, with -only http: this process holds the projector's leader lock, so no node projects the lean sale's holds during the run: the HTTP phases as if the projection cost nothing (a bound on what any projection could reach, not the product; the projection lag is then not measured)`)
	leanSale  = flag.String("lean-sale", "", `"on" or "off": the service's sale lean or classic (INVENTORY_LEAN_SALE) in every group that runs it; empty: the service's default`)
	orders    = flag.Int("orders", 1_000_000, "with -only history: how many orders the soak drives through one SKU")
)

const hotStock = 1_000_000_000_000 // never runs out during a run

// benchPrefix is the default -db-prefix: no test makes a database of that
// name (testenv's are testenv.DatabasePrefix's), so a run and the tests
// never reset or drop each other's.
const benchPrefix = "benchtable"

// result is one variant's measurement.
type result struct {
	name     string
	ops      int64
	calls    int64 // calls of op (a pipeline is one)
	elapsed  time.Duration
	p50, p99 time.Duration
	note     string
}

func (r result) rate() float64 { return float64(r.ops) / r.elapsed.Seconds() }

// run calls op from n workers for d and records each call's latency; an op
// may count several deductions (a pipeline).
func run(name string, n int, d time.Duration, op func(ctx context.Context, worker int, seq int64) (int, error)) result {
	prog.phase(name)
	defer measureCPU(name)()
	ctx := context.Background()
	var total atomic.Int64
	var failed atomic.Int64
	lat := make([][]time.Duration, n)
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := int64(0); time.Now().Before(stop); seq++ {
				t0 := time.Now()
				k, err := op(ctx, w, seq)
				lat[w] = append(lat[w], time.Since(t0))
				if err != nil {
					failed.Add(1)
					continue
				}
				total.Add(int64(k))
			}
		}()
	}
	wg.Wait()
	r := result{name: name, ops: total.Load(), elapsed: time.Since(start)}
	all := slices.Concat(lat...)
	r.calls = int64(len(all))
	slices.Sort(all)
	if len(all) > 0 {
		r.p50, r.p99 = all[len(all)/2], all[len(all)*99/100]
	}
	if f := failed.Load(); f > 0 {
		r.note = fmt.Sprintf("%d failed calls", f)
	}
	return r
}

func main() {
	flag.Parse()
	if *leanSale != "" && *leanSale != "on" && *leanSale != "off" {
		fmt.Fprintf(os.Stderr, "benchtable: -lean-sale is \"on\", \"off\" or empty, not %q\n", *leanSale)
		os.Exit(2)
	}
	if !*projectOn && *only != "http" {
		fmt.Fprintln(os.Stderr, "benchtable: -projector=false is for -only http (the other groups wait for the projection)")
		os.Exit(2)
	}
	if *openChildF {
		openChild() // an open-loop generator's process (openloop.go)
		return
	}
	ctx := context.Background()
	// However the run ends (here, a failure, an interrupt): its databases
	// dropped, its Redis database flushed, then its lease released.
	defer end()
	endOnInterrupt()
	// The test processes lease other databases of the same Redis
	// (redislease) and flush theirs; the bench's is none of them, and it
	// holds its own as they do all the same (another run, a -redis-db of
	// the tests' range: each waits for the other).
	lease, ok, err := redislease.TryHold(*redisAddr, *redisDB)
	must(err)
	if !ok {
		fmt.Fprintf(os.Stderr, "Redis database %d is held by a test process or another run: waiting for it (-redis-db picks another)\n", *redisDB)
		lease, err = redislease.Hold(*redisAddr, *redisDB)
		must(err)
	}
	atEnd(lease.Release)
	rdb := redis.NewClient(&redis.Options{Addr: *redisAddr, DB: *redisDB, PoolSize: *workers * 2})
	must(rdb.FlushDB(ctx).Err())
	atEnd(func() {
		fctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := rdb.FlushDB(fctx).Err(); err != nil {
			fmt.Fprintln(os.Stderr, "benchtable: flushing the run's Redis database:", err)
		}
	})
	dropScratchAtEnd()
	db := openMySQL(ctx)

	if *external && (*only == "" || *only == "http") {
		must(externalTools()) // the honest-load-generator check's tools, before minutes of measuring
	}
	var results []result
	fmt.Fprintf(os.Stderr, "each variant runs %s with %d workers; load average %s\n", *duration, *workers, loadAverage())
	if *only != "history" {
		prog = startProgress(plan(*only))
	}
	switch *only {
	case "http":
		report(nil, nil, profiled(func() webRun { return seckillBench(ctx, rdb, *mysqlDSN) }))
		return
	case "campaign":
		report(nil, nil, profiledAt(campaignProfile(), func() webRun { return webRun{camp: campaignBench(ctx, rdb, *mysqlDSN)} }))
		return
	case "webhooks":
		report(nil, nil, webRun{hooks: webhooksBench(ctx, rdb, *mysqlDSN)})
		return
	case "dbcost":
		table := dbCost(ctx, *mysqlDSN)
		prog.finish()
		fmt.Print(table)
		must(os.MkdirAll(dirOf(*out), 0o755))
		must(os.WriteFile(strings.TrimSuffix(*out, ".md")+"-dbcost.md", []byte(table), 0o644))
		return
	case "sync":
		report(nil, []result{applyRun(ctx, db, 32), applyRun(ctx, db, 1)}, webRun{})
		return
	case "counts":
		countsBench(ctx, rdb, *mysqlDSN)
		return
	case "lean":
		table := leanBench(ctx, rdb, *mysqlDSN)
		prog.finish()
		fmt.Print(table)
		must(os.MkdirAll(dirOf(*out), 0o755))
		must(os.WriteFile(strings.TrimSuffix(*out, ".md")+"-lean.md", []byte(table), 0o644))
		return
	case "history":
		table := historySoak(ctx, rdb, *mysqlDSN, *orders)
		fmt.Print(table)
		must(os.WriteFile(strings.TrimSuffix(*out, ".md")+"-history.md", []byte(table), 0o644))
		return
	}

	// MySQL hot row.
	// A table of its own: the sync variants below migrate the service's skus.
	must(exec1(db, `CREATE TABLE IF NOT EXISTS hot_row (sku VARCHAR(64) PRIMARY KEY, stock BIGINT NOT NULL) ENGINE=InnoDB`))
	must(exec1(db, `REPLACE INTO hot_row (sku, stock) VALUES ('HOT', ?)`, hotStock))
	results = append(results, run("mysql-hot-row", *workers, *duration, func(ctx context.Context, _ int, _ int64) (int, error) {
		res, err := db.ExecContext(ctx, `UPDATE hot_row SET stock = stock - 1 WHERE sku = 'HOT' AND stock >= 1`)
		if err != nil {
			return 0, err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return 0, errors.New("sold out")
		}
		return 1, nil
	}))

	// Redis lock + GET/SET.
	must(rdb.Set(ctx, "bench:{lock}:stock", hotStock, 0).Err())
	locker := redislock.New(rdb)
	retry := redislock.LinearBackoff(time.Millisecond)
	results = append(results, run("redis-lock", *workers, *duration, func(ctx context.Context, _ int, _ int64) (int, error) {
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		l, err := locker.Obtain(lctx, "bench:{lock}:mutex", time.Second, &redislock.Options{RetryStrategy: retry})
		if err != nil {
			return 0, err
		}
		defer l.Release(ctx)
		n, err := rdb.Get(ctx, "bench:{lock}:stock").Int64()
		if err != nil || n < 1 {
			return 0, errors.New("sold out")
		}
		return 1, rdb.Set(ctx, "bench:{lock}:stock", n-1, 0).Err()
	}))

	// This project's Lua deduction, on a SKU that has sold a million units,
	// with the server's own time per call measured over each window.
	st, err := stock.NewStore(rdb, stock.Config{Init: fixedLevel, OneCallPerAdmission: true})
	must(err)
	const batch = 64
	pipeWorkers := max(*workers/8, 2)
	must(st.EnsureInit(ctx, "HOT"))
	firstMillion(ctx, rdb, st, "HOT", pipeWorkers)
	resetCommandStats(ctx, rdb)
	results = append(results, run("lua", *workers, *duration, func(ctx context.Context, w int, seq int64) (int, error) {
		_, err := st.Admit(ctx, "HOT", 1, "")
		return 1, err
	}))
	lua := results[len(results)-1]
	readServerCost(ctx, rdb, lua.name, lua.calls, lua.rate())
	resetCommandStats(ctx, rdb)
	results = append(results, run("lua-pipelined", pipeWorkers, *duration, func(ctx context.Context, w int, seq int64) (int, error) {
		reqs := make([]stock.Request, batch)
		for i := range reqs {
			reqs[i] = stock.Request{SKU: "HOT", Qty: 1}
		}
		for _, r := range st.AdmitMany(ctx, reqs) {
			if r.Err != nil {
				return 0, r.Err
			}
		}
		return batch, nil
	}))
	piped := &results[len(results)-1]
	piped.note = fmt.Sprintf("%d per round trip, %d workers; latency is per batch", batch, pipeWorkers)
	readServerCost(ctx, rdb, piped.name, piped.calls*batch, piped.rate())

	results = append(results, redisBenchmark(ctx, rdb))
	sync := []result{applyRun(ctx, db, 32), applyRun(ctx, db, 1)}
	web := profiled(func() webRun { return seckillBench(ctx, rdb, *mysqlDSN) })
	web.camp = profiledAt(campaignProfile(), func() webRun { return webRun{camp: campaignBench(ctx, rdb, *mysqlDSN)} }).camp
	web.hooks = webhooksBench(ctx, rdb, *mysqlDSN) // profiles its phases itself, beside -cpuprofile
	web.extra += leanBench(ctx, rdb, *mysqlDSN)
	// What the database's CPU per sale is made of, statement by statement,
	// beside the floor: the same run's account of the sale's cost in MariaDB.
	web.dbcost = dbCost(ctx, *mysqlDSN)
	report(results, sync, web)
}

// openDatabase creates (if needed) and opens database name on the server:
// the run's scratch, dropped when the run ends (scratch.go).
func openDatabase(ctx context.Context, dsnBase, name string) *sql.DB {
	noteScratch(dsnBase, name)
	admin, err := sql.Open("mysql", dsnBase)
	must(err)
	_, err = admin.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS "+name)
	must(err)
	_ = admin.Close()
	cfg, err := mysql.ParseDSN(dsnBase)
	must(err)
	cfg.DBName = name
	must(mysqlconn.Prepare(ctx, cfg)) // the sessions the service runs
	db, err := sql.Open("mysql", cfg.FormatDSN())
	must(err)
	db.SetMaxOpenConns(*workers)
	db.SetMaxIdleConns(*workers)
	return db
}

// resetSchema drops every table of the bench's database (whatever version
// of the schema made them) and migrates again.
func resetSchema(ctx context.Context, db *sql.DB) {
	rows, err := db.QueryContext(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()`)
	must(err)
	var tables []string
	for rows.Next() {
		var t string
		must(rows.Scan(&t))
		tables = append(tables, t)
	}
	must(rows.Err())
	must(rows.Close())
	for _, t := range tables {
		must(exec1(db, "DROP TABLE IF EXISTS `"+t+"`"))
	}
	must(migrations.Up(ctx, db, migrations.MySQL))
}

// applyRun feeds the applier deliveries of size consecutive DEDUCT messages
// of one SKU for the configured duration, as the orderly consumer does (one
// queue, one delivery at a time).
func applyRun(ctx context.Context, db *sql.DB, size int) result {
	name := fmt.Sprintf("sync-merged-%d", size)
	if size == 1 {
		name = "sync-per-message"
	}
	prog.phase(name)
	gdb, err := gorm.Open(gormmysql.New(gormmysql.Config{Conn: db}), &gorm.Config{Logger: logger.Discard, TranslateError: true})
	must(err)
	resetSchema(ctx, db)
	// Every DEDUCT needs a COMMITTED reservation: more than a run can apply
	// (a run that outruns them says so in its note), written before the clock
	// starts, and then a pause so InnoDB's background flushing of them does
	// not share the measured seconds.
	perSecond := 2_000
	if size > 1 {
		perSecond = 25_000
	}
	committed := int(float64(perSecond) * duration.Seconds())
	must(exec1(db, `INSERT INTO skus (sku, on_hand, reserved) VALUES ('HOT', ?, ?)`, hotStock, committed))
	must(exec1(db, fmt.Sprintf(`INSERT INTO stock_reservations (token, sku, qty, state, expires_at)
		SELECT CONCAT('o', seq), 'HOT', 1, 'COMMITTED', NOW() FROM seq_1_to_%d`, committed)))
	time.Sleep(3 * time.Second)
	ap := stocksync.NewApplier(gdb, slog.New(slog.DiscardHandler))
	var seq int64
	r := run(name, 1, *duration, func(ctx context.Context, _ int, _ int64) (int, error) {
		msgs := make([]mq.Message, size)
		for i := range msgs {
			seq++
			body, _ := json.Marshal(arbiter.StockMessage{Token: fmt.Sprintf("o%d", seq), SKU: "HOT", Op: arbiter.OpDeduct, Qty: 1})
			msgs[i] = mq.Message{Key: "HOT", Body: body}
		}
		return size, ap.Handle(ctx, msgs)
	})
	if applied := ap.Applied.Load(); applied != r.ops {
		r.note = fmt.Sprintf("applied %d of %d", applied, r.ops)
	} else {
		r.note = "one SKU, one queue; latency per delivery"
	}
	return r
}

// redisBenchmark runs redis-benchmark on the same script (as an order line
// calls it, deep pipelining): the ceiling of what this Redis can do with it.
func redisBenchmark(ctx context.Context, rdb *redis.Client) result {
	prog.phase("redis-benchmark")
	defer measureCPU("redis-benchmark")()
	must(stock.LoadDeductScript(ctx, rdb))
	must(rdb.HSet(ctx, "inv:{RB}:stock", "a", hotStock, "e", 1, "s", 0).Err())
	n := int(2_000_000 * duration.Seconds() / 5)
	keys := stock.DeductKeys("RB")
	args := append([]string{"-h", strings.Split(*redisAddr, ":")[0], "-p", strings.Split(*redisAddr, ":")[1],
		"--dbnum", strconv.Itoa(*redisDB), "-n", strconv.Itoa(n), "-c", "50", "-P", "64", "-r", "100000000", "-q",
		"EVALSHA", stock.DeductScriptSHA(), strconv.Itoa(len(keys))}, keys...)
	args = append(args, "1", "0")
	cmd := exec.CommandContext(ctx, "redis-benchmark", args...)
	resetCommandStats(ctx, rdb)
	outb, err := cmd.CombinedOutput()
	if err != nil {
		return result{name: "redis-benchmark", note: "not run: " + err.Error()}
	}
	// -q prints "EVALSHA ...: 123456.78 requests per second, p50=0.123 msec"
	m := regexp.MustCompile(`([0-9.]+) requests per second(?:, p50=([0-9.]+) msec)?`).FindStringSubmatch(lastLine(string(outb)))
	if m == nil {
		return result{name: "redis-benchmark", note: "unparsed output: " + lastLine(string(outb))}
	}
	rps, _ := strconv.ParseFloat(m[1], 64)
	r := result{name: "redis-benchmark", ops: int64(rps * 10), elapsed: 10 * time.Second,
		note: fmt.Sprintf("%d EVALSHA, 50 clients, -P 64 (its own client, no Go); p50 per pipelined batch", n)}
	if m[2] != "" {
		p50, _ := strconv.ParseFloat(m[2], 64)
		r.p50 = time.Duration(p50 * float64(time.Millisecond))
	}
	readServerCost(ctx, rdb, r.name, int64(n), rps)
	return r
}

func lastLine(s string) string {
	s = strings.TrimSpace(strings.ReplaceAll(s, "\r", "\n"))
	lines := strings.Split(s, "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func dur(d time.Duration) string {
	if d == 0 {
		return "–"
	}
	return d.Round(10 * time.Microsecond).String()
}

func openMySQL(ctx context.Context) *sql.DB { return openDatabase(ctx, *mysqlDSN, *dbPrefix) }

func exec1(db *sql.DB, q string, args ...any) error {
	_, err := db.Exec(q, args...)
	return err
}

// must ends the run (its databases dropped, see scratch.go) when err is
// one.
func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		exit(1)
	}
}

// fixedLevel initialises every SKU with hotStock units (the Redis-only variants).
func fixedLevel(_ context.Context, _ string, write func(inventory.Baseline) error) error {
	return write(inventory.Baseline{Available: hotStock, Epoch: 1})
}
