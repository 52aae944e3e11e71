package main

// The honest-load-generator check (SPEC section 7, issue 33): the seckill
// selling phase driven by load generators nobody here wrote, beside ours:
// wrk (Debian's package; closed loop at our connections, each request
// built by a Lua script with the headers our clients send) and vegeta (a
// Go module's CLI, installed by scripts/bench.sh; open loop at a constant
// rate). wrk 4 has no fixed-rate mode (wrk2 is not packaged), so the
// open-loop comparison is vegeta's.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/acme/inventory/internal/identity"
)

// externalTools checks, before a run that will need them, that wrk and
// vegeta can be run, so a missing one stops the run at once and says how
// to get it rather than after minutes of measuring.
func externalTools() error {
	var errs []error
	if _, err := exec.LookPath(*wrkPath); err != nil {
		errs = append(errs, fmt.Errorf("wrk (%s) not found: apt-get install -y wrk, or run scripts/bench.sh, which installs it", *wrkPath))
	}
	if _, err := exec.LookPath(*vegetaPath); err != nil {
		errs = append(errs, fmt.Errorf("vegeta (%s) not found: go install github.com/tsenart/vegeta/v12@%s, or run scripts/bench.sh, which installs it", *vegetaPath, vegetaVersion))
	}
	if len(errs) > 0 {
		errs = append(errs, errors.New("or pass -external=false to leave the check out (its targets are then reported as not measured)"))
	}
	return errors.Join(errs...)
}

// idHeader is the buyer token's header.
const idHeader = identity.Header

// vegetaVersion is the vegeta scripts/bench.sh installs.
const vegetaVersion = "v12.13.0"

// toolVersion is what a tool says its version is, first line.
func toolVersion(path string, args ...string) string {
	outb, _ := exec.Command(path, args...).CombinedOutput()
	line, _, _ := strings.Cut(strings.TrimSpace(string(outb)), "\n")
	return line
}

// wrkScript is the Lua script wrk runs: each request a POST of body with
// the client credential and one of the buyer tokens in turn (our clients
// send one buyer's token each, on its own connection; no SKU here has a
// per-user limit, and the service caches each token's check either way),
// and at the end one line of its own latency percentiles (µs).
const wrkScript = `
local tokens = {%s}
local path = %q
local headers = {["Content-Type"] = "application/json", ["Authorization"] = %q}
local n = 0
request = function()
  n = n + 1
  headers[%q] = tokens[(n %% #tokens) + 1]
  return wrk.format("POST", path, headers, %q)
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("benchtable-wrk requests=%%d duration_us=%%d p50=%%d p90=%%d p99=%%d p999=%%d max=%%d non2xx3xx=%%d connect=%%d read=%%d write=%%d timeout=%%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max, e.status, e.connect, e.read, e.write, e.timeout))
end
`

// wrkRun drives rawURL with wrk, closed loop, from conns connections for d,
// each request with the headers of one of headers in turn and body.
func wrkRun(name, rawURL string, conns int, d time.Duration, headers []http.Header, body string) (httpResult, arrivalRow) {
	row := arrivalRow{name: name, generator: "wrk " + strings.TrimPrefix(strings.Fields(toolVersion(*wrkPath, "-v") + " ?")[1], "debian/"),
		loop: fmt.Sprintf("closed, %d connections", conns), late: "–"}
	u, err := url.Parse(rawURL)
	must(err)
	var toks []string
	for _, h := range headers {
		toks = append(toks, strconv.Quote(h.Get(idHeader)))
	}
	script := fmt.Sprintf(wrkScript, strings.Join(toks, ", "), u.RequestURI(), headers[0].Get("Authorization"), idHeader, body)
	dir, err := os.MkdirTemp("", "benchtable-wrk")
	must(err)
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "seckill.lua")
	must(os.WriteFile(path, []byte(script), 0o644))
	threads := min(runtime.NumCPU(), conns)
	prog.phase(name)
	stopCPU := measureCPU(name)
	outb, err := exec.Command(*wrkPath, "-t", strconv.Itoa(threads), "-c", strconv.Itoa(conns), "-d", fmt.Sprintf("%ds", int(d.Seconds())),
		"--timeout", "10s", "-s", path, rawURL).CombinedOutput()
	stopCPU()
	m := regexp.MustCompile(`benchtable-wrk requests=(\d+) duration_us=(\d+) p50=(\d+) p90=(\d+) p99=(\d+) p999=(\d+) max=(\d+) non2xx3xx=(\d+) connect=(\d+) read=(\d+) write=(\d+) timeout=(\d+)`).FindSubmatch(outb)
	if err != nil || m == nil {
		row.err = fmt.Sprintf("wrk: %v: %s", err, lastLine(string(outb)))
		return httpResult{name: name, note: row.err}, row
	}
	n := func(i int) int64 { v, _ := strconv.ParseInt(string(m[i]), 10, 64); return v }
	us := func(i int) time.Duration { return time.Duration(n(i)) * time.Microsecond }
	row.rate = float64(n(1)) / (float64(n(2)) / 1e6)
	row.dist = latencyDist{n: int(n(1)), p50: us(3), p90: us(4), p99: us(5), p999: us(6), max: us(7)}
	// wrk counts answers, and among them those outside 2xx/3xx; the phase
	// expects every answer a 201.
	row.codes = map[int]int64{201: n(1) - n(8)}
	if n(8) > 0 {
		row.codes[0] = n(8) // some status ≥ 400 (wrk does not say which)
	}
	if errs := n(9) + n(10) + n(11) + n(12); errs > 0 {
		row.codes[-1] = errs
		row.note = fmt.Sprintf("socket errors: connect %d, read %d, write %d, timeout %d", n(9), n(10), n(11), n(12))
	}
	r := httpResult{name: name, rate: row.rate, p50: row.dist.p50, p99: row.dist.p99, dist: row.dist, codes: row.codes,
		note: fmt.Sprintf("%s, %d threads; 2xx/3xx counted as 201, other statuses as 0", row.generator, threads)}
	return r, row
}

// vegetaReport is the part of `vegeta report -type=json` read here.
type vegetaReport struct {
	Latencies struct {
		P50  int64 `json:"50th"`
		P90  int64 `json:"90th"`
		P99  int64 `json:"99th"`
		Max  int64 `json:"max"`
		Mean int64 `json:"mean"`
	} `json:"latencies"`
	Requests    int64            `json:"requests"`
	Rate        float64          `json:"rate"`
	Throughput  float64          `json:"throughput"`
	Duration    int64            `json:"duration"`
	Wait        int64            `json:"wait"`
	StatusCodes map[string]int64 `json:"status_codes"`
	Errors      []string         `json:"errors"`
}

// vegetaRun drives rawURL with vegeta, open loop at rate per second for d,
// the targets one per header set in headers (vegeta sends them in turn),
// each with body.
func vegetaRun(name, rawURL string, rate float64, d time.Duration, headers []http.Header, body string) (httpResult, arrivalRow) {
	row := arrivalRow{name: name, generator: "vegeta " + vegetaVersion, loop: fmt.Sprintf("open, %.0f/s", rate), noP999: true,
		late: "– (vegeta times from its actual send; it starts a worker whenever none is free)"}
	dir, err := os.MkdirTemp("", "benchtable-vegeta")
	must(err)
	defer os.RemoveAll(dir)
	bodyPath := filepath.Join(dir, "body.json")
	must(os.WriteFile(bodyPath, []byte(body), 0o644))
	var targets bytes.Buffer
	for _, h := range headers {
		fmt.Fprintf(&targets, "POST %s\n", rawURL)
		h = h.Clone()
		h.Set("Content-Type", "application/json")
		must(h.Write(&targets))
		fmt.Fprintf(&targets, "@%s\n\n", bodyPath)
	}
	targetsPath := filepath.Join(dir, "targets.txt")
	must(os.WriteFile(targetsPath, targets.Bytes(), 0o644))
	results := filepath.Join(dir, "results.bin")
	prog.phase(name)
	stopCPU := measureCPU(name)
	outb, err := exec.Command(*vegetaPath, "attack", "-targets", targetsPath, "-rate", fmt.Sprintf("%d/1s", int(math.Round(rate))),
		"-duration", d.String(), "-timeout", "10s", "-max-body", "0", "-http2=false", "-output", results).CombinedOutput()
	stopCPU()
	if err != nil {
		row.err = fmt.Sprintf("vegeta attack: %v: %s", err, lastLine(string(outb)))
		return httpResult{name: name, note: row.err}, row
	}
	outb, err = exec.Command(*vegetaPath, "report", "-type", "json", results).Output()
	var rep vegetaReport
	if err == nil {
		err = json.Unmarshal(outb, &rep)
	}
	if err != nil {
		row.err = fmt.Sprintf("vegeta report: %v", err)
		return httpResult{name: name, note: row.err}, row
	}
	row.codes = map[int]int64{}
	for code, k := range rep.StatusCodes {
		c, _ := strconv.Atoi(code)
		if c == 0 {
			c = -1 // vegeta's code 0 is a request without an answer
		}
		row.codes[c] += k
	}
	if sec := float64(rep.Duration+rep.Wait) / 1e9; sec > 0 {
		row.rate = float64(answeredOf(row.codes)) / sec
	}
	row.dist = latencyDist{n: int(rep.Requests), p50: time.Duration(rep.Latencies.P50), p90: time.Duration(rep.Latencies.P90),
		p99: time.Duration(rep.Latencies.P99), max: time.Duration(rep.Latencies.Max)}
	if len(rep.Errors) > 0 {
		row.note = "errors: " + strings.Join(rep.Errors[:min(len(rep.Errors), 3)], "; ")
	}
	r := httpResult{name: name, rate: row.rate, p50: row.dist.p50, p99: row.dist.p99, dist: row.dist, codes: row.codes,
		note: fmt.Sprintf("%s, open loop at %.0f/s (attack rate %.0f/s)", row.generator, rate, rep.Rate)}
	return r, row
}
