package main

import (
	"context"
	"fmt"
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
}

func (c serverCost) perCall() float64 { return float64(c.usec) / float64(max(c.calls, 1)) }
func (c serverCost) ceiling() float64 { return 1e6 / c.perCall() }
func (c serverCost) foreign() int64   { return c.calls - c.sent }

// costTarget is SPEC section 7's bound on the server time of one reservation.
const costTarget = 8.0 // µs

var serverCosts []serverCost

// resetCommandStats starts a measured window.
func resetCommandStats(ctx context.Context, rdb *redis.Client) {
	must(rdb.ConfigResetStat(ctx).Err())
}

// readServerCost ends a window started by resetCommandStats, in which this
// process sent `sent` EVALSHA of the deduction script.
func readServerCost(ctx context.Context, rdb *redis.Client, phase string, sent int64, rate float64) serverCost {
	info, err := rdb.Info(ctx, "commandstats").Result()
	must(err)
	c := serverCost{phase: phase, sent: sent, rate: rate}
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
// sets, and checks SPEC section 7's bound on the window of the lua phase.
func costTable() string {
	if len(serverCosts) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n| Redis server time of the deduction script (`INFO commandstats`) | deductions/s | EVALSHA in window (ours) | µs per call | one hot SKU, one Redis core (10⁶ / µs) | target |\n|---|---:|---:|---:|---:|---|\n")
	for _, c := range serverCosts {
		target := ""
		if c.phase == "lua" {
			target = fmt.Sprintf("≤ %.0f µs, ≥ %.0fk/s: %s", costTarget, 1e3/costTarget, verdict(c.perCall() <= costTarget))
		}
		fmt.Fprintf(&b, "| %s | %.0f | %d (%d) | %.2f | %.0f/s | %s |\n", c.phase, c.rate, c.calls, c.sent, c.perCall(), c.ceiling(), target)
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
		" The lua window runs on the SKU lua-first-million sold a million units of.\n")
	for _, n := range notes {
		b.WriteString("- " + n + "\n")
	}
	return b.String()
}
