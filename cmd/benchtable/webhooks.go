package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/app"
	"github.com/acme/inventory/internal/arbiter"
)

// The webhooks group (-only webhooks; issue 32's measures, SPEC section 7's
// stock events): the real service in this process, with plain-http
// loopback targets allowed, and a webhook receiver in this process that
// answers 200 at once and counts what it is delivered. Side by side in one
// run:
//
//   - -webhook-pairs interleaved pairs of the seckill selling phase (the
//     seckill group's own, sellingPhase: as long, as many clients): first
//     with no subscription at all, then with one (PUT /v1/webhooks/{id},
//     every event, every SKU, pointing at the receiver), deleted after
//     its phase. Events are written either way (the arbiter writes them
//     in the sale's transaction, always on, and the events job numbers
//     them); what one subscription adds is its delivery. Each phase's
//     CPU per sale is counted across the processes (this one, the
//     receiver's own CPU taken out; Redis; MariaDB; RocketMQ), and the
//     verdict is the median pair's ratio, with the 201s' rate beside it;
//   - a sale of 2,000 units of a fresh SKU to the same clients, each
//     buying until refused, with a subscription: then the replay feed's
//     sku.sold_out of that SKU and the receiver's are counted, after
//     waiting (bounded) for the delivery.

var (
	hookPairs     = flag.Int("webhook-pairs", 7, "webhooks group: how many interleaved pairs of seckill selling phases, with no subscription and then one (the verdict is the median pair's ratio; a pair's ratio moves ±15% on a quiet 2-core machine, so 3 pairs judged a cost the delivery does not have)")
	hookWithFirst = flag.Bool("webhook-with-first", false, "webhooks group: run each pair's phase with a subscription first, then the one with none (to see whether the order within a pair moves the ratio)")
)

const (
	// hookSecret signs the group's deliveries.
	hookSecret = "bench-webhook-secret-5d7f9b1c3e5a7c9e1b3d5f7a"
	// hookSettle is the least pause before each judged phase: a deleted
	// subscription's delivery goroutine is stopped (the job lists the
	// subscriptions every second) and a new one's started. Then the phase
	// waits, up to hookQuietMax, until the processes its cost counts are
	// quiet (below hookQuietCores of a core over half a second): a phase
	// leaves work behind it (the outbox's relay to RocketMQ, the expiry
	// queue, InnoDB's flushing), and a phase started into it pays for its
	// predecessor's. With a fixed 2 s pause, on a machine others loaded,
	// the second phase of a pair was the slower and costlier one in most
	// pairs whichever it was (none first: the subscription 1.10-1.33× per
	// sale, median pair, in three runs; subscription first: 0.95×).
	hookSettle     = 2 * time.Second
	hookQuietMax   = 20 * time.Second
	hookQuietCores = 0.25
	// soldOutUnits is the sold-out sale's stock.
	soldOutUnits = 2000
	// hookWait bounds the wait for the sold-out sale's sku.sold_out in the
	// feed and at the receiver.
	hookWait = 30 * time.Second
	// costTargetRatio is the bound on the sale's CPU with one subscription
	// over with none.
	costTargetRatio = 1.10
	// rusageThread is getrusage's RUSAGE_THREAD (Linux): the calling
	// thread's CPU time.
	rusageThread = 1
)

// hooksRun is what the webhooks group measured.
type hooksRun struct {
	phases   []httpResult
	pairs    []hookPair
	sale     *soldOutSale
	profiles [2]string // where the CPU profiles of the phases with none and with one subscription went ("": not profiled)
}

// hookPair is a phase with no subscription and the phase with one after it.
type hookPair struct{ none, with hookPhase }

// hookPhase is one judged selling phase.
type hookPhase struct {
	name       string
	sales      int64              // 201s
	rate       float64            // 201s per second
	cpu        map[string]float64 // CPU seconds by process (cpuGroups); benchtable's includes the receiver's
	other      float64            // the rest of the machine's busy seconds (not counted)
	receiver   float64            // the receiver's CPU seconds (part of benchtable's)
	deliveries int64              // deliveries the receiver took during the phase
	measured   bool               // the CPU was sampled
	others     othersOnDB         // other sessions' statements on the shared MariaDB during the phase
}

// othersOnDB is what a phase saw of other sessions on the MariaDB it
// shares: samples of the processlist, and how many of them found a
// statement of a connection not the service's running.
type othersOnDB struct{ samples, busy int }

func (o othersOnDB) String() string {
	if o.samples == 0 {
		return "not sampled"
	}
	return fmt.Sprintf("%d%% of %d samples", 100*o.busy/o.samples, o.samples)
}

// byProcess is the phase's CPU µs per sale of process group g (this
// process's less the receiver's).
func (p hookPhase) byProcess(g string) float64 {
	if !p.measured || p.sales == 0 {
		return 0
	}
	v := p.cpu[g]
	if g == "benchtable" {
		v -= p.receiver
	}
	return v * 1e6 / float64(p.sales)
}

// perSale is the phase's CPU µs per sale across the processes: this one
// (the service and the load generator) less the receiver, Redis, MariaDB
// and RocketMQ. 0: not measured, or no sale.
func (p hookPhase) perSale() float64 {
	if !p.measured || p.sales == 0 {
		return 0
	}
	total := -p.receiver
	for _, g := range cpuGroups {
		total += p.cpu[g]
	}
	return total * 1e6 / float64(p.sales)
}

// costNote is the phase's CPU per sale by process, for the phases table.
func (p hookPhase) costNote() string {
	if p.perSale() == 0 {
		return "CPU not measured"
	}
	us := func(s float64) float64 { return s * 1e6 / float64(p.sales) }
	var parts []string
	for _, g := range cpuGroups {
		name := g
		if g == "benchtable" {
			name = "benchtable less the receiver"
		}
		parts = append(parts, fmt.Sprintf("%s %.0f", name, p.byProcess(g)))
	}
	return fmt.Sprintf("CPU µs per sale %.0f (%s; the rest of the machine %.0f, not counted); the receiver: %d deliveries, %.0f µs of CPU in the phase (%.2f per sale), not counted; other sessions' statements running on the shared MariaDB: %s",
		p.perSale(), strings.Join(parts, ", "), us(p.other), p.deliveries, p.receiver*1e6, us(p.receiver), p.others)
}

// soldOutSale is the sale of soldOutUnits units to the clients until each
// is refused, and the sku.sold_out it produced.
type soldOutSale struct {
	sku                              string
	created, refused, others, failed int64 // answers: 201, 409 (sold out), anything else; requests without an answer
	sold                             int64 // units the database's orders hold
	feed                             int64 // sku.sold_out of the SKU in the replay feed
	deliveries, distinct             int64 // the receiver's sku.sold_out of the SKU: deliveries, and distinct X-Event-Id
	badSignatures                    int64 // deliveries whose signature did not verify (whole group)
	selling, waited                  time.Duration
	timedOut                         bool // the wait for the feed and the delivery ran out
	feedErr                          string
}

// webhooksBench runs the webhooks group on its own service and database.
func webhooksBench(ctx context.Context, rdb *redis.Client, dsnBase string) *hooksRun {
	prog.phase("webhooks setup")
	a, check := startService(ctx, rdb, dsnBase, *dbPrefix+"_webhooks", func(c *app.Config) {
		c.WebhookAllowHTTP, c.WebhookAllowPrivate = true, true // the receiver is plain http on loopback
	})
	defer check.Close()
	defer a.Shutdown(context.Background())
	_, err := a.Catalog.Put(ctx, "FLASH", 1_000_000_000, 0)
	must(err)
	rc := startReceiver()
	defer rc.stop()
	base := "http://" + a.Addr()
	run := &hooksRun{}

	// A phase first, unjudged: the first phase on a fresh service and the
	// smallest tables is the cheapest of a run, and would favour the first
	// phase with none.
	var batch int
	settle(hookSettle, hookQuietMax, hookQuietCores)
	warm := sellingPhase(a, base, "seckill, selling, warm-up (not judged)", &batch)
	run.phases = append(run.phases, warm)

	// The judged phases, each profiled into the file of its kind when
	// -cpuprofile is set (the group's two profiles go beside it).
	var parts [2][][]byte
	measure := func(name string, kind int) hookPhase {
		waited, idle := settle(hookSettle, hookQuietMax, hookQuietCores)
		n0, cpu0 := rc.snapshot()
		var buf bytes.Buffer
		profiling := *cpuProf != "" && pprof.StartCPUProfile(&buf) == nil
		stopWatch := watchOthers(ctx, check)
		r := sellingPhase(a, base, name, &batch)
		others := stopWatch()
		if profiling {
			pprof.StopCPUProfile()
			parts[kind] = append(parts[kind], buf.Bytes())
		}
		n1, cpu1 := rc.snapshot()
		p := hookPhase{name: name, sales: r.codes[http.StatusCreated], deliveries: n1 - n0, receiver: (cpu1 - cpu0).Seconds(), others: others}
		if n := r.answers(); n > 0 {
			p.rate = r.rate * float64(p.sales) / float64(n)
		}
		if ph, ok := cpuPhaseNamed(name); ok {
			p.cpu, p.other, p.measured = ph.group, ph.other, true
		}
		r.note = fmt.Sprintf("%s; started after %s of settling (the counted processes then at %.2f cores); %s", p.costNote(), waited.Round(100*time.Millisecond), idle, r.note)
		run.phases = append(run.phases, r)
		return p
	}
	for i := range *hookPairs {
		var p hookPair
		id := fmt.Sprintf("bench-selling-%d", i+1)
		withPhase := func() {
			putHook(base, id, rc.url)
			p.with = measure(fmt.Sprintf("seckill, selling, one subscription #%d", i+1), 1)
			deleteHook(base, id)
		}
		if *hookWithFirst {
			withPhase()
		}
		p.none = measure(fmt.Sprintf("seckill, selling, no subscription #%d", i+1), 0)
		if !*hookWithFirst {
			withPhase()
		}
		run.pairs = append(run.pairs, p)
	}
	if *cpuProf != "" {
		dir := filepath.Dir(*cpuProf)
		for kind, name := range []string{"webhooks-none.cpu.pprof", "webhooks-with.cpu.pprof"} {
			if len(parts[kind]) > 0 {
				run.profiles[kind] = filepath.Join(dir, name)
				mergeProfiles(run.profiles[kind], parts[kind])
			}
		}
	}

	sale, row := sellOut(ctx, a, check, base, rc)
	run.sale = sale
	run.phases = append(run.phases, row)
	return run
}

// settle sleeps at least least, then until the processes the sale's cost
// counts (cpuGroups) use less than cores of a core over half a second, or
// until most has passed; it returns how long it waited and their last
// half second's use, in cores.
func settle(least, most time.Duration, cores float64) (time.Duration, float64) {
	start := time.Now()
	time.Sleep(least)
	prev, ok := sampleCPU()
	use := -1.0
	for ok && time.Since(start) < most {
		time.Sleep(500 * time.Millisecond)
		cur, ok2 := sampleCPU()
		if !ok2 {
			break
		}
		var ticks int64
		for _, g := range cpuGroups {
			ticks += cur.group[g] - prev.group[g]
		}
		use = float64(ticks) / userHZ / cur.at.Sub(prev.at).Seconds()
		if use < cores {
			break
		}
		prev = cur
	}
	return time.Since(start), use
}

// watchOthers samples MariaDB's processlist every 100 ms, through db (a
// connection of the bench's, to the service's database), until the
// returned function is called, and counts the samples that found a
// statement running on a connection to another database: another
// session's work, whose CPU the mariadbd column counts as the sale's.
func watchOthers(ctx context.Context, db *sql.DB) func() othersOnDB {
	var o othersOnDB
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			var n int
			if db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.processlist
				WHERE id <> CONNECTION_ID() AND command NOT IN ('Sleep', 'Daemon', 'Binlog Dump') AND COALESCE(db, '') <> DATABASE()`).Scan(&n) == nil {
				o.samples++
				if n > 0 {
					o.busy++
				}
			}
		}
	}()
	return func() othersOnDB {
		close(done)
		<-stopped
		return o
	}
}

// cpuPhaseNamed is the CPU sample of the last phase named name.
func cpuPhaseNamed(name string) (cpuPhase, bool) {
	for i := len(cpuPhases) - 1; i >= 0; i-- {
		if cpuPhases[i].name == name {
			return cpuPhases[i], true
		}
	}
	return cpuPhase{}, false
}

// soldOutPhase is the name of the sold-out sale's phase.
const soldOutPhase = "2,000 units sold out, one subscription"

// sellOut puts a subscription and a fresh SKU of soldOutUnits units, has
// -workers clients buy it (closed loop) until each is refused, checks the
// database's account, and counts sku.sold_out of the SKU in the replay
// feed and at the receiver once the feed has one, the receiver has one and
// the subscription's backlog is empty (or hookWait has passed), and again
// a second later (a second sku.sold_out would be as quick as the first).
func sellOut(ctx context.Context, a *app.App, check *sql.DB, base string, rc *receiver) (*soldOutSale, httpResult) {
	prog.phase(soldOutPhase)
	const id = "bench-sold-out"
	s := &soldOutSale{sku: fmt.Sprintf("SOLD-OUT-%d", time.Now().UnixNano())}
	putHook(base, id, rc.url)
	defer deleteHook(base, id)
	_, err := a.Catalog.Put(ctx, s.sku, soldOutUnits, 0)
	must(err)

	type tally struct {
		created, refused, others, failed int64
		codes                            map[int]int64
		lat                              []time.Duration
	}
	tallies := make([]tally, *workers)
	deadline := time.Now().Add(max(60*time.Second, 10**duration))
	start := time.Now()
	var wg sync.WaitGroup
	for w := range tallies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := &tallies[w]
			t.codes = map[int]int64{}
			h := credentials("z", w)
			h.Set("Content-Type", "application/json")
			c := newRawClient(base+"/v1/seckill/"+s.sku+"/buy", h, 10*time.Second)
			defer c.Close()
			for time.Now().Before(deadline) {
				t0 := time.Now()
				status, err := c.post(`{}`)
				if err != nil {
					t.failed++
					t.codes[-1]++
					continue
				}
				t.lat = append(t.lat, time.Since(t0))
				t.codes[status]++
				switch status {
				case http.StatusCreated:
					t.created++
				case http.StatusConflict:
					t.refused++
					return // refused: sold out (the SKU has no per-user limit)
				default:
					t.others++
				}
			}
		}()
	}
	wg.Wait()
	s.selling = time.Since(start)
	r := httpResult{name: soldOutPhase, codes: map[int]int64{}}
	var lat []time.Duration
	for _, t := range tallies {
		s.created, s.refused, s.others, s.failed = s.created+t.created, s.refused+t.refused, s.others+t.others, s.failed+t.failed
		lat = append(lat, t.lat...)
		for k, v := range t.codes {
			r.codes[k] += v
		}
	}
	r.rate = float64(len(lat)) / s.selling.Seconds()
	r.p50, r.p99 = percentiles(lat)
	must(check.QueryRowContext(ctx, `SELECT COALESCE(SUM(qty), 0) FROM stock_reservations WHERE sku = ? AND order_id IS NOT NULL`, s.sku).Scan(&s.sold))

	prog.phase("waiting for sku.sold_out")
	count := func() bool {
		events, err := feedEvents(base, s.sku)
		if err != nil {
			s.feedErr = err.Error()
		}
		s.feed = countEvents(events, s.sku, arbiter.EventSoldOut)
		s.deliveries, s.distinct = rc.count(s.sku, arbiter.EventSoldOut)
		s.badSignatures = rc.bad.Load()
		return s.feed >= 1 && s.distinct >= 1 && hookBacklog(base, id) == 0
	}
	waitStart := time.Now()
	for !count() {
		if time.Since(waitStart) > hookWait {
			s.timedOut = true
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	s.waited = time.Since(waitStart)
	time.Sleep(time.Second)
	count()
	r.note = fmt.Sprintf("%d clients bought until refused, in %s: sold %d of %d (201s: %d, refusals %d), oversell %d; sku.sold_out of %s: %d in the replay feed, %d delivered to the receiver (deliveries: %d), all in by %s after the last refusal",
		*workers, s.selling.Round(time.Millisecond), s.sold, soldOutUnits, s.created, s.refused, max(s.sold-soldOutUnits, 0),
		s.sku, s.feed, s.distinct, s.deliveries, s.waited.Round(time.Millisecond))
	return s, r
}

// countEvents is how many of events are of type typ and SKU sku.
func countEvents(events []arbiter.Event, sku, typ string) int64 {
	var n int64
	for _, e := range events {
		if e.SKU == sku && e.Type == typ {
			n++
		}
	}
	return n
}

// hookDelivery is one delivery the receiver took.
type hookDelivery struct {
	id       int64 // X-Event-Id
	typ, sku string
}

// countDeliveries is how many of got are of type typ and SKU sku, and how
// many distinct events (X-Event-Id) they are: delivery is at least once,
// and a receiver deduplicates by the event's id.
func countDeliveries(got []hookDelivery, sku, typ string) (deliveries, distinct int64) {
	seen := map[int64]bool{}
	for _, d := range got {
		if d.sku == sku && d.typ == typ {
			deliveries++
			if !seen[d.id] {
				seen[d.id] = true
				distinct++
			}
		}
	}
	return deliveries, distinct
}

// receiver is the group's webhook receiver: an HTTP server in this process
// that answers 200 at once and keeps each delivery whose signature
// verifies. Its CPU is this process's, so it is measured to be taken out
// of the sale's cost: each connection's goroutine locks itself to its
// thread at its first request (it keeps it until the connection ends, and
// the thread then ends too), and after each request the thread's CPU time
// (getrusage RUSAGE_THREAD) since the last is added up: a locked thread
// runs nothing else. Not counted: the connection's first request until
// its handler runs, and the runtime's work on other threads to wake it
// (both small; they stay in this process's count, the service's side).
type receiver struct {
	url string
	srv *http.Server
	cpu atomic.Int64 // ns
	bad atomic.Int64 // deliveries whose signature did not verify
	mu  sync.Mutex
	got []hookDelivery
}

type connCPUKey struct{}

// connCPU is a connection's thread's CPU time when last read.
type connCPU struct {
	locked bool
	last   int64
}

func startReceiver() *receiver {
	if threadCPU() < 0 {
		must(fmt.Errorf("getrusage(RUSAGE_THREAD) is not available: the receiver's CPU cannot be told from the service's"))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(err)
	rc := &receiver{url: "http://" + ln.Addr().String() + "/hook"}
	rc.srv = &http.Server{Handler: http.HandlerFunc(rc.serve),
		ConnContext: func(ctx context.Context, _ net.Conn) context.Context {
			return context.WithValue(ctx, connCPUKey{}, &connCPU{})
		}}
	go func() { _ = rc.srv.Serve(ln) }()
	return rc
}

func (rc *receiver) stop() { _ = rc.srv.Close() }

// serve takes one delivery (an HTTP/1.1 connection's requests are served
// on its own goroutine, one after another).
func (rc *receiver) serve(w http.ResponseWriter, r *http.Request) {
	cc, _ := r.Context().Value(connCPUKey{}).(*connCPU)
	if cc != nil && !cc.locked {
		runtime.LockOSThread()
		cc.locked, cc.last = true, threadCPU()
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	var e struct {
		Type string `json:"type"`
		SKU  string `json:"sku"`
	}
	id, err := strconv.ParseInt(r.Header.Get("X-Event-Id"), 10, 64)
	sig := hex.EncodeToString(inventory.Sign(hookSecret, r.Header.Get("X-Timestamp"), body))
	if err == nil && json.Unmarshal(body, &e) == nil && hmac.Equal([]byte(sig), []byte(r.Header.Get("X-Signature"))) {
		rc.mu.Lock()
		rc.got = append(rc.got, hookDelivery{id: id, typ: e.Type, sku: e.SKU})
		rc.mu.Unlock()
	} else {
		rc.bad.Add(1)
	}
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	if cc != nil {
		now := threadCPU()
		rc.cpu.Add(now - cc.last)
		cc.last = now
	}
}

// snapshot is the deliveries taken so far and the receiver's CPU time.
func (rc *receiver) snapshot() (int64, time.Duration) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return int64(len(rc.got)), time.Duration(rc.cpu.Load())
}

// count is countDeliveries of what the receiver took.
func (rc *receiver) count(sku, typ string) (int64, int64) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return countDeliveries(rc.got, sku, typ)
}

// threadCPU is the calling thread's CPU time in ns (-1: unknown).
func threadCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return -1
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// apiCall calls the service's API with token and decodes a 2xx answer's
// body into out (if not nil).
func apiCall(method, rawURL, token string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, rawURL, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, fmt.Errorf("%s %s: %s: %s", method, rawURL, resp.Status, bytes.TrimSpace(b))
	}
	if out != nil {
		return resp.StatusCode, json.Unmarshal(b, out)
	}
	return resp.StatusCode, nil
}

// putHook subscribes id to every event of every SKU, delivered to target.
func putHook(base, id, target string) {
	_, err := apiCall(http.MethodPut, base+"/v1/webhooks/"+id, benchAdmin,
		map[string]any{"url": target, "secret": hookSecret, "events": arbiter.EventTypes, "skus": []string{}}, nil)
	must(err)
}

func deleteHook(base, id string) {
	_, err := apiCall(http.MethodDelete, base+"/v1/webhooks/"+id, benchAdmin, nil, nil)
	must(err)
}

// hookBacklog is subscription id's undelivered events (-1: unknown).
func hookBacklog(base, id string) int64 {
	var v struct {
		Backlog int64 `json:"backlog"`
	}
	if _, err := apiCall(http.MethodGet, base+"/v1/webhooks/"+id, benchAdmin, nil, &v); err != nil {
		return -1
	}
	return v.Backlog
}

// feedEvents reads sku's events from the replay feed, from the oldest,
// page by page.
func feedEvents(base, sku string) ([]arbiter.Event, error) {
	var all []arbiter.Event
	var after int64
	for {
		var page struct {
			Items []arbiter.Event `json:"items"`
		}
		if _, err := apiCall(http.MethodGet, fmt.Sprintf("%s/v1/events?sku=%s&after=%d&limit=500", base, url.QueryEscape(sku), after),
			benchClient, nil, &page); err != nil {
			return all, err
		}
		if len(page.Items) == 0 || page.Items[len(page.Items)-1].ID == nil {
			return all, nil
		}
		all = append(all, page.Items...)
		after = *page.Items[len(page.Items)-1].ID
	}
}

// webhookChecks are the webhooks group's targets.
func webhookChecks(h *hooksRun) []check {
	if h == nil || (len(h.pairs) == 0 && h.sale == nil) {
		return nil
	}
	var cs []check
	if len(h.pairs) > 0 {
		k := check{what: fmt.Sprintf("stock events: the seckill selling phase's CPU per sale across the processes (this one, the service and the load generator, less the webhook receiver; Redis; MariaDB; RocketMQ), with one subscription (every event, every SKU; a receiver answering 200 at once) / with none (events still written), median of %d interleaved pairs; the 201s' rate beside it", len(h.pairs)),
			target: fmt.Sprintf("≤ %.2f× (at most %.0f%% more)", costTargetRatio, 100*(costTargetRatio-1)), state: unmeasured, measured: "CPU not measured"}
		var costs, rates []float64
		var pairs, ratePairs, silent []string
		procs := map[string][]float64{} // each process's with / none, by pair
		for i, p := range h.pairs {
			for _, g := range cpuGroups {
				if a, b := p.none.byProcess(g), p.with.byProcess(g); a > 0 && b > 0 {
					procs[g] = append(procs[g], b/a)
				}
			}
			a, b := p.none.perSale(), p.with.perSale()
			if a > 0 && b > 0 {
				costs = append(costs, b/a)
				pairs = append(pairs, fmt.Sprintf("#%d: %.0f → %.0f µs, %.2f×", i+1, a, b, b/a))
			}
			if p.none.rate > 0 {
				rates = append(rates, p.with.rate/p.none.rate)
				ratePairs = append(ratePairs, fmt.Sprintf("#%d: %.0f → %.0f/s", i+1, p.none.rate, p.with.rate))
			}
			if p.with.deliveries == 0 {
				silent = append(silent, fmt.Sprintf("#%d", i+1))
			}
		}
		if len(costs) == len(h.pairs) {
			r := median(costs)
			k.measured = fmt.Sprintf("%.2f× (%s)", r, strings.Join(pairs, "; "))
			k.state = missed
			if r <= costTargetRatio {
				k.state = met
			}
		}
		if len(rates) > 0 {
			k.measured += fmt.Sprintf("; selling rate %.2f× (%s)", median(rates), strings.Join(ratePairs, "; "))
		}
		var byProc []string
		for _, g := range cpuGroups {
			if len(procs[g]) == len(h.pairs) {
				name := g
				if g == "benchtable" {
					name = "benchtable less the receiver"
				}
				byProc = append(byProc, fmt.Sprintf("%s %.2f×", name, median(procs[g])))
			}
		}
		if len(byProc) > 0 {
			k.measured += "; each process's CPU per sale, median pair: " + strings.Join(byProc, ", ")
		}
		if len(silent) > 0 {
			// The phase did not measure a subscription's cost: it delivered nothing.
			k.measured += fmt.Sprintf("; the receiver took no delivery in the phase with one subscription of pair %s", strings.Join(silent, ", "))
			k.state = missed
		}
		cs = append(cs, k)
	}
	if s := h.sale; s != nil {
		k := check{what: fmt.Sprintf("stock events: sku.sold_out of a SKU of %d units sold to %d clients buying until refused, in the replay feed and at the receiver (distinct X-Event-Id; delivery is at least once)", soldOutUnits, *workers),
			measured: fmt.Sprintf("feed %d, receiver %d (deliveries: %d)", s.feed, s.distinct, s.deliveries), target: "exactly 1 in each", state: met}
		if s.timedOut {
			k.measured += fmt.Sprintf("; the wait for them ran out (%s)", hookWait)
		}
		if s.feedErr != "" {
			k.measured += "; the feed: " + s.feedErr
		}
		if s.badSignatures > 0 {
			k.measured += fmt.Sprintf("; %d deliveries of the group failed the signature check", s.badSignatures)
		}
		if s.feed != 1 || s.distinct != 1 || s.badSignatures > 0 || s.feedErr != "" {
			k.state = missed
		}
		cs = append(cs, k)
		k = check{what: "stock events: that sale's account (the database's orders), oversell",
			measured: fmt.Sprintf("sold %d of %d (201s: %d), oversell %d", s.sold, soldOutUnits, s.created, max(s.sold-soldOutUnits, 0)),
			target:   fmt.Sprintf("sold %d, oversell 0", soldOutUnits), state: met}
		if s.sold != soldOutUnits {
			k.state = missed
		}
		cs = append(cs, k)
	}
	for i := range cs {
		cs[i].group = "webhooks"
	}
	return cs
}

// webhooksTable is the webhooks group's phases, as the HTTP table, and
// what its ratio counts.
func webhooksTable(h *hooksRun) string {
	if h == nil {
		return ""
	}
	var b strings.Builder
	phaseTable(&b, fmt.Sprintf("webhooks group, %d clients", *workers), h.phases)
	b.WriteString("\n\"No subscription\" is no webhook subscription at all: the events are still written (the arbiter writes them in the sale's transaction, always on; the events job numbers and coalesces them) and the delivery job still lists the subscriptions every second; " +
		"\"one subscription\" is one (`PUT /v1/webhooks/{id}`, every event, every SKU), put before its phase and deleted after it, delivering to a receiver in this process that answers 200 at once. " +
		pairOrder(*hookWithFirst) + " " +
		"CPU per sale is per 201, summed over this process (the service and the load generator: the load generator's CPU per request is in both phases of a pair, so it dilutes the ratio; the µs per sale beside each ratio say by how much it rose), Redis, MariaDB and RocketMQ; the rest of the machine is left out (others' work on a shared machine). " +
		"The receiver runs in this process too: its CPU is measured on its own (each connection's goroutine locked to its thread, the thread's CPU time read after each delivery) and taken out of this process's; what it does not catch (a connection's first request before its handler, the runtime waking its thread) stays on the service's side. " +
		"Each judged phase samples MariaDB's processlist every 100 ms for other sessions' statements (the sampling's own, in both phases alike, are in the mariadbd column), and starts once the counted processes are quiet (after at least 2 s, under a quarter of a core over half a second, at most 20 s: each row says how long it waited).\n")
	return b.String()
}

// pairOrder says which phase of a pair runs first.
func pairOrder(withFirst bool) string {
	if withFirst {
		return "The pairs run the phase with one subscription first (-webhook-with-first), so the phase with none always runs on tables a phase larger."
	}
	return "The pairs run no subscription first, so the phase with one always runs on tables a phase larger."
}

// webhooksProfileHint is, when a webhooks target was missed, where the
// phases with one subscription spent this process's CPU beyond those with
// none.
func webhooksProfileHint(h *hooksRun) string {
	if h == nil {
		return ""
	}
	none, with := h.profiles[0], h.profiles[1]
	if none == "" || with == "" {
		return "\nA webhooks target was missed: rerun with -cpuprofile FILE for the CPU profiles of its phases with none and with one subscription (written beside FILE), and their difference.\n"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nA webhooks target was missed: the CPU profiles of its phases with no subscription and with one (this process: the service, the load generator and the receiver; MariaDB's and Redis's share is in the CPU table by process) are %s and %s; their difference (with less none, the phases as long):\n", none, with)
	// The difference, and then the delivery's own CPU in the phases with a
	// subscription (the subscriptions' goroutines: internal/webhooks and
	// its delivery job), which the difference drowns in noise.
	for _, args := range [][]string{{"-top", "-diff_base", none}, {"-top", "-cum", "-diff_base", none}, {"-top", "-cum", "-focus", "inventory/internal/webhooks"}} {
		outb, err := exec.Command("go", append(append(append([]string{"tool", "pprof"}, args...), "-nodecount=25"), with)...).Output()
		shown := slices.Clone(args)
		for i, a := range shown {
			if a == none {
				shown[i] = filepath.Base(none)
			}
		}
		fmt.Fprintf(&b, "\n`go tool pprof %s -nodecount=25 %s`\n\n```\n", strings.Join(shown, " "), filepath.Base(with))
		if err != nil {
			fmt.Fprintf(&b, "failed: %v\n", err)
		}
		b.Write(outb)
		b.WriteString("```\n")
	}
	return b.String()
}
