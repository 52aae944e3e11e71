package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/app"
	"github.com/acme/inventory/internal/identity"
	"github.com/acme/inventory/internal/lock"
	"github.com/acme/inventory/mq"
	"github.com/acme/inventory/stock"
)

// httpResult is one HTTP phase: requests answered per second by status.
type httpResult struct {
	name     string
	rate     float64
	p50, p99 time.Duration
	dist     latencyDist // the latency distribution (p50 and p99 are its)
	codes    map[int]int64
	rows     int64 // the floor's committed rows (it answers no HTTP)
	note     string
}

// answers is how many requests the phase answered (any status), or the
// floor's committed rows.
func (r httpResult) answers() int64 {
	n := r.rows
	for code, k := range r.codes {
		if code > 0 {
			n += k
		}
	}
	return n
}

// answersCell is the phase's answers for the table: by status, or rows.
func (r httpResult) answersCell() string {
	if r.codes == nil {
		return fmt.Sprintf("%d rows committed", r.rows)
	}
	return fmt.Sprint(r.codes)
}

// pairRounds is how many bare/sold-out pairs the HTTP group measures.
const pairRounds = 3

// cartBarePhase is the bare handler's phase paired with the cart's.
const cartBarePhase = "bare net/http + EVALSHA, before the cart"

// floorWriters is how many of the floor's commits may be in flight at
// once: as many as the service's group commit (order/batch.go, writers).
const floorWriters = 2

// webRun is what the HTTP group measured.
type webRun struct {
	phases   []httpResult
	bare     []float64 // the bare handler's rate in each pair, in order
	soldOut  []float64 // the sold-out phase's rate in each pair
	selling  float64   // the selling phase's rate (paired with bare[0])
	cartBare float64   // the bare handler's rate just before the cart phase
	cart     float64   // the 2-line cart phase's rate (paired with cartBare)
	oversell int64     // orders of the 2000-unit SKU beyond its stock
	lag      lagStats
	// projection is the lean sale's projection lag over the selling
	// phase's holds (lean false: the service ran classic).
	projection projLag
	soak       soakStats
	extra      string       // the lag and soak tables
	dbcost     string       // the database's cost of a sale, statement by statement (the full run)
	camp       *campaignRun // the campaign group (nil: not run)
	churn      *churnRun    // the campaign churn after the soak (nil: not run)
	hooks      *hooksRun    // the webhooks group (nil: not run)
	arrival    *arrivalRun  // latency under an arrival rate, and the other load generators (nil: not run)
}

// lagStats is the sync lag through RocketMQ (applied 0: nothing applied).
type lagStats struct {
	applied int
	p99     time.Duration
}

// soakStats is the heap in use under the soak (samples 0: no soak).
type soakStats struct {
	samples           int
	firstHalf, second float64 // mean heap in use, MiB, of each half of the samples
}

// growth is the heap's growth from the soak's first half to its second.
func (s soakStats) growth() float64 { return s.second/s.firstHalf - 1 }

// load posts to url from n clients for d, each on its own keep-alive
// connection (rawClient); header gives each client's headers (its
// credentials), body makes each request's body. With record false it
// keeps no per-request latencies (the soak measures the process's memory,
// which must not include its own bookkeeping).
func load(name, url string, n int, d time.Duration, header func(w int) http.Header, body func(w int, seq int64) string, record ...bool) httpResult {
	return loadEach(name, func(int) string { return url }, n, d, header, body, record...)
}

// loadEach is load with each client posting to a URL of its own (url(w)).
func loadEach(name string, url func(w int) string, n int, d time.Duration, header func(w int) http.Header, body func(w int, seq int64) string, record ...bool) httpResult {
	keep := len(record) == 0 || record[0]
	prog.phase(name)
	defer measureCPU(name)()
	defer profilePhase(name)()
	var mu sync.Mutex
	codes := map[int]int64{}
	lat := make([][]time.Duration, n)
	var total atomic.Int64
	stop := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := map[int]int64{}
			h := header(w)
			h.Set("Content-Type", "application/json")
			c := newRawClient(url(w), h, 10*time.Second)
			defer c.Close()
			for seq := int64(0); time.Now().Before(stop); seq++ {
				t0 := time.Now()
				status, err := c.post(body(w, seq))
				if err != nil {
					local[-1]++
					continue
				}
				if keep {
					lat[w] = append(lat[w], time.Since(t0))
				}
				local[status]++
				total.Add(1)
			}
			mu.Lock()
			for k, v := range local {
				codes[k] += v
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	r := httpResult{name: name, rate: float64(total.Load()) / time.Since(start).Seconds(), codes: codes}
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) > 0 {
		r.p50, r.p99 = all[len(all)/2], all[len(all)*99/100]
		r.dist = distribution(all)
	}
	return r
}

// The bench service's secrets (random enough for the service's checks).
const (
	benchAdmin    = "bench-admin-7c1e9a3f5b2d4e6a8c0f1b3d5e7a9c2b"
	benchClient   = "bench-client-2b4d6f8a0c1e3a5c7e9b1d3f5a7c9e0b"
	benchPayment  = "bench-payment-9e7c5a3b1d0f8e6c4a2b0d9f7e5c3a1b"
	benchBuyerKey = "bench-buyers-4f6a8c0e2b4d6f8a1c3e5b7d9f0a2c4e"
)

// credentials are the headers of buyer prefix+w's requests: the client
// credential and the buyer token the storefront signs for that buyer.
func credentials(prefix string, w int) http.Header {
	tok, err := identity.Issue(benchBuyerKey, fmt.Sprintf("%s%d", prefix, w), 24*time.Hour)
	must(err)
	return http.Header{"Authorization": {"Bearer " + benchClient}, identity.Header: {tok}}
}

// startService starts the real service in this process (real mode: Redis,
// MySQL, RocketMQ) on a flushed Redis database, a fresh MySQL database dbName
// (returned open, for the caller's checks) and a topic of its own; tweak
// changes the configuration before it is checked.
func startService(ctx context.Context, rdb *redis.Client, dsnBase, dbName string, tweak ...func(*app.Config)) (*app.App, *sql.DB) {
	must(rdb.FlushDB(ctx).Err())
	if !*projectOn { // the projector's leader lock, held for the run (the run flushes the database at its end)
		must(rdb.Set(ctx, lock.ProjectorKey, "benchtable -projector=false", 0).Err())
	}
	db := openDatabase(ctx, dsnBase, dbName)
	resetSchema(ctx, db)
	topic := fmt.Sprintf("bench_%d", time.Now().UnixNano())
	must(mq.CreateTopic(ctx, []string{"127.0.0.1:9876"}, "127.0.0.1:10911", topic, 8))
	cfg := app.Config{
		HTTPAddr: "127.0.0.1:0", RedisURL: fmt.Sprintf("redis://%s/%d", *redisAddr, *redisDB),
		MySQLDSN: strings.TrimSuffix(dsnBase, "/") + "/" + dbName, RocketMQNamesrv: []string{"127.0.0.1:9876"},
		RocketMQTopic: topic, AdminToken: benchAdmin, PaymentSecret: benchPayment,
		ClientTokens: []string{benchClient}, BuyerKey: benchBuyerKey,
		OrderTTL: 15 * time.Minute, SeckillRate: 1e9, ShutdownTimeout: 10 * time.Second, InstanceName: topic,
	}
	cfg.LeanSale = app.Defaults().LeanSale
	if *leanSale != "" {
		cfg.LeanSale = *leanSale == "on"
	}
	for _, t := range tweak {
		t(&cfg)
	}
	must(cfg.Validate())
	a, err := app.New(ctx, cfg, slog.New(slog.DiscardHandler))
	must(err)
	must(a.Start(ctx))
	return a, db
}

// bareHandler serves the bare handler: one EVALSHA of the same script per
// request, through go-redis. It returns its URL and what stops it.
func bareHandler(rdb *redis.Client) (string, func()) {
	bare, err := stock.NewStore(rdb, stock.Config{Init: fixedLevel, OneCallPerAdmission: true})
	must(err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		adm, err := bare.Admit(r.Context(), "BARE", 1, "")
		if err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"result":%d}`, adm.Remaining)
	})}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String() + "/", func() { _ = srv.Close() }
}

// seckillBench runs the real service in this process (real mode: Redis,
// MySQL, RocketMQ) and a bare net/http handler doing one EVALSHA through
// go-redis, and loads both alike.
func seckillBench(ctx context.Context, rdb *redis.Client, dsnBase string) webRun {
	prog.phase("http setup")
	a, db := startService(ctx, rdb, dsnBase, *dbPrefix+"_http")
	_ = db.Close()
	defer a.Shutdown(context.Background())
	for sku, n := range map[string]int64{"FLASH": 1_000_000_000, "GONE": 0, "SALE": 2000, "CART-A": 1_000_000_000, "CART-B": 1_000_000_000} {
		_, err := a.Catalog.Put(ctx, sku, n, 0)
		must(err)
	}
	base := "http://" + a.Addr()

	bareURL, stopBare := bareHandler(rdb)
	defer stopBare()

	// Each client is one buyer (no SKU here has a per-user limit) with the
	// client credential and the buyer token a storefront signs; the bare
	// handler is sent the same headers, so both cost the client alike.
	buyer := func(prefix string) func(w int) http.Header {
		return func(w int) http.Header { return credentials(prefix, w) }
	}
	empty := func(int, int64) string { return `{}` }
	// The ratios to the bare handler are judged on pairs measured back to
	// back (bare, then the phase), so a stretch of a noisy machine lands on
	// both sides of a ratio: the sold-out ratio on pairRounds pairs (the
	// median), the selling ratio on the first pair.
	round := func(name string, i int) string { return fmt.Sprintf("%s #%d", name, i+1) }
	var web webRun
	var rs []httpResult
	barePhase := func(i int) {
		rs = append(rs, load(round("bare net/http + EVALSHA", i), bareURL, *workers, *duration, buyer("b"), empty))
		web.bare = append(web.bare, rs[len(rs)-1].rate)
	}
	soldOutPhase := func(i int) {
		rs = append(rs, load(round("seckill, sold out", i), base+"/v1/seckill/GONE/buy", *workers, *duration, buyer("g"), empty))
		web.soldOut = append(web.soldOut, rs[len(rs)-1].rate)
	}
	barePhase(0)
	// The group commits behind a phase's 201s: how many orders each carried
	// and how long each took (two may be in flight at once).
	var batch int // the selling phase's mean batch, which the floor writes alike
	withCommits := func(phase func() httpResult) httpResult {
		return withGroupCommits(a, &batch, phase)
	}
	selling, projection := withProjectionLag(a, 1, func() httpResult { return sellingPhase(a, base, "seckill, selling", &batch) })
	rs = append(rs, selling)
	web.selling, web.projection = selling.rate, projection
	// The same phase driven by wrk, closed loop at the same connections,
	// right after ours (openloop.go, external.go).
	web.arrival = newArrivalRun(web.selling)
	rs = append(rs, web.arrival.closedBeside(a, selling, base+"/v1/seckill/FLASH/buy", buyer("s"), `{}`)...)
	// The floor, right after the sale it is the floor of: the same clients,
	// the same group commits in flight, the same batch.
	rs = append(rs, floorRun(ctx, dsnBase, *workers, floorWriters, batch, *duration))
	// The selling phase open loop at 50% and 80% of its closed-loop rate
	// (vegeta beside ours at 50%), and the commit-latency breakdown; first a
	// pause, so InnoDB's flushing of the floor's rows is not measured with
	// them.
	time.Sleep(3 * time.Second)
	rs = append(rs, web.arrival.openBeside(a, selling, base+"/v1/seckill/FLASH/buy", buyer("o"), `{}`, true)...)
	rs = append(rs, web.arrival.commitBreakdown(ctx, a, dsnBase, base+"/v1/seckill/FLASH/buy", buyer("s"))...)
	soldOutPhase(0)
	for i := 1; i < pairRounds; i++ {
		barePhase(i)
		soldOutPhase(i)
	}
	sale := load("seckill, 2000 units", base+"/v1/seckill/SALE/buy", *workers, *duration, buyer("x"), empty)

	// Oversell: the orders the database holds for SALE against its stock.
	var sold int64
	check := openDatabase(ctx, dsnBase, *dbPrefix+"_http")
	must(check.QueryRowContext(ctx, `SELECT COALESCE(SUM(qty), 0) FROM stock_reservations WHERE sku = 'SALE' AND order_id IS NOT NULL`).Scan(&sold))
	_ = check.Close()
	oversell := max(sold-2000, 0)
	sale.note = fmt.Sprintf("sold %d of 2000 (201s: %d), oversell %d", sold, sale.codes[201], oversell)
	rs = append(rs, sale)
	// The cart's ratio is judged on a pair of its own, as the selling one.
	waitProjected(ctx, a)
	rs = append(rs, load(cartBarePhase, bareURL, *workers, *duration, buyer("b"), empty))
	web.cartBare = rs[len(rs)-1].rate
	cart, _ := withProjectionLag(a, 2, func() httpResult {
		return withCommits(func() httpResult {
			return load("orders, 2-line cart", base+"/v1/orders", *workers, *duration, buyer("c"), func(int, int64) string {
				return `{"items":[{"sku":"CART-A","qty":1},{"sku":"CART-B","qty":2}]}`
			})
		})
	})
	rs = append(rs, cart)
	web.cart = rs[len(rs)-1].rate
	rs = append(rs, web.arrival.openBeside(a, rs[len(rs)-1], base+"/v1/orders", buyer("c"), `{"items":[{"sku":"CART-A","qty":1},{"sku":"CART-B","qty":2}]}`, false)...)

	web.phases, web.oversell = rs, oversell
	var lag string
	waitProjected(ctx, a)
	lag, web.lag = syncLag(ctx, a, dsnBase, 400, *duration)
	web.extra = lag
	if *soakFor > 0 {
		var soak string
		soak, web.soak = soakRun(base, *soakFor)
		web.extra += soak
		if *churnN > 0 {
			prog.phase("campaign churn")
			web.churn = campaignChurn(ctx, appNode(a, rdb), "soak", *churnN, churnWorkers)
			web.extra += web.churn.table()
		}
	}
	return web
}

// sellingPhase is the seckill selling phase: -workers buyers (closed loop,
// each on its own connection, with the client credential and a buyer
// token) buy SKU FLASH (stock enough never to run out) through the
// service at base for -duration, with the group commits behind its 201s
// noted (withGroupCommits; *batch is set to their mean batch). The seckill
// group, the campaign group and the webhooks group run it alike.
func sellingPhase(a *app.App, base, name string, batch *int) httpResult {
	return withGroupCommits(a, batch, func() httpResult {
		return load(name, base+"/v1/seckill/FLASH/buy", *workers, *duration,
			func(w int) http.Header { return credentials("s", w) }, func(int, int64) string { return `{}` })
	})
}

// withGroupCommits runs phase and notes the group commits behind its 201s:
// how many orders each carried and how long each took (two may be in
// flight at once); *batch is set to the mean batch.
func withGroupCommits(a *app.App, batch *int, phase func() httpResult) httpResult {
	cs := a.Commits.Stats()
	n0, reqs0, ns0 := cs.Commits.Load(), cs.Requests.Load(), cs.Nanos.Load()
	ps0 := a.Commits.PreparedStats()
	st := a.Stock.Stats()
	pipes0, piped0 := st.Pipelines.Load(), st.Pipelined.Load()
	r := phase()
	pipes, piped := st.Pipelines.Load()-pipes0, st.Pipelined.Load()-piped0
	n, reqs, ns := cs.Commits.Load()-n0, cs.Requests.Load()-reqs0, cs.Nanos.Load()-ns0
	ps := a.Commits.PreparedStats()
	*batch = meanBatch(reqs, n)
	if n > 0 {
		r.note = fmt.Sprintf("%d group commits: %.1f requests and %s each; the writers' statements: %d prepared, %d executed prepared, %d as text, %d evicted, %d held",
			n, float64(reqs)/float64(n), dur(time.Duration(ns/n)), ps.Prepares-ps0.Prepares, ps.Executions-ps0.Executions,
			ps.Texts-ps0.Texts, ps.Evictions-ps0.Evictions, ps.Statements)
	}
	if pipes > 0 {
		r.note += fmt.Sprintf("; admissions: %d pipelines of %.1f", pipes, float64(piped)/float64(pipes))
	}
	return r
}

// syncLag pays orders at rate per second for d through the service, waits
// until the database applied them, and reports the time from each stock
// operation's outbox row (written in the payment's transaction) to its ledger
// row, as the database recorded them: the ordered sync's lag through RocketMQ.
func syncLag(ctx context.Context, a *app.App, dsnBase string, rate int, d time.Duration) (string, lagStats) {
	prog.phase("sync lag")
	defer measureCPU("sync lag")()
	var wg sync.WaitGroup
	var failed atomic.Int64
	var errMu sync.Mutex              // over the three below
	var firstErrs []string            // the first failures' reasons
	var creates, pays []time.Duration // each call's time
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	stop := time.Now().Add(d)
	for i := 0; time.Now().Before(stop); i++ {
		<-tick.C
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			o, err := a.Orders.Create(ctx, fmt.Sprintf("lag%d", i), "", []inventory.Line{{SKU: "FLASH", Qty: 1}})
			t1 := time.Now()
			if err == nil {
				_, err = a.Orders.Pay(ctx, o.ID, "pay-"+o.ID)
			}
			errMu.Lock()
			defer errMu.Unlock()
			if err != nil && failed.Add(1) <= 3 {
				firstErrs = append(firstErrs, err.Error())
			}
			if err == nil {
				creates, pays = append(creates, t1.Sub(t0)), append(pays, time.Since(t1))
			}
		}()
	}
	wg.Wait()
	db := openDatabase(ctx, dsnBase, *dbPrefix+"_http")
	defer db.Close()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var left int
		must(db.QueryRowContext(ctx, `SELECT COUNT(*) FROM stock_outbox ob LEFT JOIN stock_ledger l
			ON l.token = ob.token AND l.sku = ob.sku AND l.op = ob.op WHERE l.id IS NULL`).Scan(&left))
		if left == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	rows, err := db.QueryContext(ctx, `SELECT TIMESTAMPDIFF(MICROSECOND, ob.created_at, l.applied_at),
		TIMESTAMPDIFF(MICROSECOND, ob.created_at, COALESCE(ob.sent_at, l.applied_at)) FROM stock_outbox ob
		JOIN stock_ledger l ON l.token = ob.token AND l.sku = ob.sku AND l.op = ob.op WHERE ob.token IN
		(SELECT reservation_token FROM orders WHERE user_id LIKE 'lag%')`)
	must(err)
	defer rows.Close()
	var lags, relayed []time.Duration // to the ledger row; to the relay's send
	for rows.Next() {
		var us, sent int64
		must(rows.Scan(&us, &sent))
		lags = append(lags, time.Duration(us)*time.Microsecond)
		relayed = append(relayed, time.Duration(sent)*time.Microsecond)
	}
	if len(lags) == 0 {
		return "\nsync lag: nothing applied\n", lagStats{}
	}
	slices.Sort(lags)
	slices.Sort(relayed)
	stats := lagStats{applied: len(lags), p99: lags[len(lags)*99/100]}
	table := fmt.Sprintf("\n| sync lag through RocketMQ, %d payments/s for %s | applied | p50 | p99 | max | target |\n|---|---:|---:|---:|---:|---:|\n| outbox row → ledger row | %d (%d failed) | %s | %s | %s | p99 < 1s |\n",
		rate, d, len(lags), failed.Load(), dur(lags[len(lags)/2]), dur(lags[len(lags)*99/100]), dur(lags[len(lags)-1])) +
		fmt.Sprintf("| of which outbox row → the relay's send | | %s | %s | %s | |\n",
			dur(relayed[len(relayed)/2]), dur(relayed[len(relayed)*99/100]), dur(relayed[len(relayed)-1]))
	slices.Sort(creates)
	slices.Sort(pays)
	for _, c := range []struct {
		what string
		ds   []time.Duration
	}{{"each order's create (in process, no HTTP)", creates}, {"its payment right after", pays}} {
		if n := len(c.ds); n > 0 {
			table += fmt.Sprintf("| %s | %d | %s | %s | %s | |\n", c.what, n, dur(c.ds[n/2]), dur(c.ds[n*99/100]), dur(c.ds[n-1]))
		}
	}
	if len(firstErrs) > 0 {
		table += "\nThe first failures: " + strings.Join(firstErrs, "; ") + "\n"
	}
	return table, stats
}

// soakRun keeps the seckill selling load on for d and samples this process's
// heap (the service and the load generator) and goroutines every d/12.
func soakRun(base string, d time.Duration) (string, soakStats) {
	type sample struct {
		at         time.Duration
		heap       uint64
		goroutines int
	}
	var samples []sample
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		load("soak", base+"/v1/seckill/FLASH/buy", *workers, d, func(w int) http.Header { return credentials("soak", w) },
			func(int, int64) string { return `{}` }, false)
	}()
	every := d / 12
	for t := time.NewTicker(every); ; {
		select {
		case <-done:
			t.Stop()
			var b strings.Builder
			fmt.Fprintf(&b, "\n| soak, seckill selling for %s | heap in use | goroutines |\n|---|---:|---:|\n", d)
			var stats soakStats
			for i, s := range samples {
				fmt.Fprintf(&b, "| %s | %.1f MiB | %d |\n", s.at.Round(time.Second), float64(s.heap)/(1<<20), s.goroutines)
				if i < len(samples)/2 {
					stats.firstHalf += float64(s.heap) / (1 << 20)
				} else {
					stats.second += float64(s.heap) / (1 << 20)
				}
			}
			if half := len(samples) / 2; half > 0 {
				stats.samples = len(samples)
				stats.firstHalf /= float64(half)
				stats.second /= float64(len(samples) - half)
			}
			return b.String(), stats
		case <-t.C:
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			samples = append(samples, sample{time.Since(start), ms.HeapInuse, runtime.NumGoroutine()})
		}
	}
}
