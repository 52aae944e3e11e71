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
// 32 consecutive messages (merged into one UPDATE) against deliveries of one.
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
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"regexp"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	_ "github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/acme/inventory/migrations"
	"github.com/acme/inventory/mq"
	"github.com/acme/inventory/order"
	"github.com/acme/inventory/stock"
)

var (
	duration  = flag.Duration("duration", 5*time.Second, "how long each variant runs")
	workers   = flag.Int("workers", 64, "concurrent callers per variant")
	redisAddr = flag.String("redis", "127.0.0.1:6379", "Redis address")
	redisDB   = flag.Int("redis-db", 15, "Redis database the benchmark may flush")
	mysqlDSN  = flag.String("mysql", "inventory:inventory@tcp(127.0.0.1:3306)/", "MySQL server DSN (a database inv_bench is created)")
	out       = flag.String("out", "bench-results/results.md", "where to write the table too")
	soakFor   = flag.Duration("soak", 2*time.Minute, "how long the memory soak keeps the seckill load on (0: skip)")
	cpuProf   = flag.String("cpuprofile", "", "write a CPU profile of the HTTP phases (service and load in this process) to this file")
	only      = flag.String("only", "", `run one group only: "http" (the HTTP phases), "sync" (the ordered database sync) or "history" (the soak of -orders orders through one SKU)`)
	orders    = flag.Int("orders", 1_000_000, "with -only history: how many orders the soak drives through one SKU")
)

const hotStock = 1_000_000_000_000 // never runs out during a run

// result is one variant's measurement.
type result struct {
	name     string
	ops      int64
	elapsed  time.Duration
	p50, p99 time.Duration
	note     string
}

func (r result) rate() float64 { return float64(r.ops) / r.elapsed.Seconds() }

// run calls op from n workers for d and records each call's latency; an op
// may count several deductions (a pipeline).
func run(name string, n int, d time.Duration, op func(ctx context.Context, worker int, seq int64) (int, error)) result {
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
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: *redisAddr, DB: *redisDB, PoolSize: *workers * 2})
	must(rdb.FlushDB(ctx).Err())
	db := openMySQL(ctx)

	var results []result
	fmt.Fprintf(os.Stderr, "each variant runs %s with %d workers\n", *duration, *workers)
	switch *only {
	case "http":
		web, extra := profiled(func() ([]httpResult, string) { return seckillBench(ctx, rdb, *mysqlDSN) })
		report(nil, nil, web, extra)
		return
	case "sync":
		report(nil, []result{applyRun(ctx, db, 32), applyRun(ctx, db, 1)}, nil, "")
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

	// This project's Lua deduction.
	st, err := stock.NewStore(rdb, stock.Config{Init: fixedLevel})
	must(err)
	results = append(results, run("lua", *workers, *duration, func(ctx context.Context, w int, seq int64) (int, error) {
		_, err := st.Admit(ctx, "HOT", 1, "")
		return 1, err
	}))
	const batch = 64
	pipeWorkers := max(*workers/8, 2)
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
	results[len(results)-1].note = fmt.Sprintf("%d per round trip, %d workers; latency is per batch", batch, pipeWorkers)

	results = append(results, redisBenchmark(ctx, rdb))
	sync := []result{applyRun(ctx, db, 32), applyRun(ctx, db, 1)}
	web, extra := profiled(func() ([]httpResult, string) { return seckillBench(ctx, rdb, *mysqlDSN) })
	report(results, sync, web, extra)
}

// profiled runs fn under the CPU profiler when -cpuprofile is set.
func profiled(fn func() ([]httpResult, string)) ([]httpResult, string) {
	if *cpuProf == "" {
		return fn()
	}
	f, err := os.Create(*cpuProf)
	must(err)
	defer f.Close()
	must(pprof.StartCPUProfile(f))
	defer pprof.StopCPUProfile()
	return fn()
}

// openDatabase creates (if needed) and opens database name on the server.
func openDatabase(ctx context.Context, dsnBase, name string) *sql.DB {
	admin, err := sql.Open("mysql", dsnBase)
	must(err)
	_, err = admin.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS "+name)
	must(err)
	_ = admin.Close()
	db, err := sql.Open("mysql", strings.TrimSuffix(dsnBase, "/")+"/"+name+"?parseTime=true")
	must(err)
	db.SetMaxOpenConns(*workers)
	db.SetMaxIdleConns(*workers)
	return db
}

// resetSchema drops the service's tables and migrates them again.
func resetSchema(ctx context.Context, db *sql.DB) {
	for _, t := range []string{"stock_ledger", "stock_reservations", "stock_anomalies", "goose_db_version", "stock_movements",
		"buyer_quotas", "stock_outbox", "order_items", "orders", "skus"} {
		must(exec1(db, "DROP TABLE IF EXISTS "+t))
	}
	must(migrations.Up(ctx, db, migrations.MySQL))
}

// applyRun feeds the applier deliveries of size consecutive DEDUCT messages
// of one SKU for the configured duration, as the orderly consumer does (one
// queue, one delivery at a time).
func applyRun(ctx context.Context, db *sql.DB, size int) result {
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
	ap := order.NewApplier(gdb, slog.New(slog.DiscardHandler))
	var seq int64
	name := fmt.Sprintf("sync-merged-%d", size)
	if size == 1 {
		name = "sync-per-message"
	}
	r := run(name, 1, *duration, func(ctx context.Context, _ int, _ int64) (int, error) {
		msgs := make([]mq.Message, size)
		for i := range msgs {
			seq++
			body, _ := json.Marshal(order.StockMessage{Token: fmt.Sprintf("o%d", seq), SKU: "HOT", Op: order.OpDeduct, Qty: 1})
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
	must(stock.LoadDeductScript(ctx, rdb))
	must(rdb.HSet(ctx, "inv:{RB}:stock", "a", hotStock, "e", 1, "s", 0).Err())
	n := int(2_000_000 * duration.Seconds() / 5)
	keys := stock.DeductKeys("RB")
	args := append([]string{"-h", strings.Split(*redisAddr, ":")[0], "-p", strings.Split(*redisAddr, ":")[1],
		"--dbnum", strconv.Itoa(*redisDB), "-n", strconv.Itoa(n), "-c", "50", "-P", "64", "-r", "100000000", "-q",
		"EVALSHA", stock.DeductScriptSHA(), strconv.Itoa(len(keys))}, keys...)
	args = append(args, "1", "0")
	cmd := exec.CommandContext(ctx, "redis-benchmark", args...)
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
	return r
}

func lastLine(s string) string {
	s = strings.TrimSpace(strings.ReplaceAll(s, "\r", "\n"))
	lines := strings.Split(s, "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func report(rs, sync []result, web []httpResult, extra string) {
	byName := map[string]result{}
	var b strings.Builder
	fmt.Fprintf(&b, "| variant | deductions/s | p50 | p99 | notes |\n|---|---:|---:|---:|---|\n")
	maxRate := 0.0
	for _, r := range rs {
		byName[r.name] = r
		maxRate = math.Max(maxRate, r.rate())
	}
	for _, r := range rs {
		fmt.Fprintf(&b, "| %s | %.0f | %s | %s | %s |\n", r.name, r.rate(), dur(r.p50), dur(r.p99), r.note)
	}
	ratio := func(a, c string) float64 { return byName[a].rate() / byName[c].rate() }
	fmt.Fprintf(&b, "\n| ratio | measured | target |\n|---|---:|---:|\n")
	fmt.Fprintf(&b, "| lua / redis-lock | %.1f× | ≥ 10× |\n", ratio("lua", "redis-lock"))
	fmt.Fprintf(&b, "| lua / mysql-hot-row | %.1f× | ≥ 5× |\n", ratio("lua", "mysql-hot-row"))
	fmt.Fprintf(&b, "| lua-pipelined / redis-benchmark | %.0f%% | ≥ 50%% |\n", 100*ratio("lua-pipelined", "redis-benchmark"))
	if len(sync) == 2 {
		fmt.Fprintf(&b, "| sync merged / one UPDATE per message | %.1f× | ≥ 5× |\n", sync[0].rate()/sync[1].rate())
	}
	if len(web) >= 4 {
		fmt.Fprintf(&b, "| seckill selling / bare handler | %.0f%% | ≥ 80%% |\n", 100*web[1].rate/web[0].rate)
		fmt.Fprintf(&b, "| seckill sold out / bare handler | %.1f× | ≥ 2× |\n", web[2].rate/web[0].rate)
	}
	if len(sync) == 2 {
		fmt.Fprintf(&b, "\n| ordered database sync | operations/s | p50 | p99 | notes |\n|---|---:|---:|---:|---|\n")
		for _, r := range sync {
			fmt.Fprintf(&b, "| %s | %.0f | %s | %s | %s |\n", r.name, r.rate(), dur(r.p50), dur(r.p99), r.note)
		}
	}
	if len(web) >= 4 {
		fmt.Fprintf(&b, "\n| HTTP, %d clients | requests/s | p50 | p99 | answers | notes |\n|---|---:|---:|---:|---|---|\n", *workers)
		for _, r := range web {
			fmt.Fprintf(&b, "| %s | %.0f | %s | %s | %v | %s |\n", r.name, r.rate, dur(r.p50), dur(r.p99), r.codes, r.note)
		}
	}
	b.WriteString(extra)
	fmt.Fprintf(&b, "\n```\n")
	for _, r := range rs {
		bar := int(40 * r.rate() / maxRate)
		fmt.Fprintf(&b, "%-16s %s %.0f/s\n", r.name, strings.Repeat("█", max(bar, 1)), r.rate())
	}
	fmt.Fprintf(&b, "```\n")
	fmt.Print(b.String())
	if *out != "" {
		_ = os.MkdirAll("bench-results", 0o755)
		f, err := os.Create(*out)
		if err == nil {
			_, _ = io.WriteString(f, fmt.Sprintf("# make bench, %s, %d workers, %s per variant\n\n", time.Now().UTC().Format(time.RFC3339), *workers, *duration)+b.String())
			_ = f.Close()
		}
	}
}

func dur(d time.Duration) string {
	if d == 0 {
		return "–"
	}
	return d.Round(10 * time.Microsecond).String()
}

func openMySQL(ctx context.Context) *sql.DB { return openDatabase(ctx, *mysqlDSN, "inv_bench") }

func exec1(db *sql.DB, q string, args ...any) error {
	_, err := db.Exec(q, args...)
	return err
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
}

// fixedLevel initialises every SKU with hotStock units (the Redis-only variants).
func fixedLevel(_ context.Context, _ string, write func(stock.Level) error) error {
	return write(stock.Level{Available: hotStock, Epoch: 1})
}
