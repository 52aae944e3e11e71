package main

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// check is one of SPEC section 7's targets and what this run measured of it.
type check struct {
	what, measured, target string
	state                  int    // met, missed or unmeasured
	group                  string // "campaign", "webhooks": a group whose profile is a file of its own ("": the HTTP phases')
}

const (
	met = iota
	missed
	unmeasured
)

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

func (c check) verdict() string {
	switch c.state {
	case met:
		return "met"
	case missed:
		return "**missed**"
	}
	return "not measured"
}

// ratioCheck compares a/b with at least want; format renders a ratio.
func ratioCheck(what string, a, b, want float64, format, target string) check {
	c := check{what: what, target: target, state: unmeasured, measured: "–"}
	if a > 0 && b > 0 {
		r := a / b
		c.measured = fmt.Sprintf(format, r)
		c.state = missed
		if r >= want {
			c.state = met
		}
	}
	return c
}

// checks are the targets this run can judge, in the table's order.
func checks(rs, sync []result, web webRun) []check {
	byName := map[string]result{}
	for _, r := range rs {
		byName[r.name] = r
	}
	rate := func(name string) float64 { return byName[name].rate() }
	var cs []check
	if len(rs) > 0 {
		cs = append(cs,
			ratioCheck("lua / redis-lock", rate("lua"), rate("redis-lock"), 10, "%.1f×", "≥ 10×"),
			ratioCheck("lua / mysql-hot-row", rate("lua"), rate("mysql-hot-row"), 5, "%.1f×", "≥ 5×"),
			ratioCheck("lua-pipelined / redis-benchmark", rate("lua-pipelined"), rate("redis-benchmark"), 0.5, "%.2f", "≥ 50%"))
		cs[len(cs)-1].measured = percent(cs[len(cs)-1].measured)
		c := check{what: "Redis server time per reservation, after a million sold (" + costWindow + " window)", target: "≤ 8 µs (≥ 125k/s per core)", state: unmeasured, measured: "–"}
		for _, sc := range serverCosts {
			if sc.phase == costWindow && sc.calls > 0 {
				c.measured = fmt.Sprintf("%.2f µs (%.0fk/s)", sc.perCall(), sc.ceiling()/1e3)
				c.state = missed
				if sc.perCall() <= costTarget {
					c.state = met
				}
			}
		}
		cs = append(cs, c)
	}
	if len(sync) == 2 {
		cs = append(cs, ratioCheck("sync merged / one UPDATE per message", sync[0].rate(), sync[1].rate(), 5, "%.1f×", "≥ 5×"))
	}
	if len(web.phases) >= 4 && len(web.bare) > 0 && len(web.soldOut) == len(web.bare) {
		ratios := make([]float64, len(web.bare))
		rounds := make([]string, len(web.bare))
		for i := range web.bare {
			ratios[i] = web.soldOut[i] / web.bare[i]
			rounds[i] = fmt.Sprintf("%.1f×", ratios[i])
		}
		soldOut := ratioCheck("seckill sold out / bare handler, median of the pairs", median(ratios), 1, 2, "%.1f×", "≥ 2×")
		soldOut.measured += " (" + strings.Join(rounds, ", ") + ")"
		selling := ratioCheck("seckill selling / bare handler (pair #1)", web.selling, web.bare[0], 0.4, "%.2f", "≥ 40%")
		selling.measured = percent(selling.measured)
		cart := ratioCheck("orders, 2-line cart / bare handler (the pair before it)", web.cart, web.cartBare, 0.35, "%.2f", "≥ 35%")
		cart.measured = percent(cart.measured)
		cs = append(cs, selling, cart, databasePerSale(web), web.projection.check(), soldOut)
		c := check{what: fmt.Sprintf("oversell, 2000 units sold to %d clients", *workers), measured: fmt.Sprint(web.oversell), target: "0", state: met}
		if web.oversell != 0 {
			c.state = missed
		}
		cs = append(cs, c)
		c = check{what: "sync lag p99 through RocketMQ, 400 payments/s", measured: "nothing applied", target: "< 1 s", state: missed}
		if web.lag.applied > 0 {
			c.measured = dur(web.lag.p99)
			if web.lag.p99 < time.Second {
				c.state = met
			}
		}
		cs = append(cs, c)
		c = check{what: fmt.Sprintf("service heap under %s of seckill selling", *soakFor), measured: "no soak (-soak 0)",
			target: "steady: second half ≤ first half + 10%", state: unmeasured}
		if s := web.soak; s.samples > 0 {
			c.measured = fmt.Sprintf("%.1f → %.1f MiB (%+.0f%%)", s.firstHalf, s.second, 100*s.growth())
			c.state = met
			if s.growth() > 0.10 {
				c.state = missed
			}
		}
		cs = append(cs, c, churnCheck(web.churn))
	}
	cs = append(cs, arrivalChecks(web.arrival)...)
	cs = append(cs, campaignChecks(web.camp)...)
	cs = append(cs, webhookChecks(web.hooks)...)
	if len(rs) > 0 && len(web.phases) > 0 {
		cs = append(cs, check{what: "cold init, Redis per order, DB work per order flat from 10³ to 10⁶ orders",
			measured: "not in make bench: `make soak`", target: "flat", state: unmeasured})
	}
	return cs
}

// databasePerSale is the target on MariaDB's CPU per durable sale (a 201
// of the selling phase), with the floor measured in the same run beside it:
// the database's CPU per row of a bare group-committed INSERT.
func databasePerSale(web webRun) check {
	c := check{what: "MariaDB CPU per durable sale, seckill selling (beside it, the floor: a bare group-committed INSERT of one row per sale)",
		target: fmt.Sprintf("≤ %.0f µs", databaseTarget), state: unmeasured, measured: "–"}
	sale, ok := cpuPerAnswer(web, "seckill, selling", "mariadbd")
	if !ok {
		return c
	}
	c.measured = fmt.Sprintf("%.0f µs", sale)
	if floor, ok := cpuPerAnswer(web, floorPhase, "mariadbd"); ok && floor > 0 {
		c.measured += fmt.Sprintf(" (floor %.0f µs, %.1f× the floor)", floor, sale/floor)
	}
	c.state = missed
	if sale <= databaseTarget {
		c.state = met
	}
	return c
}

// databaseTarget is SPEC section 7's bound on MariaDB's CPU per durable sale.
const databaseTarget = 50.0

// cpuPerAnswer is the CPU µs group spent per answer of the phase named.
func cpuPerAnswer(web webRun, name, group string) (float64, bool) {
	for _, r := range web.phases {
		if r.name != name || r.answers() == 0 {
			continue
		}
		for _, ph := range cpuPhases {
			if ph.name == name {
				return ph.group[group] * 1e6 / float64(r.answers()), true
			}
		}
	}
	return 0, false
}

// median is the middle value of xs (the upper one of an even count; 0 for
// none).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// percent turns a "%.2f" ratio into a percentage.
func percent(s string) string {
	var f float64
	if _, err := fmt.Sscanf(s, "%f", &f); err != nil {
		return s
	}
	return fmt.Sprintf("%.0f%%", 100*f)
}

func report(rs, sync []result, web webRun) {
	prog.phase("report")
	var b strings.Builder
	if chart := strings.TrimSuffix(*out, ".md") + ".png"; *out != "" && len(rs)+len(web.phases) > 0 {
		_ = os.MkdirAll(filepath.Dir(chart), 0o755)
		if writeChart(chart, rs, httpOnly(web.phases)) {
			fmt.Fprintf(&b, "![deductions per second of each variant, and requests per second of each HTTP phase](%s)\n\n", filepath.Base(chart))
		}
	}
	maxRate := 0.0
	if len(rs) > 0 {
		fmt.Fprintf(&b, "| variant | deductions/s | p50 | p99 | notes |\n|---|---:|---:|---:|---|\n")
		for _, r := range rs {
			maxRate = math.Max(maxRate, r.rate())
			fmt.Fprintf(&b, "| %s | %.0f | %s | %s | %s |\n", r.name, r.rate(), dur(r.p50), dur(r.p99), r.note)
		}
	}
	cs := checks(rs, sync, web)
	fmt.Fprintf(&b, "\n| SPEC section 7 target | measured | target | verdict |\n|---|---:|---:|---|\n")
	missedIn := map[string]bool{} // by group ("": the HTTP phases)
	for _, c := range cs {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", c.what, c.measured, c.target, c.verdict())
		if c.state == missed {
			missedIn[c.group] = true
		}
	}
	anyMissed, campMissed := missedIn[""], missedIn["campaign"]
	b.WriteString(costTable())
	if len(sync) == 2 {
		fmt.Fprintf(&b, "\n| ordered database sync | operations/s | p50 | p99 | notes |\n|---|---:|---:|---:|---|\n")
		for _, r := range sync {
			fmt.Fprintf(&b, "| %s | %.0f | %s | %s | %s |\n", r.name, r.rate(), dur(r.p50), dur(r.p99), r.note)
		}
	}
	if len(web.phases) >= 4 {
		phaseTable(&b, fmt.Sprintf("HTTP, %d clients", *workers), web.phases)
	}
	b.WriteString(arrivalTable(web.arrival))
	b.WriteString(campaignTable(web.camp))
	b.WriteString(webhooksTable(web.hooks))
	b.WriteString(web.extra)
	b.WriteString(cpuTable())
	if len(web.phases) > 0 || web.camp != nil {
		b.WriteString(costPerAnswer(web))
	}
	if len(rs) > 0 {
		fmt.Fprintf(&b, "\n```\n")
		for _, r := range rs {
			bar := int(40 * r.rate() / maxRate)
			fmt.Fprintf(&b, "%-16s %s %.0f/s\n", r.name, strings.Repeat("█", max(bar, 1)), r.rate())
		}
		fmt.Fprintf(&b, "```\n")
	}
	if anyMissed && *cpuProf != "" && len(web.phases) > 0 {
		b.WriteString(profileTop(*cpuProf, "the HTTP phases"))
	}
	if campMissed && *cpuProf != "" {
		b.WriteString(profileTop(campaignProfile(), "the campaign group's phases"))
	}
	if missedIn["webhooks"] {
		b.WriteString(webhooksProfileHint(web.hooks))
	}
	if web.dbcost != "" {
		b.WriteString("\nWhat MariaDB's CPU per sale is made of: the sale's statements group-committed alone, each table's rows alone, and together, beside the floor (no HTTP, no service; `-only dbcost` runs this part alone).\n")
		b.WriteString(web.dbcost)
	}
	prog.finish()
	fmt.Print(b.String())
	if *out != "" {
		_ = os.MkdirAll(filepath.Dir(*out), 0o755)
		head := fmt.Sprintf("# make bench, %s, %d workers, %s per variant\n\nLoad average (1, 5, 15 min) when the run started: %s; when it ended: %s.\n\n",
			time.Now().UTC().Format(time.RFC3339), *workers, *duration, startLoad, loadAverage())
		if err := os.WriteFile(*out, []byte(head+b.String()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "benchtable:", err)
		}
	}
}

// httpOnly is the phases that answered HTTP (the floor does not).
func httpOnly(phases []httpResult) []httpResult {
	var out []httpResult
	for _, r := range phases {
		if r.codes != nil {
			out = append(out, r)
		}
	}
	return out
}

// profileTop is `go tool pprof -top` of the HTTP phases' CPU profile, by own
// time and by time including callees.
func profileTop(path, phases string) string {
	var b strings.Builder
	if *profPhase != "" {
		phases = fmt.Sprintf("%s matching %q", phases, *profPhase)
	}
	fmt.Fprintf(&b, "\nA target was missed: the CPU profile of %s (service and load generator, this process) is %s.\n", phases, path)
	for _, args := range [][]string{{"-top"}, {"-top", "-cum"}} {
		cmd := exec.Command("go", append(append([]string{"tool", "pprof"}, args...), "-nodecount=25", path)...)
		outb, err := cmd.Output()
		fmt.Fprintf(&b, "\n`go tool pprof %s -nodecount=25 %s`\n\n```\n", strings.Join(args, " "), filepath.Base(path))
		if err != nil {
			fmt.Fprintf(&b, "failed: %v\n", err)
		}
		b.Write(outb)
		b.WriteString("```\n")
	}
	return b.String()
}

var startLoad = loadAverage()

// loadAverage is /proc/loadavg's three load averages.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], ", ")
}

// phaseTable writes phases as a table of their rates, latencies, answers
// and notes, headed by title.
func phaseTable(b *strings.Builder, title string, phases []httpResult) {
	fmt.Fprintf(b, "\n| %s | requests/s | p50 | p99 | answers | notes |\n|---|---:|---:|---:|---|---|\n", title)
	for _, r := range phases {
		fmt.Fprintf(b, "| %s | %.0f | %s | %s | %s | %s |\n", r.name, r.rate, dur(r.p50), dur(r.p99), r.answersCell(), r.note)
	}
}
