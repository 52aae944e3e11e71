package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The counts group (-only counts; issue 45, SPEC section 7's "Counts"):
// the real service in this process, and side by side in one run,
// -count-pairs interleaved pairs of the seckill selling phase (the seckill
// group's own, sellingPhase: as long, as many clients): first alone, then
// with a stock count of -count-lines lines posted during it, as `inventoryd
// import counts` posts a file (requests of 10,000 lines, one after the
// other, with the admin token). The count names every seeded SKU and the
// hot SKU the phase sells (a delivery of 1,000 found on its shelf, in the
// middle of the file, so the count's batch takes the hot row while the
// sale goes on); -count-changed of the others (10% by default: a
// warehouse's count mostly confirms what the system says) differ from the
// stock by 1 to 3 units, up or down, and the rest confirm it.
// The verdicts are the median pair's ratio of the selling rates (target:
// with the count >= 90% of without) and the slowest import's lines per
// second (target: >= 20,000), and every count's lines are checked applied.

var (
	countPairs   = flag.Int("count-pairs", 3, "counts group: how many interleaved pairs of seckill selling phases, without a count and then with one (the verdict is the median pair's ratio)")
	countLines   = flag.Int("count-lines", 50_000, "counts group: the lines of the count applied during the selling phase")
	countChanged = flag.Float64("count-changed", 0.1, "counts group: the share of the count's lines that find a level other than the stock says (the others confirm it)")
)

const (
	// countRequestLines is what one request of the import carries (the
	// service's limit, and import counts' page).
	countRequestLines = 10_000
	// countDelivery is what the count finds more of the hot SKU than its
	// stock says.
	countDelivery = 1000
	// countStart is how far into the selling phase the import starts.
	countStart = 500 * time.Millisecond
	// countAge is how long before it is posted the count was taken: longer
	// than the minute after which a line that changes nothing is answered
	// without its SKU's row lock (arbiter.ReadRebase), as a count file
	// loaded some time after the count is.
	countAge = 70 * time.Second
	// The targets.
	countRateTarget  = 0.90
	countLinesTarget = 20_000.0
)

// countImport is one count posted during a selling phase.
type countImportRun struct {
	lines   int
	elapsed time.Duration
	applied int64
	err     error
}

func (c countImportRun) linesPerSecond() float64 { return float64(c.lines) / c.elapsed.Seconds() }

// countPair is one pair of selling phases.
type countPair struct {
	without, with httpResult
	count         countImportRun
}

// ratio is the pair's ratio of sales (201s) per second, with the count
// over without.
func (p countPair) ratio() float64 { return sales(p.with) / sales(p.without) }

// sales is a phase's 201s per second (its rate counts every answer).
func sales(r httpResult) float64 { return r.rate * ratio201(r) }

// countsBench runs the counts group and writes its table.
func countsBench(ctx context.Context, rdb *redis.Client, dsnBase string) {
	prog.phase("counts setup")
	a, db := startService(ctx, rdb, dsnBase, *dbPrefix+"_counts")
	defer a.Shutdown(context.Background())
	defer db.Close()
	const flash = 1_000_000_000
	_, err := a.Catalog.Put(ctx, "FLASH", flash, 0)
	must(err)
	// The warehouse's SKUs, seeded in bulk (creating 50,000 through the
	// API is the catalog's measure, not this one's), each with its opening
	// balance as retention leaves one; the catalog existed an hour before
	// the sale (the hot SKU's put too), as a warehouse's does. The rows
	// name that balance (the put) as their last change of on_hand, as the
	// arbiter writes them.
	n := *countLines - 1
	skus := make([]string, n)
	for i := range skus {
		skus[i] = fmt.Sprintf("WH-%06d", i)
	}
	opened := time.Now().UTC().Add(-time.Hour)
	for start := 0; start < n; start += 1000 {
		part := skus[start:min(n, start+1000)]
		args, moves := make([]any, 0, 3*len(part)), make([]any, 0, 2*len(part))
		for _, s := range part {
			args = append(args, s, 100, opened)
			moves = append(moves, s, opened)
		}
		must(exec1(db, "INSERT INTO skus (sku, on_hand, movement_position, on_hand_position, on_hand_moved_at) VALUES "+
			strings.TrimSuffix(strings.Repeat("(?, ?, 1, 1, ?), ", len(part)), ", "), args...))
		must(exec1(db, "INSERT INTO stock_movements (sku, position, kind, on_hand_delta, reserved_delta, reason, created_at) VALUES "+
			strings.TrimSuffix(strings.Repeat("(?, 1, 'SET', 100, 0, 'opening balance', ?), ", len(part)), ", "), moves...))
	}
	must(exec1(db, "UPDATE stock_movements SET created_at = ? WHERE sku = 'FLASH'", opened))
	must(exec1(db, "UPDATE skus SET on_hand_moved_at = ? WHERE sku = 'FLASH'", opened))
	base := "http://" + a.Addr()
	var batch int
	// Warm up: the hot SKU's Redis copy, the connections, the caches.
	_ = load("seckill, selling, warm-up (not judged)", base+"/v1/seckill/FLASH/buy", *workers, 2*time.Second,
		func(w int) http.Header { return credentials("s", w) }, func(int, int64) string { return `{}` })

	levels := make([]int64, n) // the seeded SKUs' stock, as the counts leave it
	for i := range levels {
		levels[i] = 100
	}
	var pairs []countPair
	for i := 1; i <= *countPairs; i++ {
		var p countPair
		time.Sleep(2 * time.Second) // what the last phase left (InnoDB's flushing, the relay) settles
		p.without = sellingPhase(a, base, fmt.Sprintf("seckill, selling, no count #%d", i), &batch)
		time.Sleep(2 * time.Second)
		// The count: counted countAge ago (a file is loaded some time
		// after the count), posted from countStart into the phase.
		at := time.Now().UTC().Add(-countAge)
		lines := countFile(skus, levels, i)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(countStart)
			p.count = postCount(base, fmt.Sprintf("bench-%d-%d", time.Now().Unix(), i), at, lines)
		}()
		stopProfile := profileCount(i)
		p.with = sellingPhase(a, base, fmt.Sprintf("seckill, selling, %d-line count #%d", len(lines), i), &batch)
		stopProfile()
		wg.Wait()
		must(p.count.err)
		pairs = append(pairs, p)
	}
	// Every count applied: the seeded SKUs' stock is the last count's.
	var wrong int64
	want := map[string]int64{}
	for k, s := range skus {
		want[s] = levels[k]
	}
	rows, err := db.QueryContext(ctx, `SELECT sku, on_hand FROM skus WHERE sku LIKE 'WH-%'`)
	must(err)
	for rows.Next() {
		var sku string
		var onHand int64
		must(rows.Scan(&sku, &onHand))
		if want[sku] != onHand {
			wrong++
		}
	}
	must(rows.Err())
	_ = rows.Close()
	var hot int64
	must(db.QueryRowContext(ctx, `SELECT on_hand FROM skus WHERE sku = 'FLASH'`).Scan(&hot))
	prog.phase("report")
	prog.finish()
	table := countsTable(pairs, wrong, hot-flash)
	fmt.Print(table)
	must(os.MkdirAll(dirOf(*out), 0o755))
	must(os.WriteFile(strings.TrimSuffix(*out, ".md")+"-counts.md", []byte(table), 0o644))
}

// profileCount profiles pair i's phase with the count when -cpuprofile is
// set (into -cpuprofile with ".counts-<i>" before its extension).
func profileCount(i int) func() {
	if *cpuProf == "" {
		return func() {}
	}
	ext := filepath.Ext(*cpuProf)
	f, err := os.Create(fmt.Sprintf("%s.counts-%d%s", strings.TrimSuffix(*cpuProf, ext), i, ext))
	must(err)
	must(pprof.StartCPUProfile(f))
	return func() {
		pprof.StopCPUProfile()
		must(f.Close())
	}
}

// countLine is one line of the bench's count file.
type countLine struct {
	SKU     string `json:"sku"`
	Counted int64  `json:"counted"`
}

// countFile is pair i's count of the seeded SKUs at levels (which it
// moves to what it counts): -count-changed of them (spread evenly, the
// pair's own) off by 1 to 3 units either way, the rest as the stock says;
// and the hot SKU, in the middle, with a delivery found on its shelf per
// count.
func countFile(skus []string, levels []int64, i int) []countLine {
	lines := make([]countLine, 0, len(skus)+1)
	every := max(1, int(1 / *countChanged + 0.5))
	for k, s := range skus {
		if k == len(skus)/2 {
			lines = append(lines, countLine{SKU: "FLASH", Counted: 1_000_000_000 + int64(i)*countDelivery})
		}
		if (k+i)%every == 0 {
			levels[k] = max(levels[k]+int64(k%3+1)*int64(1-2*(k%2)), 0)
		}
		lines = append(lines, countLine{SKU: s, Counted: levels[k]})
	}
	return lines
}

// postCount posts lines as one count, in requests of countRequestLines
// one after the other, and times it from the first request to the last
// answer.
func postCount(base, id string, at time.Time, lines []countLine) countImportRun {
	r := countImportRun{lines: len(lines)}
	start := time.Now()
	for off := 0; off < len(lines); off += countRequestLines {
		page := lines[off:min(len(lines), off+countRequestLines)]
		var res struct {
			Totals struct{ Applied int64 }
		}
		if _, err := apiCall("POST", base+"/v1/stock/counts", benchAdmin,
			map[string]any{"count_id": id, "counted_at": at, "offset": off, "lines": page}, &res); err != nil {
			r.err = err
			return r
		}
		r.applied += res.Totals.Applied
	}
	r.elapsed = time.Since(start)
	if r.applied != int64(len(lines)) {
		r.err = fmt.Errorf("count %s: %d of %d lines applied", id, r.applied, len(lines))
	}
	return r
}

// countsTable is the group's table and verdicts.
func countsTable(pairs []countPair, wrong, hotMoved int64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## Counts: a %d-line count during the seckill selling phase\n\n", *countLines)
	fmt.Fprintf(&b, "%d clients, %s phases, load average %s; requests of %d lines, posted one after the other from %s into the phase; counted %s before; %.0f%% of the lines find another level than the stock says, the rest confirm it.\n\n",
		*workers, *duration, loadAverage(), countRequestLines, countStart, countAge, 100**countChanged)
	b.WriteString("| pair | selling, no count (201/s) | selling, with the count (201/s) | ratio | p99 without / with | count: lines/s (took) | CPU s without / with: this process, MariaDB, Redis, the rest |\n|---|---|---|---|---|---|---|\n")
	ratios := make([]float64, len(pairs))
	slowest := 0.0
	for i, p := range pairs {
		ratios[i] = p.ratio()
		lps := p.count.linesPerSecond()
		if i == 0 || lps < slowest {
			slowest = lps
		}
		fmt.Fprintf(&b, "| #%d | %.0f | %.0f | %.2f | %s / %s | %.0f (%s) | %s / %s |\n", i+1, sales(p.without), sales(p.with),
			ratios[i], dur(p.without.p99), dur(p.with.p99), lps, p.count.elapsed.Round(time.Millisecond), cpuCell(p.without.name), cpuCell(p.with.name))
	}
	slices.Sort(ratios)
	median := ratios[len(ratios)/2]
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "MISSED"
	}
	fmt.Fprintf(&b, "\n- selling rate with the count / without (median pair): %.2f, target >= %.2f: %s\n", median, countRateTarget, verdict(median >= countRateTarget))
	fmt.Fprintf(&b, "- the slowest count: %.0f lines/s, target >= %.0f: %s\n", slowest, countLinesTarget, verdict(slowest >= countLinesTarget))
	fmt.Fprintf(&b, "- the seeded SKUs not at the last count's level: %d (must be 0); the hot SKU's on_hand moved by %d (must be the counts' deliveries: %d)\n",
		wrong, hotMoved, int64(len(pairs))*countDelivery)
	return b.String()
}

// cpuCell is the CPU seconds phase name used, by process: this one (the
// service and the load), MariaDB, Redis, and the rest of the machine.
func cpuCell(name string) string {
	ph, ok := cpuPhaseNamed(name)
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%.1f, %.1f, %.1f, %.1f", ph.group["benchtable"], ph.group["mariadbd"], ph.group["redis-server"], ph.other)
}

// ratio201 is the share of a phase's answers that were 201 (the rate
// counts every answer).
func ratio201(r httpResult) float64 {
	if n := r.answers(); n > 0 {
		return float64(r.codes[201]) / float64(n)
	}
	return 0
}

func dirOf(path string) string {
	if i := strings.LastIndex(path, "/"); i >= 0 {
		return path[:i]
	}
	return "."
}
