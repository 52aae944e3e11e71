package main

// Latency under an arrival rate (SPEC section 7, issue 33): the seckill
// selling phase driven open loop, at a constant rate that is a share of the
// capacity the closed-loop phase measured in the same run. Each request has
// an intended send time on a fixed schedule (request i at start + i/rate)
// and its latency is its completion less that intended time, so a request
// that could not be sent on time (every sender busy, or the process not
// scheduled) counts its wait: no coordinated omission. The latencies are
// kept as exact samples and sorted (a phase is at most a few tens of
// thousands of requests), so every percentile is exact.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/acme/inventory/internal/app"
)

var (
	openSenders = flag.Int("openloop-senders", 256, "the least number of senders (each a keep-alive connection) of an open-loop phase")
	openProcess = flag.Bool("openloop-process", true, "run the open-loop load generator in a process of its own (false: in this one, beside the service)")
	openChildF  = flag.Bool("openloop-child", false, "internal: be an open-loop generator's process (the job on standard input)")
	openWindow  = flag.Duration("openloop-window", 500*time.Millisecond, "an open-loop phase has enough senders for this long a window of its requests in flight at once")
	external    = flag.Bool("external", true, "drive the seckill selling phase with wrk and vegeta too (the honest-load-generator check); they must be installed (scripts/bench.sh does)")
	wrkPath     = flag.String("wrk", "wrk", "the wrk binary")
	vegetaPath  = flag.String("vegeta", "vegeta", "the vegeta binary")
	flushCheck  = flag.Bool("flush-check", true, "run the selling phase once more with innodb_flush_log_at_trx_commit=2 (SET GLOBAL, restored after) for the commit-latency breakdown")
)

// openLate is how late a request may start against its schedule before it
// is counted as started late in the table.
const openLate = time.Millisecond

// schedule is an open-loop phase's arrivals: n requests, request i meant
// to be sent at start + i/rate.
type schedule struct {
	start time.Time
	rate  float64 // requests per second
	n     int
}

func newSchedule(start time.Time, rate float64, d time.Duration) schedule {
	return schedule{start: start, rate: rate, n: int(math.Round(rate * d.Seconds()))}
}

// at is request i's intended send time.
func (s schedule) at(i int) time.Time {
	return s.start.Add(time.Duration(float64(i) * float64(time.Second) / s.rate))
}

// latencyDist is a latency distribution, from exact samples.
type latencyDist struct {
	n                        int
	p50, p90, p99, p999, max time.Duration
}

// percentile is the nearest-rank q-quantile (0 < q ≤ 1) of sorted: the
// smallest sample that at least q of the samples do not exceed.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// distribution summarises sorted latencies.
func distribution(sorted []time.Duration) latencyDist {
	if len(sorted) == 0 {
		return latencyDist{}
	}
	return latencyDist{n: len(sorted), p50: percentile(sorted, 0.50), p90: percentile(sorted, 0.90),
		p99: percentile(sorted, 0.99), p999: percentile(sorted, 0.999), max: sorted[len(sorted)-1]}
}

// openStats is what an open-loop run recorded.
type openStats struct {
	lat         []time.Duration // completion − intended send time, sorted (answered requests)
	late        []time.Duration // actual send − intended send time, sorted (every request)
	codes       map[int]int64   // answers by status; -1: no answer (an error)
	maxInFlight int             // the most requests in flight at once
	senders     int
	elapsed     time.Duration // from the schedule's start to the last completion
}

// startedLate is how many requests started more than openLate after their
// intended time.
func (s openStats) startedLate() int {
	i, _ := slices.BinarySearch(s.late, openLate+1)
	return len(s.late) - i
}

// answered is how many requests were answered (any status).
func (s openStats) answered() int64 { return answeredOf(s.codes) }

// answeredOf is how many answers codes counts (any status; -1 is none).
func answeredOf(codes map[int]int64) int64 {
	var n int64
	for code, k := range codes {
		if code >= 0 {
			n += k
		}
	}
	return n
}

// runSchedule sends s's requests from senders goroutines: each takes the
// next request of the schedule, waits for its intended time if it is early,
// and sends it with send(w) (w is the sender). A request taken when every
// sender was busy is sent late, and its latency still counts from its
// intended time.
func runSchedule(s schedule, senders int, send func(w int) (int, error)) openStats {
	var next, inFlight, maxIn, lastDone atomic.Int64
	lat := make([][]time.Duration, senders)
	late := make([][]time.Duration, senders)
	codes := make([]map[int]int64, senders)
	var wg sync.WaitGroup
	for w := range senders {
		codes[w] = map[int]int64{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= s.n {
					return
				}
				due := s.at(i)
				if d := time.Until(due); d > 0 {
					time.Sleep(d)
				}
				began := time.Now()
				k := inFlight.Add(1)
				for m := maxIn.Load(); k > m && !maxIn.CompareAndSwap(m, k); m = maxIn.Load() {
				}
				status, err := send(w)
				done := time.Now()
				inFlight.Add(-1)
				late[w] = append(late[w], max(began.Sub(due), 0))
				for t := lastDone.Load(); done.UnixNano() > t && !lastDone.CompareAndSwap(t, done.UnixNano()); t = lastDone.Load() {
				}
				if err != nil {
					codes[w][-1]++
					continue
				}
				lat[w] = append(lat[w], done.Sub(due))
				codes[w][status]++
			}
		}()
	}
	wg.Wait()
	st := openStats{lat: slices.Concat(lat...), late: slices.Concat(late...), codes: map[int]int64{},
		maxInFlight: int(maxIn.Load()), senders: senders}
	slices.Sort(st.lat)
	slices.Sort(st.late)
	for _, c := range codes {
		for k, v := range c {
			st.codes[k] += v
		}
	}
	if t := lastDone.Load(); t > 0 {
		st.elapsed = time.Unix(0, t).Sub(s.start)
	}
	return st
}

// arrivalRow is one line of the arrival-rate table: a phase driven by
// this benchmark's generator or another's.
type arrivalRow struct {
	name      string
	generator string  // "ours", or the other tool and its version
	loop      string  // "closed, 64 clients" or "open, 2500/s"
	rate      float64 // requests answered per second
	dist      latencyDist
	noP999    bool // the tool does not report p99.9
	late      string
	codes     map[int]int64
	note      string
	err       string // the phase could not be run: why
}

// arrivalRun is the latency-under-an-arrival-rate measurements of a run.
type arrivalRun struct {
	capacity float64 // the closed-loop selling phase's rate
	rows     []arrivalRow
	// Indexes into rows (-1: not run): our closed-loop selling phase, wrk
	// beside it, our open-loop selling phases at 50% and 80% of capacity,
	// vegeta beside ours at 50%.
	closedIdx, wrkIdx, againIdx, p50Idx, p80Idx, vegetaIdx, p50AgainIdx int
	external                                                            bool   // the other generators were asked for (-external)
	breakdown                                                           string // the commit-latency breakdown
	load                                                                string // the load average after the selling phases
}

func newArrivalRun(capacity float64) *arrivalRun {
	return &arrivalRun{capacity: capacity, external: *external, closedIdx: -1, wrkIdx: -1, againIdx: -1, p50AgainIdx: -1, p50Idx: -1, p80Idx: -1, vegetaIdx: -1}
}

// openLoadSenders is how many senders (each a keep-alive connection) an
// open-loop phase has: at least -openloop-senders, and enough for every
// request of -openloop-window to be in flight at once, so the senders run
// out only when answers take longer than that (and then the wait still
// counts in the latencies, from the intended send times).
func openLoadSenders(rate float64) int {
	return max(*openSenders, int(math.Ceil(rate*openWindow.Seconds())))
}

// openLoad drives url open loop at rate requests per second for d, from
// a process of its own (-openloop-process; in this one otherwise), each
// sender with its own keep-alive connection (dialled before the schedule
// starts) and the headers header(w), every request with body. It returns
// the phase as the HTTP table shows it and as the arrival-rate table does.
//
// Why a process of its own: on a machine others load too, the kernel
// shares the cores among threads, and the service's process has as many
// running threads as GOMAXPROCS whether the load generator runs in it or
// not; a generator inside it takes its CPU from the service, one in a
// process of its own (as wrk and vegeta are) does not, so only then are
// ours and theirs driven alike (docs/benchmarks.md has the runs).
func openLoad(name, url string, rate float64, d time.Duration, header func(w int) http.Header, body string) (httpResult, arrivalRow) {
	job := openJob{URL: url, Rate: rate, Duration: d, Body: body}
	for w := range openLoadSenders(rate) {
		h := header(w)
		h.Set("Content-Type", "application/json")
		job.Headers = append(job.Headers, h)
	}
	prog.phase(name)
	stopCPU := measureCPU(name)
	stopProf := profilePhase(name)
	var st openStats
	if *openProcess {
		st = job.runChild()
	} else {
		st = job.run()
	}
	stopProf()
	stopCPU()
	senders := len(job.Headers)
	row := arrivalRow{name: name, generator: "ours", loop: fmt.Sprintf("open, %.0f/s", rate), dist: distribution(st.lat), codes: st.codes}
	if st.elapsed > 0 {
		row.rate = float64(st.answered()) / st.elapsed.Seconds()
	}
	row.late = fmt.Sprintf("%d of %d started > %s late (p99 %s, max %s); %d senders, at most %d in flight",
		st.startedLate(), len(st.late), openLate, dur(percentile(st.late, 0.99)), dur(percentile(st.late, 1)), senders, st.maxInFlight)
	if st.maxInFlight >= senders {
		row.late += ": every sender was busy at once, so some requests waited for a sender (their wait counts in their latency)"
	}
	if *openProcess {
		row.generator = "ours, own process"
	}
	r := httpResult{name: name, rate: row.rate, p50: row.dist.p50, p99: row.dist.p99, dist: row.dist, codes: st.codes,
		note: fmt.Sprintf("open loop at %.0f/s (%s), latency from each request's intended send time; %s", rate, row.generator, row.late)}
	return r, row
}

// openJob is an open-loop phase: what openLoad hands a process of its own.
type openJob struct {
	URL      string
	Rate     float64
	Duration time.Duration
	Headers  []http.Header // one per sender
	Body     string
}

// openResult is openStats as a child process writes it.
type openResult struct {
	Lat, Late   []time.Duration
	Codes       map[int]int64
	MaxInFlight int
	Elapsed     time.Duration
}

// run runs the job in this process.
func (j openJob) run() openStats {
	clients := make([]*rawClient, len(j.Headers))
	for w, h := range j.Headers {
		clients[w] = newRawClient(j.URL, h, 10*time.Second)
		must(clients[w].dial())
	}
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	return runSchedule(newSchedule(time.Now().Add(20*time.Millisecond), j.Rate, j.Duration), len(clients), func(w int) (int, error) {
		return clients[w].post(j.Body)
	})
}

// runChild runs the job in a process of its own: this program again, with
// -openloop-child, the job on its standard input and the result on its
// standard output.
func (j openJob) runChild() openStats {
	self, err := os.Executable()
	must(err)
	in, err := json.Marshal(j)
	must(err)
	cmd := exec.Command(self, "-openloop-child")
	cmd.Stdin = bytes.NewReader(in)
	cmd.Stderr = os.Stderr
	outb, err := cmd.Output()
	if err != nil {
		must(fmt.Errorf("the open-loop generator's process: %w", err))
	}
	var res openResult
	must(json.Unmarshal(outb, &res))
	return openStats{lat: res.Lat, late: res.Late, codes: res.Codes, maxInFlight: res.MaxInFlight, senders: len(j.Headers), elapsed: res.Elapsed}
}

// openChild is the -openloop-child process: it runs the job on its
// standard input and writes the result to its standard output.
func openChild() {
	var j openJob
	must(json.NewDecoder(os.Stdin).Decode(&j))
	st := j.run()
	must(json.NewEncoder(os.Stdout).Encode(openResult{Lat: st.lat, Late: st.late, Codes: st.codes, MaxInFlight: st.maxInFlight, Elapsed: st.elapsed}))
}

// dial connects c now (post dials on first use otherwise), so an open-loop
// phase's first requests do not pay for the connection.
func (c *rawClient) dial() error {
	if c.conn != nil {
		return nil
	}
	conn, err := net.DialTimeout("tcp", c.addr, c.timeout)
	if err != nil {
		return err
	}
	c.conn, c.r = conn, bufio.NewReaderSize(conn, 4096)
	return nil
}

// closedRow is our closed-loop phase r as a row of the arrival-rate table.
func closedRow(r httpResult, clients int) arrivalRow {
	return arrivalRow{name: r.name, generator: "ours", loop: fmt.Sprintf("closed, %d clients", clients),
		rate: r.rate, dist: r.dist, codes: r.codes, late: "–"}
}

// agreement is theirs/ours as "1.05×", and whether it is within 15%.
func agreement(theirs, ours float64) (string, bool) {
	if theirs <= 0 || ours <= 0 {
		return "–", false
	}
	r := theirs / ours
	return fmt.Sprintf("%.2f×", r), r >= 0.85 && r <= 1.15
}

// arrivalChecks are SPEC section 7's arrival-rate targets.
func arrivalChecks(ar *arrivalRun) []check {
	if ar == nil {
		return nil
	}
	var cs []check
	for _, t := range []struct {
		row   *arrivalRow
		share string
		bound time.Duration
	}{{ar.row(ar.p50Idx), "50%", 20 * time.Millisecond}, {ar.row(ar.p80Idx), "80%", 50 * time.Millisecond}} {
		c := check{what: fmt.Sprintf("seckill selling, open loop at %s of the closed loop's rate: p99 from the intended send time", t.share),
			target: "≤ " + t.bound.String(), state: unmeasured, measured: "–"}
		if t.row != nil && t.row.dist.n > 0 {
			c.measured = fmt.Sprintf("%s at %s", dur(t.row.dist.p99), strings.TrimPrefix(t.row.loop, "open, "))
			c.state = missed
			others := answeredOf(t.row.codes) - t.row.codes[201] + t.row.codes[-1]
			if t.row.dist.p99 <= t.bound && others == 0 {
				c.state = met
			}
			if others > 0 {
				c.measured += fmt.Sprintf(", %d of %d requests not answered 201", others, answeredOf(t.row.codes)+t.row.codes[-1])
			}
		}
		cs = append(cs, c)
	}
	for _, p := range []struct {
		what         string
		theirs, ours *arrivalRow
		judgeRate    bool
	}{
		{"wrk / ours (the mean of ours before and after it), seckill selling closed loop at the same connections: requests/s and p50 agree within 15%", ar.row(ar.wrkIdx), ar.closedOurs(), true},
		{"vegeta / ours (the mean of ours before and after it), seckill selling open loop at 50%: p50 agrees within 15% (the rate is the schedule's)", ar.row(ar.vegetaIdx), ar.openOurs(), false},
	} {
		c := check{what: p.what, target: "0.85-1.15×", state: unmeasured, measured: "not run (-external=false)"}
		switch {
		case p.theirs == nil && ar.external:
			c.measured, c.state = "not run", missed
		case p.theirs == nil:
		case p.theirs.err != "":
			c.measured, c.state = "not run: "+p.theirs.err, missed
		case p.ours == nil:
			c.measured = "ours not run"
		default:
			rate, rateOK := agreement(p.theirs.rate, p.ours.rate)
			p50, p50OK := agreement(float64(p.theirs.dist.p50), float64(p.ours.dist.p50))
			p99, _ := agreement(float64(p.theirs.dist.p99), float64(p.ours.dist.p99))
			c.measured = fmt.Sprintf("requests/s %s, p50 %s (p99 %s, not judged)", rate, p50, p99)
			c.state = met
			if !p50OK || (p.judgeRate && !rateOK) {
				c.state = missed
			}
		}
		cs = append(cs, c)
	}
	return cs
}

// arrivalTable is the arrival-rate table: our phases and the other
// generators', each latency distribution beside the closed loop's.
func arrivalTable(ar *arrivalRun) string {
	if ar == nil || len(ar.rows) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n| latency under an arrival rate (open loop: a share of the closed loop's rate above it; seckill selling's %.0f/s) | generator | loop | requests/s | p50 | p90 | p99 | p99.9 | max | answers | started late |\n|---|---|---|---:|---:|---:|---:|---:|---:|---|---|\n", ar.capacity)
	for _, r := range ar.rows {
		if r.err != "" {
			fmt.Fprintf(&b, "| %s | %s | %s | – | – | – | – | – | – | not run: %s | |\n", r.name, r.generator, r.loop, r.err)
			continue
		}
		p999 := dur(r.dist.p999)
		if r.noP999 {
			p999 = "(not reported)"
		}
		cell := fmt.Sprint(r.codes)
		if r.note != "" {
			cell += "; " + r.note
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %.0f | %s | %s | %s | %s | %s | %s | %s |\n", r.name, r.generator, r.loop, r.rate,
			dur(r.dist.p50), dur(r.dist.p90), dur(r.dist.p99), p999, dur(r.dist.max), cell, r.late)
	}
	b.WriteString("\nOpen loop: each request has an intended send time on a fixed schedule and its latency runs from that time to its answer " +
		"(a request sent late because every sender was busy, or the process was not scheduled, counts its wait); closed loop: from the send to the answer. " +
		"Our percentiles are exact (every sample kept and sorted, nearest rank); wrk's are its own (its Lua `done` hook), vegeta's its own `report -type=json`, " +
		"whose latency runs from when it sent each request.\n")
	fmt.Fprintf(&b, "Load average (1, 5, 15 min) after the seckill selling phases above: %s.\n", ar.load)
	b.WriteString(ar.breakdown)
	return b.String()
}

// add records row in the table and returns it (its address, for the checks).
func (ar *arrivalRun) add(row arrivalRow) *arrivalRow {
	ar.rows = append(ar.rows, row)
	return &ar.rows[len(ar.rows)-1]
}

// clientHeaders is the headers of the closed loop's n clients.
func clientHeaders(header func(w int) http.Header, n int) []http.Header {
	hs := make([]http.Header, n)
	for w := range hs {
		hs[w] = header(w)
	}
	return hs
}

// closedBeside records our closed-loop selling phase and, with -external,
// drives the same requests with wrk, closed loop at the same number of
// connections, right after it, then ours again: wrk is judged against the
// mean of ours before and after it, so a drift of the machine's load over
// the three lands on both sides. It returns the phases it ran.
func (ar *arrivalRun) closedBeside(a *app.App, ours httpResult, url string, header func(w int) http.Header, body string) []httpResult {
	ar.closedIdx = len(ar.rows)
	ar.add(closedRow(ours, *workers))
	if !*external {
		return nil
	}
	var row arrivalRow
	var batch int
	r := withGroupCommits(a, &batch, func() httpResult {
		r, rw := wrkRun(ours.name+", wrk", url, *workers, *duration, clientHeaders(header, *workers), body)
		row = rw
		return r
	})
	ar.wrkIdx = len(ar.rows)
	ar.add(row)
	again := withGroupCommits(a, &batch, func() httpResult {
		return load(ours.name+", ours again after wrk", url, *workers, *duration, header, func(int, int64) string { return body })
	})
	ar.againIdx = len(ar.rows)
	ar.add(closedRow(again, *workers))
	return []httpResult{r, again}
}

// closedOurs is what wrk is judged against: our closed loop's rate and
// p50, the mean of the phases before and after wrk (the one before alone
// when there is no after).
func (ar *arrivalRun) closedOurs() *arrivalRow { return ar.meanOf(ar.closedIdx, ar.againIdx) }

// meanOf is the row at before with the rate, p50 and p99 averaged with
// the row at after (before alone when there is no after).
func (ar *arrivalRun) meanOf(before, after int) *arrivalRow {
	b, a := ar.row(before), ar.row(after)
	if b == nil || a == nil {
		return b
	}
	m := *b
	m.rate = (b.rate + a.rate) / 2
	m.dist.p50 = (b.dist.p50 + a.dist.p50) / 2
	m.dist.p99 = (b.dist.p99 + a.dist.p99) / 2
	return &m
}

// openBeside drives closed's phase open loop at 50% and 80% of closed's
// rate (with vegeta beside ours at 50% when external), and returns the
// phases it ran. The seckill selling phase's are the ones judged.
func (ar *arrivalRun) openBeside(a *app.App, closed httpResult, url string, header func(w int) http.Header, body string, judged bool) []httpResult {
	if closed.rate <= 0 {
		return nil
	}
	if judged {
		defer func() { ar.load = loadAverage() }()
	}
	if !judged {
		ar.add(closedRow(closed, *workers))
	}
	var rs []httpResult
	for _, share := range []float64{0.5, 0.8} {
		rate := share * closed.rate
		name := fmt.Sprintf("%s, open loop %.0f%%", closed.name, 100*share)
		var row arrivalRow
		var batch int
		rs = append(rs, withGroupCommits(a, &batch, func() httpResult {
			r, rw := openLoad(name, url, rate, *duration, header, body)
			row = rw
			return r
		}))
		row.loop = fmt.Sprintf("open, %.0f/s (%.0f%%)", rate, 100*share)
		i := len(ar.rows)
		ar.add(row)
		if judged && share == 0.5 {
			ar.p50Idx = i
		}
		if judged && share == 0.8 {
			ar.p80Idx = i
		}
		if judged && share == 0.5 && *external {
			rs = append(rs, withGroupCommits(a, &batch, func() httpResult {
				r, rw := vegetaRun(name+", vegeta", url, rate, *duration, clientHeaders(header, *workers), body)
				row = rw
				return r
			}))
			row.loop = fmt.Sprintf("open, %.0f/s (%.0f%%)", rate, 100*share)
			ar.vegetaIdx = len(ar.rows)
			ar.add(row)
			// Ours again after vegeta: vegeta is judged against the mean
			// of ours before and after it, as wrk is.
			rs = append(rs, withGroupCommits(a, &batch, func() httpResult {
				r, rw := openLoad(name+", ours again after vegeta", url, rate, *duration, header, body)
				row = rw
				return r
			}))
			row.loop = fmt.Sprintf("open, %.0f/s (%.0f%%)", rate, 100*share)
			ar.p50AgainIdx = len(ar.rows)
			ar.add(row)
		}
	}
	return rs
}

// openOurs is what vegeta is judged against: our open loop's rate and
// percentiles at 50%, the mean of the phases before and after vegeta.
func (ar *arrivalRun) openOurs() *arrivalRow { return ar.meanOf(ar.p50Idx, ar.p50AgainIdx) }

// row is the row at index i (-1: none).
func (ar *arrivalRun) row(i int) *arrivalRow {
	if i < 0 || i >= len(ar.rows) {
		return nil
	}
	return &ar.rows[i]
}
