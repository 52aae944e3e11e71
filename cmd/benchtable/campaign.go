package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/app"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/campaign"
)

// The campaign group (-only campaign; issue 31's measures, SPEC section 7's
// campaign opening, and the hold extension): the real service in this
// process, served on a listener whose requests are counted (stmtcount.go)
// and dialing MariaDB through the counted network (wire.go). Side by side
// in one run: -campaign-openings openings (buyers and pollers across
// starts_at), each just after the seckill selling phase its selling is
// judged against (on tables as large as its own: every phase's sales stay
// in them) and the sold-out phase its requests before starts_at are judged
// against (as long as that window), then the two extension routes.
//
// SPEC section 7's two campaign targets that compare are parity within
// 10%: a request before starts_at costs no more than the sold-out answer
// (costParity), and the campaign sells at least as fast as the seckill
// selling phase less 10% (sellingParity). Both are the same work as their
// reference (the same 409 from memory; the same group-committed sale),
// so a run on either side of 1 is noise, not a regression; 10% is the
// noise of one run on the shared machine (docs/benchmarks.md).

var (
	campOpenings  = flag.Int("campaign-openings", 3, "campaign group: how many openings (the first 201's delay is their p50)")
	campAllotment = flag.Int64("campaign-allotment", 25_000, "campaign group: units each opening's campaign sells (at the seckill selling phase's rate, about as long as that phase runs)")
	campBefore    = flag.Duration("campaign-before", 3*time.Second, "campaign group: how long buyers and pollers call before each opening")
	campPollers   = flag.Int("campaign-pollers", 16, "campaign group: clients polling GET /v1/campaigns/{id} besides the -workers buyers")
)

// firstSaleTarget is SPEC section 7's bound on the time from starts_at to
// the first 201 (p50 over the openings).
const firstSaleTarget = 50 * time.Millisecond

// costParity is SPEC section 7's bound on what a request answered before
// starts_at costs against a sold-out answer (the median opening's ratio of
// CPU per answer, processCPUPerAnswer), and sellingParity its floor on the
// campaign's selling rate against the seckill selling phase's (the median
// opening's).
const (
	costParity    = 1.10
	sellingParity = 0.90
)

// campaignRun is what the campaign group measured.
type campaignRun struct {
	phases   []httpResult
	openings []opening
	extends  []extension
	wired    bool // the service's connections were counted on the wire
}

// opening is one campaign opening.
type opening struct {
	id                  string
	allotment           int64
	soldOut             float64       // the sold-out phase's requests per second: the mean of those just before and just after the opening
	cost, soldOutCost   float64       // CPU µs per answer (processCPUPerAnswer) before starts_at, and the sold-out phase's (the mean of those just before and just after); 0: not measured
	seckill             float64       // the seckill selling phase's 201s per second: the mean of those just before and just after the opening
	before              time.Duration // from the first request to starts_at
	buys, polls, others int64         // answered before starts_at: buys 409 sale_not_started, polls 200/304, anything else
	stmts               stmtCount     // the statements of the requests answered before starts_at
	commits             int64         // group commits in that window (their statements are not GORM's)
	wire                int64         // the process's database round trips in that window, background jobs included
	lateEarly           int64         // 409 sale_not_started answered after starts_at
	firstSale           time.Duration // starts_at → the first 201 read
	sales               int64         // 201s
	sellingFor          time.Duration // the first 201 → the last
	sold, left          int64         // the database's afterwards: units taken by orders, units left in the pool
	failed              int64         // requests without an answer
}

// sellingRate is the 201s per second from the first to the last.
func (o opening) sellingRate() float64 {
	if o.sales < 2 || o.sellingFor <= 0 {
		return 0
	}
	return float64(o.sales-1) / o.sellingFor.Seconds()
}

// extension is one extension route's phase.
type extension struct {
	route     string
	answers   int64 // 200s
	stmts     stmtCount
	commits   int64   // group commits in the phase
	wire      int64   // the process's round trips in the phase
	idle      float64 // the process's round trips per second in the idle second before (background jobs)
	window    time.Duration
	perAnswer float64 // round trips per extension, the idle rate taken out
}

// campaignBench runs the campaign group on its own service and database.
func campaignBench(ctx context.Context, rdb *redis.Client, dsnBase string) *campaignRun {
	prog.phase("campaign setup")
	dbName := *dbPrefix + "_campaign"
	dsn, wired := wireDSN(dsnBase)
	a, check := startService(ctx, rdb, dsn, dbName)
	defer check.Close()
	defer a.Shutdown(context.Background())
	stmts := countStatements(a.DB())
	base, stopTagged := serveTagged(a.Handler())
	defer stopTagged()
	for sku, n := range map[string]int64{"FLASH": 1_000_000_000, "GONE": 0, "EXT": 1_000_000, "EXTT": 1_000_000} {
		_, err := a.Catalog.Put(ctx, sku, n, 0)
		must(err)
	}
	buyer := func(prefix string) func(w int) http.Header {
		return func(w int) http.Header { return credentials(prefix, w) }
	}
	empty := func(int, int64) string { return `{}` }
	run := &campaignRun{wired: wired}

	// What each opening is judged against, run before the first opening,
	// between two and after the last, so that an opening's references are
	// the mean of the phases on either side of it: the seckill selling
	// phase (its selling's) and the sold-out phase (its requests before
	// starts_at's; as long as that window). Every phase's orders stay in
	// the tables and the machine drifts: a reference run only before would
	// judge each opening against a cheaper moment than its own.
	refs := func(at string) (seckill, soldOut httpResult) {
		var batch int
		seckill = sellingPhase(a, base, "seckill, selling, "+at, &batch)
		soldOut = load("seckill, sold out, "+at, base+"/v1/seckill/GONE/buy", *workers, *campBefore, buyer("g"), empty)
		run.phases = append(run.phases, seckill, soldOut)
		return seckill, soldOut
	}
	seckill, soldOut := refs("before opening #1")
	for i := range *campOpenings {
		o, rows := openCampaign(ctx, a, check, base, i, stmts)
		run.phases = append(run.phases, rows...)
		at := fmt.Sprintf("between openings #%d and #%d", i+1, i+2)
		if i == *campOpenings-1 {
			at = fmt.Sprintf("after opening #%d", i+1)
		}
		seckill2, soldOut2 := refs(at)
		o.seckill = (seckill.rate + seckill2.rate) / 2
		o.soldOut = (soldOut.rate + soldOut2.rate) / 2
		o.cost, _ = processCPUPerAnswer(rows[0])
		c1, ok1 := processCPUPerAnswer(soldOut)
		c2, ok2 := processCPUPerAnswer(soldOut2)
		if ok1 && ok2 {
			o.soldOutCost = (c1 + c2) / 2
		}
		run.openings = append(run.openings, o)
		seckill, soldOut = seckill2, soldOut2
	}
	run.extends, run.phases = extendPhases(ctx, a, base, stmts, run.phases)
	return run
}

// openCampaign puts campaign i opening -campaign-before from now and has
// -workers buyers (closed loop, POST .../buy) call it until its allotment
// is sold, and -campaign-pollers pollers (closed loop, GET: the countdown,
// revalidated by its ETag)
// until starts_at; then checks the database. The selling is judged
// against the seckill selling phase, which has the buyers alone.
func openCampaign(ctx context.Context, a *app.App, check *sql.DB, base string, i int, stmts *stmtCounter) (opening, []httpResult) {
	id, sku := fmt.Sprintf("OPEN-%d", i+1), fmt.Sprintf("CAMP-%d", i+1)
	beforeName := fmt.Sprintf("campaign #%d, before the opening", i+1)
	sellName := fmt.Sprintf("campaign #%d, selling", i+1)
	prog.phase(beforeName)
	_, err := a.Catalog.Put(ctx, sku, *campAllotment, 0)
	must(err)
	startsAt := time.Now().Add(*campBefore).UTC().Truncate(time.Microsecond)
	_, err = a.Campaigns.Put(ctx, id, campaign.Spec{SKU: sku, Allotment: *campAllotment, StartsAt: startsAt, EndsAt: startsAt.Add(time.Hour)}, nil)
	must(err)
	o := opening{id: id, allotment: *campAllotment}

	// Before the opening: the statements, group commits and round trips of
	// the window, and the CPU and profile of the sub-phase.
	stopCPU, stopProf := measureCPU(beforeName), profilePhase(beforeName)
	closeStmts := stmts.window()
	commits0 := a.Commits.Stats().Commits.Load()
	wire0 := readWire()
	start := time.Now()

	var stop atomic.Bool
	var sales, first, last atomic.Int64 // 201s; first and last 201 in Unix ns
	// The buyers stop when the allotment's 201s are in, or a second after
	// the first sold-out answer (a sale answered 503 "it may have been
	// recorded" is no 201, yet sold), or at the deadline.
	var soldOutAt atomic.Int64
	deadline := startsAt.Add(max(15*time.Second, 3**duration))
	going := func(now time.Time) bool {
		at := soldOutAt.Load()
		return !stop.Load() && now.Before(deadline) && (at == 0 || now.UnixNano() < at+int64(time.Second))
	}
	type tally struct {
		buys, polls, others, lateEarly, failed int64
		before, after                          map[int]int64
		latBefore, latSelling                  []time.Duration
	}
	tallies := make([]tally, *workers+*campPollers)
	var wg sync.WaitGroup
	for w := range tallies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := &tallies[w]
			t.before, t.after = map[int]int64{}, map[int]int64{}
			poller := w >= *workers
			var c *rawClient
			if poller {
				// A product page: it revalidates the countdown it holds
				// (If-None-Match), as a browser does once max-age is past.
				c = newRawRequest(http.MethodGet, base+"/v1/campaigns/"+id, credentials("p", w), 10*time.Second)
				c.revalidate = true
			} else {
				h := credentials("k", w)
				h.Set("Content-Type", "application/json")
				c = newRawClient(base+"/v1/campaigns/"+id+"/buy", h, 10*time.Second)
			}
			defer c.Close()
			body := `{}`
			if poller {
				body = ""
			}
			for going(time.Now()) {
				t0 := time.Now()
				if poller && !t0.Before(startsAt) {
					return // the page shows the buy button: its buyer is among the buyers
				}
				status, err := c.post(body)
				t1 := time.Now()
				if err != nil {
					t.failed++
					continue
				}
				early := status == http.StatusConflict && c.retryAfter
				if t1.Before(startsAt) {
					t.before[status]++
					switch {
					case poller && (status == http.StatusOK || status == http.StatusNotModified):
						t.polls++
					case !poller && early:
						t.buys++
					default:
						t.others++
					}
					t.latBefore = append(t.latBefore, t1.Sub(t0))
					continue
				}
				t.after[status]++
				if early {
					t.lateEarly++
				}
				if status == http.StatusConflict && !early && !poller {
					soldOutAt.CompareAndSwap(0, t1.UnixNano())
				}
				if status == http.StatusCreated {
					t.latSelling = append(t.latSelling, t1.Sub(t0))
					ns := t1.UnixNano()
					for f := first.Load(); (f == 0 || ns < f) && !first.CompareAndSwap(f, ns); f = first.Load() {
					}
					for l := last.Load(); ns > l && !last.CompareAndSwap(l, ns); l = last.Load() {
					}
					if sales.Add(1) >= o.allotment {
						stop.Store(true)
					}
				}
			}
		}()
	}
	// At starts_at: close the window of the requests before the opening.
	time.Sleep(time.Until(startsAt))
	o.before = startsAt.Sub(start)
	o.stmts = closeStmts()
	o.commits = a.Commits.Stats().Commits.Load() - commits0
	o.wire = readWire().Since(wire0).RoundTrips()
	stopProf()
	stopCPU()
	stopCPU, stopProf = measureCPU(sellName), profilePhase(sellName)
	closeSelling := stmts.window()
	cs := a.Commits.Stats()
	commits0, reqs0, nanos0 := cs.Commits.Load(), cs.Requests.Load(), cs.Nanos.Load()
	wg.Wait()
	stopProf()
	stopCPU()
	sellWall := time.Since(startsAt)
	sellStmts := closeSelling()
	commits, reqs, nanos := cs.Commits.Load()-commits0, cs.Requests.Load()-reqs0, cs.Nanos.Load()-nanos0

	before := httpResult{name: beforeName, codes: map[int]int64{}}
	after := httpResult{name: sellName, codes: map[int]int64{}}
	var latBefore, latSelling []time.Duration
	for _, t := range tallies {
		o.buys, o.polls, o.others, o.lateEarly, o.failed = o.buys+t.buys, o.polls+t.polls, o.others+t.others, o.lateEarly+t.lateEarly, o.failed+t.failed
		for k, v := range t.before {
			before.codes[k] += v
		}
		for k, v := range t.after {
			after.codes[k] += v
		}
		latBefore, latSelling = append(latBefore, t.latBefore...), append(latSelling, t.latSelling...)
	}
	o.sales = sales.Load()
	if f := first.Load(); f > 0 {
		o.firstSale = time.Unix(0, f).Sub(startsAt)
		o.sellingFor = time.Duration(last.Load() - f)
	}
	before.rate = float64(o.buys+o.polls+o.others) / o.before.Seconds()
	before.p50, before.p99 = percentiles(latBefore)
	before.note = fmt.Sprintf("%d buyers and %d pollers for %s: %d buys answered 409 sale_not_started (%.0f/s), %d polls (%.0f/s); database statements of these requests: %d%s; group commits: %d; the process's round trips in the window, background jobs included: %d (statements not of these requests: %d)",
		*workers, *campPollers, o.before.Round(time.Millisecond), o.buys, float64(o.buys)/o.before.Seconds(), o.polls, float64(o.polls)/o.before.Seconds(),
		o.stmts.tagged, parenthesised(o.stmts.describe()), o.commits, o.wire, o.stmts.untagged)
	after.rate = o.sellingRate()
	after.p50, after.p99 = percentiles(latSelling)

	// The database's account: units taken by orders, and left in the pool.
	waitProjected(ctx, a)
	must(check.QueryRowContext(ctx, `SELECT COALESCE(SUM(qty), 0) FROM stock_reservations
		WHERE campaign_id = ? AND token <> ? AND order_id IS NOT NULL`, id, arbiter.CampaignToken(id)).Scan(&o.sold))
	must(check.QueryRowContext(ctx, `SELECT COALESCE(SUM(qty), 0) FROM stock_reservations WHERE token = ?`, arbiter.CampaignToken(id)).Scan(&o.left))
	after.note = fmt.Sprintf("first 201 %s after starts_at; %d 201s in %s (201s per second from the first to the last; the phase ran %s); sold %d of %d, %d left in the pool, oversell %d",
		dur(o.firstSale), o.sales, o.sellingFor.Round(time.Millisecond), sellWall.Round(time.Millisecond), o.sold, o.allotment, o.left, max(o.sold-o.allotment, 0))
	if commits > 0 {
		after.note += fmt.Sprintf("; %d group commits: %.1f requests and %s each", commits, float64(reqs)/float64(commits), dur(time.Duration(nanos/commits)))
	}
	after.note += fmt.Sprintf("; statements outside the group commit: %.2f per 201 (%s)", perAnswer(sellStmts.tagged, o.sales), sellStmts.describe())
	if o.lateEarly > 0 {
		after.note += fmt.Sprintf("; %d answered 409 sale_not_started after starts_at", o.lateEarly)
	}
	if o.failed > 0 {
		after.note += fmt.Sprintf("; %d requests failed", o.failed)
	}
	return o, []httpResult{before, after}
}

// extendPhases measures both extension routes: each client extends a hold
// of its own (an order of its buyer's, a token hold) again and again, each
// time to 30 minutes from now, so every call moves the deadline (the hot
// path: the conditional UPDATE matches).
func extendPhases(ctx context.Context, a *app.App, base string, stmts *stmtCounter, rows []httpResult) ([]extension, []httpResult) {
	prog.phase("extend setup")
	ids := make([]string, *workers)
	for w := range ids {
		o, err := a.Orders.Create(ctx, fmt.Sprintf("e%d", w), "", []inventory.Line{{SKU: "EXT", Qty: 1}})
		must(err)
		ids[w] = o.ID
		_, err = a.Tokens.Reserve(ctx, "EXTT", 1, fmt.Sprintf("hold-%d", w))
		must(err)
	}
	d := max(*duration/2, time.Second)
	var exts []extension
	for _, route := range []string{"POST /v1/orders/{id}/extend", "POST /v1/stock/extend"} {
		name := "orders extend"
		url := func(w int) string { return base + "/v1/orders/" + ids[w] + "/extend" }
		body := func(int, int64) string { return `{"seconds":1800}` }
		if route == "POST /v1/stock/extend" {
			name = "stock extend"
			url = func(int) string { return base + "/v1/stock/extend" }
			body = func(w int, _ int64) string { return fmt.Sprintf(`{"sku":"EXTT","token":"hold-%d","seconds":1800}`, w) }
		}
		// Each client extends once first, all at once, untimed: the
		// connections an extension needs are opened (each new one costs its
		// session's settings, a round trip the hot path does not pay) before
		// the window counts. Then the background jobs' round trips, from an
		// idle second.
		prog.phase(name)
		warmUp(url, body, func(w int) http.Header { return credentials("e", w) })
		idle0 := readWire()
		time.Sleep(time.Second)
		idle := float64(readWire().Since(idle0).RoundTrips())
		e := extension{route: route, idle: idle}
		closeStmts := stmts.window()
		commits0 := a.Commits.Stats().Commits.Load()
		wire0 := readWire()
		start := time.Now()
		r := loadEach(name, url, *workers, d, func(w int) http.Header { return credentials("e", w) }, body)
		e.window = time.Since(start)
		e.wire = readWire().Since(wire0).RoundTrips()
		e.commits = a.Commits.Stats().Commits.Load() - commits0
		e.stmts = closeStmts()
		e.answers = r.codes[http.StatusOK]
		if e.answers > 0 {
			e.perAnswer = (float64(e.wire) - e.idle*e.window.Seconds()) / float64(e.answers)
		}
		r.note = fmt.Sprintf("%s: %.2f statements per 200 (%s) in %.2f transactions, %.2f round trips per 200 (%d in the phase, background jobs ~%.0f/s taken out); group commits: %d",
			route, perAnswer(e.stmts.tagged, e.answers), e.stmts.describe(), perAnswer(int64(e.stmts.txs), e.answers), e.perAnswer, e.wire, e.idle, e.commits)
		rows = append(rows, r)
		exts = append(exts, e)
	}
	return exts, rows
}

// warmUp sends each of the workers' first request at once and waits for
// the answers.
func warmUp(url func(w int) string, body func(w int, seq int64) string, header func(w int) http.Header) {
	var wg sync.WaitGroup
	for w := range *workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := header(w)
			h.Set("Content-Type", "application/json")
			c := newRawClient(url(w), h, 10*time.Second)
			defer c.Close()
			_, _ = c.post(body(w, -1))
		}()
	}
	wg.Wait()
}

func perAnswer(n, answers int64) float64 {
	if answers == 0 {
		return 0
	}
	return float64(n) / float64(answers)
}

func parenthesised(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

// percentiles is the p50 and p99 of lat (sorted in place).
func percentiles(lat []time.Duration) (time.Duration, time.Duration) {
	if len(lat) == 0 {
		return 0, 0
	}
	slices.Sort(lat)
	return lat[len(lat)/2], lat[len(lat)*99/100]
}

// campaignChecks are the campaign group's targets.
func campaignChecks(c *campaignRun) []check {
	if c == nil || len(c.openings) == 0 {
		return nil
	}
	var buys, polls, stmtsN, commits, wire, untagged int64
	var before time.Duration
	var toSoldOut, costs, toSeckill []float64
	var pairs, sellPairs []string
	var first []float64
	var shapes, firsts, sold []string
	soldOK, oversell := true, int64(0)
	for _, o := range c.openings {
		buys, polls, stmtsN, commits, wire, untagged = buys+o.buys, polls+o.polls, stmtsN+o.stmts.tagged, commits+o.commits, wire+o.wire, untagged+o.stmts.untagged
		before += o.before
		if o.cost > 0 && o.soldOutCost > 0 {
			costs = append(costs, o.cost/o.soldOutCost)
			pairs = append(pairs, fmt.Sprintf("#%s: %.1f / %.1f µs, %.2f×",
				strings.TrimPrefix(o.id, "OPEN-"), o.cost, o.soldOutCost, o.cost/o.soldOutCost))
		}
		if rate := float64(o.buys+o.polls+o.others) / o.before.Seconds(); o.soldOut > 0 {
			toSoldOut = append(toSoldOut, rate/o.soldOut)
		}
		if rate := o.sellingRate(); rate > 0 && o.seckill > 0 {
			toSeckill = append(toSeckill, rate/o.seckill)
			sellPairs = append(sellPairs, fmt.Sprintf("#%s: %.0f / %.0f per s", strings.TrimPrefix(o.id, "OPEN-"), rate, o.seckill))
		}
		if o.sales > 0 {
			first = append(first, float64(o.firstSale))
			firsts = append(firsts, dur(o.firstSale))
		} else {
			firsts = append(firsts, "no 201")
		}
		if d := o.stmts.describe(); d != "" {
			shapes = append(shapes, fmt.Sprintf("#%s: %s", strings.TrimPrefix(o.id, "OPEN-"), d))
		}
		oversell += max(o.sold-o.allotment, 0)
		soldOK = soldOK && o.sold == o.allotment && o.left == 0
		line := fmt.Sprintf("%d of %d (201s: %d)", o.sold, o.allotment, o.sales)
		if o.left > 0 {
			line = fmt.Sprintf("%d of %d (201s: %d; %d left in the pool: not sold out when the phase stopped)", o.sold, o.allotment, o.sales, o.left)
		}
		sold = append(sold, line)
	}
	var cs []check
	k := check{what: fmt.Sprintf("campaign opening: cost of a request answered before starts_at (%d buyers' 409 sale_not_started and %d pollers' GETs) / the sold-out answer's (the sold-out phases run just before and just after each opening, their mean); cost: CPU µs per answer of this process (the service and its load generator; neither answer sends anything to the servers, whose CPU is shared with the machine's other runs), from /proc over each window; median of the openings", *workers, *campPollers),
		target: fmt.Sprintf("≤ %.2f×", costParity), state: unmeasured, measured: "–"}
	if len(pairs) == len(c.openings) {
		r := median(costs)
		k.measured = fmt.Sprintf("%.2f× (%s)", r, strings.Join(pairs, "; "))
		k.state = missed
		if r <= costParity {
			k.state = met
		}
	}
	if len(toSoldOut) > 0 {
		k.measured += fmt.Sprintf("; not judged: requests per second before starts_at %.2f× the sold-out phase's (median), of them the buys alone (409 sale_not_started) %.0f/s",
			median(toSoldOut), float64(buys)/before.Seconds())
	}
	cs = append(cs, k)
	k = check{what: "campaign opening: database statements of the requests before starts_at (counted in the service: its GORM statements under those requests' contexts, and group commits)",
		measured: fmt.Sprintf("%d statements, %d group commits", stmtsN, commits), target: "0", state: met}
	if len(shapes) > 0 {
		k.measured += " (" + strings.Join(shapes, "; ") + ")"
	}
	if stmtsN+commits > 0 {
		k.state = missed
	}
	k.measured += fmt.Sprintf("; beside them, the background jobs' statements: %d; the process's round trips in those windows: %d", untagged, wire)
	cs = append(cs, k)
	k = check{what: fmt.Sprintf("campaign opening: starts_at → the first 201, p50 over the openings (%d)", len(c.openings)),
		target: fmt.Sprintf("≤ %s", firstSaleTarget), state: unmeasured, measured: "no 201"}
	if len(first) > 0 {
		p50 := time.Duration(median(first))
		k.measured = fmt.Sprintf("%s (%s)", dur(p50), strings.Join(firsts, ", "))
		k.state = missed
		if p50 <= firstSaleTarget && len(first) == len(c.openings) {
			k.state = met
		}
	}
	cs = append(cs, k)
	k = check{what: "campaign selling / the seckill selling phases run just before and just after the opening (201s per second, their mean; the campaign's from its first 201 to its last; median of the openings)",
		target: fmt.Sprintf("≥ %.0f%%", 100*sellingParity), state: unmeasured, measured: "–"}
	if len(sellPairs) == len(c.openings) {
		r := median(toSeckill)
		k.measured = fmt.Sprintf("%.0f%% (%s)", 100*r, strings.Join(sellPairs, "; "))
		k.state = missed
		if r >= sellingParity {
			k.state = met
		}
	}
	cs = append(cs, k)
	k = check{what: "campaign opening: sold = allotment (the database's account, every opening; a sale answered 503 \"it may have been recorded\" is sold without a 201), oversell",
		measured: fmt.Sprintf("sold %s; oversell %d", strings.Join(sold, ", "), oversell), target: "sold = allotment, oversell 0", state: met}
	if !soldOK || oversell != 0 {
		k.state = missed
	}
	cs = append(cs, k)
	for _, e := range c.extends {
		k := check{what: "database round trips per " + e.route + " (the hot path: every call moves the deadline)",
			target: "≤ 1", state: unmeasured, measured: "no 200"}
		if !c.wired {
			k.measured = "not counted: -mysql does not name a tcp(...) address"
		} else if e.answers > 0 {
			k.measured = fmt.Sprintf("%.2f round trips; %.2f statements (%s) in %.2f transactions per extension",
				e.perAnswer, perAnswer(e.stmts.tagged, e.answers), e.stmts.describe(), float64(e.stmts.txs)/float64(e.answers))
			k.state = missed
			if e.perAnswer <= 1.005 { // the background jobs' rate is taken out as a mean
				k.state = met
			}
		}
		cs = append(cs, k)
	}
	for i := range cs {
		cs[i].group = "campaign"
	}
	return cs
}

// campaignTable is the campaign group's phases, as the HTTP table.
func campaignTable(c *campaignRun) string {
	if c == nil {
		return ""
	}
	var b strings.Builder
	phaseTable(&b, fmt.Sprintf("campaign group, %d clients (openings: %d buyers + %d pollers)", *workers, *workers, *campPollers), c.phases)
	b.WriteString("\nA campaign's row \"before the opening\" counts the answers read before starts_at (requests per second of all of them); its row \"selling\" gives 201s per second from the first 201 to the last, and its p50 and p99 are the 201s' latencies.\n")
	return b.String()
}
