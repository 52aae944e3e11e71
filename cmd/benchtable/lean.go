package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/acme/inventory/internal/app"
)

// leanPairs is how many times the lean group runs each way.
const leanPairs = 3

// leanSide is one node's run in the lean group: a way of selling (the
// classic sale, or the lean sale with its projection), its phases.
type leanSide struct {
	lean  bool
	phase []leanPhase
}

// leanPhase is one load phase of a node: its 201s a second, and what the
// machine spent on each from the phase's start until the projector had
// written every hold it made (the lean sale's cost is its commit and its
// projection; the classic sale has nothing to wait for).
type leanPhase struct {
	name                  string
	rate                  float64
	sales                 int64
	mariadb, all, elapsed float64 // CPU seconds; wall seconds until projected
	lag                   projLag
}

// leanBench is the classic sale and the lean sale side by side (issue
// 43's decision: the lean sale moves the order's rows out of the sale's
// commit, not out of the database): leanPairs rounds, each a classic
// node and a lean node (which goes first alternates), each running the
// seckill selling phase and the 2-line cart phase on a fresh database.
func leanBench(ctx context.Context, rdb *redis.Client, dsnBase string) string {
	var sides [2][]leanSide // [0] classic, [1] lean
	for round := range leanPairs {
		order := []bool{false, true}
		if round%2 == 1 {
			order = []bool{true, false}
		}
		for _, lean := range order {
			s := leanRun(ctx, rdb, dsnBase, lean, round)
			sides[b2i(lean)] = append(sides[b2i(lean)], s)
		}
	}
	return leanTable(sides)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func wayName(lean bool) string {
	if lean {
		return "lean"
	}
	return "classic"
}

// leanRun starts a node selling one way and runs the two phases on it.
func leanRun(ctx context.Context, rdb *redis.Client, dsnBase string, lean bool, round int) leanSide {
	prog.phase(fmt.Sprintf("lean group: %s node #%d setup", wayName(lean), round+1))
	a, db := startService(ctx, rdb, dsnBase, *dbPrefix+"_lean", func(c *app.Config) { c.LeanSale = lean })
	_ = db.Close()
	defer a.Shutdown(context.Background())
	for sku, n := range map[string]int64{"FLASH": 1_000_000_000, "CART-A": 1_000_000_000, "CART-B": 1_000_000_000} {
		_, err := a.Catalog.Put(ctx, sku, n, 0)
		must(err)
	}
	base := "http://" + a.Addr()
	side := leanSide{lean: lean}
	for _, ph := range []struct {
		name, url, body string
		lines           int
	}{
		{"seckill, selling", "/v1/seckill/FLASH/buy", `{}`, 1},
		{"orders, 2-line cart", "/v1/orders", `{"items":[{"sku":"CART-A","qty":1},{"sku":"CART-B","qty":2}]}`, 2},
	} {
		name := fmt.Sprintf("lean group: %s, %s #%d", ph.name, wayName(lean), round+1)
		before, _ := sampleCPU()
		r, lag := withProjectionLag(a, ph.lines, func() httpResult {
			return load(name, base+ph.url, *workers, *duration, func(w int) http.Header { return credentials("l", w) },
				func(int, int64) string { return ph.body })
		})
		waitProjected(ctx, a)
		after, _ := sampleCPU()
		p := leanPhase{name: ph.name, rate: r.rate, sales: r.codes[201], lag: lag,
			mariadb: float64(after.group["mariadbd"]-before.group["mariadbd"]) / userHZ,
			all:     float64(after.busy-before.busy) / userHZ, elapsed: after.at.Sub(before.at).Seconds()}
		side.phase = append(side.phase, p)
	}
	return side
}

// leanTable is the group's table: per phase and way, the median of the
// rounds, and lean / classic.
func leanTable(sides [2][]leanSide) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n| the classic sale and the lean sale, %d rounds each way (alternating), %d clients, %s a phase; CPU from the phase's start until its holds were projected | 201/s | MariaDB CPU µs per sale | all CPU µs per sale (every process) | wall s until projected | projection lag p99 |\n|---|---:|---:|---:|---:|---:|\n",
		leanPairs, *workers, *duration)
	if len(sides[0]) == 0 || len(sides[0][0].phase) == 0 {
		return b.String()
	}
	med := func(way, ph int, f func(leanPhase) float64) float64 {
		var xs []float64
		for _, s := range sides[way] {
			xs = append(xs, f(s.phase[ph]))
		}
		return median(xs)
	}
	rate := func(p leanPhase) float64 { return p.rate }
	db := func(p leanPhase) float64 { return perSale(p.mariadb, p.sales) }
	all := func(p leanPhase) float64 { return perSale(p.all, p.sales) }
	wall := func(p leanPhase) float64 { return p.elapsed }
	for ph := range sides[0][0].phase {
		for way := range 2 {
			lags := "–"
			if way == 1 {
				var ls []string
				for _, s := range sides[way] {
					l := s.phase[ph].lag
					if l.n < l.sold {
						ls = append(ls, fmt.Sprintf("%d of %d unprojected after 30 s", l.sold-l.n, l.sold))
						continue
					}
					ls = append(ls, "≤ "+secs(l.p99))
				}
				lags = strings.Join(ls, ", ")
			}
			var rates []string
			for _, s := range sides[way] {
				rates = append(rates, fmt.Sprintf("%.0f", s.phase[ph].rate))
			}
			fmt.Fprintf(&b, "| %s, %s (%s) | %.0f | %.1f | %.1f | %.1f | %s |\n", sides[0][0].phase[ph].name, wayName(way == 1),
				strings.Join(rates, ", "), med(way, ph, rate), med(way, ph, db), med(way, ph, all), med(way, ph, wall), lags)
		}
		fmt.Fprintf(&b, "| %s, lean / classic | %.2f× | %.2f× | %.2f× | | |\n", sides[0][0].phase[ph].name,
			med(1, ph, rate)/med(0, ph, rate), med(1, ph, db)/med(0, ph, db), med(1, ph, all)/med(0, ph, all))
	}
	b.WriteString("\nThe medians of the rounds; the rates of each round in brackets. A lean phase's CPU runs on until its projection is written (the projector's catch-up after the load is counted, so the lean sale's cost is its commit and its projection).\n")
	return b.String()
}

func perSale(cpu float64, sales int64) float64 {
	if sales == 0 {
		return 0
	}
	return cpu * 1e6 / float64(sales)
}
