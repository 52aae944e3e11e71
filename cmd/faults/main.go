// Command faults proves the inventory service's promise with real
// processes: it starts real inventoryd binaries against private Redis,
// MariaDB and RocketMQ servers, runs a mixed workload, injects one fault per
// scenario (Redis restarted, flushed, evicted, rolled back, failed over;
// inventoryd SIGKILLed; the broker stopped; MariaDB restarted; three
// instances; Redis Cluster; abuse; the link to MariaDB, Redis or the broker
// blackholed, or slowed and narrowed, through an in-process Toxiproxy),
// lets everything settle and checks the final state from the database and
// the API alone. One line per scenario:
//
//	scenario  ops  oversold  lost  duplicated  stuck  drift  5xx
//
// and under it how long the answers took (the thresholds of docs/SPEC.md
// section 7 are verdicts in the link scenarios).
//
// Every run is seeded (-seed); the same seed replays the same workload
// decisions and fault choices (the interleaving is the machine's).
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/acme/inventory/testkit/servers"
)

func main() {
	seed := flag.Uint64("seed", uint64(time.Now().UnixNano()%1_000_000), "workload and fault seed (printed; pass it to replay a run)")
	only := flag.String("scenarios", "", "comma-separated scenario names (default: all)")
	quick := flag.Bool("quick", false, "the quick subset make test runs")
	duration := flag.Duration("duration", 20*time.Second, "workload duration per scenario")
	out := flag.String("out", "bench-results/faults.md", "where to write the table (empty: nowhere)")
	keep := flag.Bool("keep", false, "keep the run directory (logs of every process)")
	replay := flag.String("replay", "", "check a history a kept run wrote (its history.json) instead of running")
	stale := flag.Duration("stale", 0, "with -replay: how far a refusal may lag a give-back (default: the run's own)")
	classic := flag.Bool("classic", false, "every instance writes the order in the sale's commit (INVENTORY_LEAN_SALE=false) as releases before the lean sale did; the upgrades and projector-kill, which are about the lean sale, are left out")
	flag.Parse()
	if *replay != "" {
		if err := replayHistory(*replay, *stale, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "faults:", err)
			os.Exit(1)
		}
		return
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	selected, err := selectScenarios(*only, *quick)
	if *classic {
		selected = classicScenarios(selected)
	}
	if err == nil {
		var verdicts []*Verdict
		vizDir := "bench-results"
		if *out != "" {
			vizDir = filepath.Dir(*out)
		}
		verdicts, err = run(ctx, selected, *seed, *duration, *keep, vizDir, os.Stdout)
		if err == nil && *out != "" {
			err = writeTable(*out, verdicts, *seed, *duration)
		}
		if err == nil {
			for _, v := range verdicts {
				if !v.Passed() {
					err = fmt.Errorf("scenario %s failed (replay: go run ./cmd/faults -seed %d -scenarios %s)", v.Scenario, *seed, v.Scenario)
					break
				}
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "faults:", err)
		os.Exit(1)
	}
}

// classicScenarios are scs with every instance writing the order in the
// sale's commit, as releases before the lean sale (issue 43) did; those
// about the lean sale are left out: the upgrades (their new nodes' way is
// the scenario's) and any that sets leanEnv (projector-kill).
func classicScenarios(scs []Scenario) []Scenario {
	var out []Scenario
	for _, sc := range scs {
		if sc.From != "" || slices.Contains(sc.Env, leanEnv) {
			continue
		}
		sc.Env = append(slices.Clip(sc.Env), classicEnv)
		out = append(out, sc)
	}
	return out
}

// leanEnv has an instance sell as the lean sale does (the default, said
// where a scenario is about it); classicEnv has it write the order in the
// sale's commit.
const (
	leanEnv    = "INVENTORY_LEAN_SALE=true"
	classicEnv = "INVENTORY_LEAN_SALE=false"
	// classicCampaignsEnv has a lean node record campaigns' holds as
	// before (a fleet rolled from a release that cannot read them).
	classicCampaignsEnv = "INVENTORY_LEAN_CAMPAIGNS=false"
)

// replayHistory checks a kept run's history again, without the run: to
// study a check that failed or took long.
func replayHistory(path string, stale time.Duration, w io.Writer) error {
	h, err := readHistory(path)
	if err != nil {
		return err
	}
	if stale == 0 {
		stale = cmp.Or(h.Stale, strictStale)
	}
	v := checkHistory(h.Ops, histConfig{Stale: stale, OrderHold: orderTTL, CampaignHold: campaignHold, Timeout: historyTimeout,
		Base: h.Base, Dir: filepath.Dir(path), Name: "replay", Commits: h.Commits, Never: h.Never})
	fmt.Fprintf(w, "linearizable: %s\n%s\n", v.column(), v.line())
	if !v.passed() {
		return fmt.Errorf("the history is not linearizable (%s)", v.column())
	}
	return nil
}

func selectScenarios(only string, quick bool) ([]Scenario, error) {
	var out []Scenario
	names := strings.Split(only, ",")
	for _, sc := range scenarios {
		if (only == "" && (!quick || sc.Quick)) || slices.Contains(names, sc.Name) {
			out = append(out, sc)
		}
	}
	if only != "" && len(out) != len(names) {
		var known []string
		for _, sc := range scenarios {
			known = append(known, sc.Name)
		}
		return nil, fmt.Errorf("unknown scenario in %q; known: %s", only, strings.Join(known, ", "))
	}
	return out, nil
}

// run builds inventoryd, starts the lab and runs each scenario, printing
// progress and one result line per scenario to w.
func run(ctx context.Context, selected []Scenario, seed uint64, duration time.Duration, keep bool, vizDir string, w io.Writer) ([]*Verdict, error) {
	logf := func(format string, args ...any) {
		fmt.Fprintf(w, "[%s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	logf("seed %d", seed)
	lab, err := prepare(ctx, keep, logf)
	if err != nil {
		return nil, err
	}
	defer lab.Close()
	lab.vizDir = vizDir

	fmt.Fprintln(w, header)
	var verdicts []*Verdict
	for _, sc := range selected {
		v, err := runScenario(ctx, lab, sc, seed, duration, logf)
		if err != nil {
			return verdicts, err
		}
		verdicts = append(verdicts, v)
		for _, n := range v.Notes {
			logf("%s: %s", sc.Name, n)
		}
		for _, p := range v.Problems {
			logf("%s: PROBLEM: %s", sc.Name, p)
		}
		for _, p := range v.TimingProblems {
			logf("%s: TOO SLOW: %s", sc.Name, p)
		}
		fmt.Fprintln(w, v.line())
		for _, l := range v.timingLines() {
			fmt.Fprintf(w, "    %s\n", l)
		}
		if v.History != nil {
			fmt.Fprintf(w, "    %s\n", v.History.line())
		}
		if v.Campaign != nil {
			fmt.Fprintf(w, "    %s\n", v.Campaign.line())
		}
		if v.Webhooks != nil {
			fmt.Fprintf(w, "    %s\n", v.Webhooks.line())
		}
	}
	return verdicts, nil
}

// prepare builds inventoryd into a new run directory and starts the lab's
// servers there. Close removes the directory unless keep.
func prepare(ctx context.Context, keep bool, logf func(string, ...any)) (*Lab, error) {
	dir, err := os.MkdirTemp("", "inventory-faults-")
	if err != nil {
		return nil, err
	}
	if keep {
		logf("run directory (kept): %s", dir)
	}
	cleanup := func() {
		if !keep {
			os.RemoveAll(dir)
		}
	}
	logf("building inventoryd")
	bin, err := buildInventoryd(ctx, dir, "inventoryd")
	if err != nil {
		cleanup()
		return nil, err
	}
	lab, err := startLab(dir, bin, logf)
	if err != nil {
		cleanup()
		return nil, err
	}
	lab.cleanup = cleanup
	return lab, nil
}

// buildInventoryd builds cmd/inventoryd into dir/name with the build tags
// given (a faultbugs build carries the deliberate bugs the history check
// must catch: internal/testbugs).
func buildInventoryd(ctx context.Context, dir, name string, tags ...string) (string, error) {
	return buildCommand(ctx, dir, name, "./cmd/inventoryd", tags...)
}

// buildCommand builds the command pkg (a path from the module's root) as
// dir/name.
func buildCommand(ctx context.Context, dir, name, pkg string, tags ...string) (string, error) {
	bin := filepath.Join(dir, name)
	args := []string{"build", "-o", bin}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	build := exec.CommandContext(ctx, "go", append(args, pkg)...)
	var err error
	if build.Dir, err = servers.ModuleRoot(); err != nil {
		return "", err
	}
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v: %s", err, out)
	}
	return bin, nil
}

const header = "scenario               ops  oversold  lost  duplicated  stuck  drift   5xx       linearizable  result"

func (v *Verdict) line() string {
	result := "PASS"
	if !v.Passed() {
		result = "FAIL"
	}
	return fmt.Sprintf("%-18s %7d  %8d  %4d  %10d  %5d  %-6s  %-8s  %-12s  %s", v.Scenario, v.Ops, v.Oversold, v.Lost, v.Duplicated, v.Stuck, v.Drift, v.fiveXX(), v.History.column(), result)
}

func writeTable(path string, verdicts []*Verdict, seed uint64, duration time.Duration) error {
	var b strings.Builder
	fmt.Fprintf(&b, "`go run ./cmd/faults -seed %d -duration %s` (%s)\n\n", seed, duration, time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	b.WriteString("| scenario | operations | oversold | lost | duplicated | stuck | drift | 5xx | linearizable | result |\n|---|---:|---:|---:|---:|---:|---|---|---|---|\n")
	for _, v := range verdicts {
		result := "pass"
		if !v.Passed() {
			result = "**FAIL**: " + strings.Join(append(slices.Clip(v.Problems), v.TimingProblems...), "; ")
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %s | %s | %s | %s |\n", v.Scenario, v.Ops, v.Oversold, v.Lost, v.Duplicated, v.Stuck, v.Drift, v.fiveXX(), v.History.column(), result)
	}
	b.WriteString("\nHow long the answers took (docs/SPEC.md section 7: every answer within 2 s, within 50 ms once a dependency is known down, the first success within 5 s of the heal, the sync resumed within 5 s; verdicts in the scenarios that cut or slow a link, \"info\" elsewhere):\n\n")
	for _, v := range verdicts {
		fmt.Fprintf(&b, "- **%s**: %s\n", v.Scenario, strings.Join(v.timingLines(), "; "))
	}
	b.WriteString("\nThe history check, per SKU (operations checked, time):\n\n")
	for _, v := range verdicts {
		if v.History != nil {
			fmt.Fprintf(&b, "- **%s**: %s\n", v.Scenario, v.History.line())
		}
	}
	b.WriteString("\nWhat each scenario did:\n\n")
	for _, v := range verdicts {
		fmt.Fprintf(&b, "- **%s**: %s\n", v.Scenario, strings.Join(v.Notes, "; "))
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
