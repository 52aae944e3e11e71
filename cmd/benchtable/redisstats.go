package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/acme/inventory/stock"
)

// What one reservation costs Redis itself: the server's own time per EVALSHA
// of the deduction script (INFO commandstats, reset with CONFIG RESETSTAT
// before a window), and from it the ceiling of one hot SKU on one Redis core.
// The counters are server-wide: the window's EVALSHA count is compared with
// the calls this process sent in it, so calls from anything else (another
// test run on the same server) are seen, not silently averaged in.

// serverCost is the deduction script's cost in one measured window.
type serverCost struct {
	phase  string
	rate   float64 // deductions per second the window's client saw
	sent   int64   // EVALSHA this process sent in the window
	calls  int64   // EVALSHA the server ran in the window
	usec   int64   // their total time, µs
	failed int64   // failed_calls + rejected_calls
	evals  int64   // EVAL calls (a NOSCRIPT fallback, or someone else's)
	// preempted is how often the kernel took the CPU from Redis's main
	// thread in the window (nonvoluntary context switches): time a command
	// spends pre-empted counts in its usec.
	preempted int64
}

func (c serverCost) perCall() float64 { return float64(c.usec) / float64(max(c.calls, 1)) }
func (c serverCost) ceiling() float64 { return 1e6 / c.perCall() }
func (c serverCost) foreign() int64   { return c.calls - c.sent }

// costTarget is SPEC section 7's bound on the server time of one reservation.
const costTarget = 8.0 // µs

// costWindow is the window judged against costTarget: the pipelined one, on
// the SKU that sold a million units. It is the window in which Redis runs
// the script back to back, as a core serving one hot SKU at its ceiling
// does; in the one-call-per-request window on this 2-core machine, Redis
// shares the cores with 64 client goroutines and is pre-empted inside
// commands (the table counts it), which the server's usec counts as the
// script's time.
const costWindow = "lua-pipelined"

var serverCosts []serverCost

// preemptedAtStart is Redis's nonvoluntary context switches when the
// current window started.
var preemptedAtStart int64

// resetCommandStats starts a measured window.
func resetCommandStats(ctx context.Context, rdb *redis.Client) {
	must(rdb.ConfigResetStat(ctx).Err())
	preemptedAtStart = redisPreempted(ctx, rdb)
}

// redisPreempted is the nonvoluntary context switches of the Redis server's
// main thread so far (it runs on this machine: /proc), or -1 if unknown.
func redisPreempted(ctx context.Context, rdb *redis.Client) int64 {
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return -1
	}
	pid := infoValue(info, "process_id")
	status, err := os.ReadFile("/proc/" + pid + "/status")
	if pid == "" || err != nil {
		return -1
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "nonvoluntary_ctxt_switches:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err == nil {
				return n
			}
		}
	}
	return -1
}

// infoValue is the value of key in an INFO answer.
func infoValue(info, key string) string {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			return v
		}
	}
	return ""
}

// readServerCost ends a window started by resetCommandStats, in which this
// process sent `sent` EVALSHA of the deduction script.
func readServerCost(ctx context.Context, rdb *redis.Client, phase string, sent int64, rate float64) serverCost {
	info, err := rdb.Info(ctx, "commandstats").Result()
	must(err)
	c := serverCost{phase: phase, sent: sent, rate: rate, preempted: -1}
	if now := redisPreempted(ctx, rdb); now >= 0 && preemptedAtStart >= 0 {
		c.preempted = now - preemptedAtStart
	}
	for _, line := range strings.Split(info, "\r\n") {
		name, fields, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		kv := map[string]int64{}
		for _, f := range strings.Split(fields, ",") {
			if k, v, ok := strings.Cut(f, "="); ok {
				kv[k], _ = strconv.ParseInt(v, 10, 64) // usec_per_call is a float: recomputed from usec
			}
		}
		switch name {
		case "cmdstat_evalsha":
			c.calls, c.usec, c.failed = kv["calls"], kv["usec"], kv["failed_calls"]+kv["rejected_calls"]
		case "cmdstat_eval":
			c.evals = kv["calls"]
		}
	}
	serverCosts = append(serverCosts, c)
	return c
}

// firstMillion sells one million units of sku through the deduction script,
// 64 per pipeline (AdmitMany) from n workers: the history the measured
// reservations of sku then run on. It fails the run unless Redis then has
// exactly a million units fewer.
func firstMillion(ctx context.Context, rdb *redis.Client, st *stock.Store, sku string, n int) {
	const units, batch = 1_000_000, 64
	prog.phase("lua-first-million")
	defer measureCPU("lua-first-million")()
	resetCommandStats(ctx, rdb)
	var left atomic.Int64
	left.Store(units)
	var failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k := min(left.Add(-batch)+batch, batch)
				if k <= 0 {
					return
				}
				reqs := make([]stock.Request, k)
				for i := range reqs {
					reqs[i] = stock.Request{SKU: sku, Qty: 1}
				}
				for _, r := range st.AdmitMany(ctx, reqs) {
					if r.Err != nil {
						failed.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	readServerCost(ctx, rdb, "lua-first-million", units, float64(units)/time.Since(start).Seconds())
	lv, err := st.Levels(ctx, sku)
	must(err)
	if f := failed.Load(); f > 0 || hotStock-lv.Available != units {
		must(fmt.Errorf("first million of %s: %d failed, Redis has %d left of %d", sku, f, lv.Available, int64(hotStock)))
	}
}

// costTable reports each window's server time per call and the ceiling it
// sets, and checks SPEC section 7's bound on costWindow.
func costTable() string {
	if len(serverCosts) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n| Redis server time of the deduction script (`INFO commandstats`) | deductions/s | EVALSHA in window (ours) | µs per call | one hot SKU, one Redis core (10⁶ / µs) | Redis pre-empted per 1000 calls | target |\n|---|---:|---:|---:|---:|---:|---|\n")
	for _, c := range serverCosts {
		target := ""
		if c.phase == costWindow {
			target = fmt.Sprintf("≤ %.0f µs, ≥ %.0fk/s: %s", costTarget, 1e3/costTarget, verdict(c.perCall() <= costTarget))
		}
		preempted := "–"
		if c.preempted >= 0 {
			preempted = fmt.Sprintf("%.1f", 1000*float64(c.preempted)/float64(max(c.calls, 1)))
		}
		fmt.Fprintf(&b, "| %s | %.0f | %d (%d) | %.2f | %.0f/s | %s | %s |\n", c.phase, c.rate, c.calls, c.sent, c.perCall(), c.ceiling(), preempted, target)
	}
	var notes []string
	for _, c := range serverCosts {
		if d := c.foreign(); d != 0 {
			notes = append(notes, fmt.Sprintf("%s: %+d EVALSHA not sent by this phase (%.2f%% of the window: another client of this Redis)",
				c.phase, d, 100*float64(d)/float64(max(c.calls, 1))))
		}
		if c.failed > 0 || c.evals > 0 {
			notes = append(notes, fmt.Sprintf("%s: %d failed EVALSHA, %d EVAL", c.phase, c.failed, c.evals))
		}
	}
	b.WriteString("\nEach window starts with `CONFIG RESETSTAT`; µs per call is the server's `usec / calls` of EVALSHA in it." +
		" The lua and lua-pipelined windows run on the SKU lua-first-million sold a million units of; the target is judged on " + costWindow +
		", where Redis runs the script back to back as a core at one hot SKU's ceiling does (a command pre-empted by the load generator," +
		" which shares the 2 cores, counts its wait in usec).\n")
	for _, n := range notes {
		b.WriteString("- " + n + "\n")
	}
	return b.String()
}
