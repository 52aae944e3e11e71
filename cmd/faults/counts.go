package main

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/acme/inventory/internal/arbiter"
)

// The workload's stock count (issue 45): a few seconds in, the warehouse
// counts every SKU of the scenario (the level a GET read, some lines off
// by a few units, none paid and unshipped), and a second or two later
// (sales, faults and all going on) the count is posted with that moment as
// its counted_at. The service rebases each line to counted_at and applies
// the correction now, never below what is held (a shortfall is a short
// line, an anomaly and a sku.shortage event).
//
// The checker (checker.go) books each line's applied correction as it
// books a restock: what the database recorded (the COUNT movements, per
// line by its reference) is stocked, and an answered line the database
// does not have as answered is lost. The history (linearizable.go) has
// each answered line as an adjust of its SKU by the correction applied,
// with no reference: the line moved on_hand by that much, once, at some
// moment between the first attempt's send and the answer (a retry is
// answered from the first run's records). A count no attempt of which was
// answered is a problem of the run: what it applied is unknown.

// countSeen is the count as the workload sent it and was answered.
type countSeen struct {
	ID        string
	CountedAt time.Time
	Lines     int                   // lines sent
	Attempts  int                   // POSTs sent
	Answered  bool                  // a 200 came
	Status    int                   // the last answer's status (0: none)
	Done      int                   // lines the answer's totals say applied
	Applied   map[int64]countedLine // answered lines (every one but the unchanged), by line number
}

// countedLine is one answered line.
type countedLine struct {
	SKU     string
	Outcome string
	Applied int64 // the correction applied to on_hand
	Short   int64 // units it could not take: on_hand went down to reserved
}

// countPass bounds a pass of the count's reads.
const countPass = 300 * time.Millisecond

// countOff is the share of lines, one in countOff, counted off by a few
// units.
const countOff = 2

// counter takes the run's count and posts it (see above).
func (wl *Workload) counter(ctx context.Context, rng *rand.Rand, _ int) {
	sleep(ctx, time.Duration(2000+rng.IntN(1500))*time.Millisecond)
	if ctx.Err() != nil {
		return
	}
	skus := make([]string, 0, len(initialStock))
	for sku := range initialStock {
		skus = append(skus, sku)
	}
	slices.Sort(skus)
	// The count is what one quick pass of reads found, dated when the pass
	// began: a pass a fault slowed (a read unanswered, or the pass longer
	// than countPass) is taken again, or the count would be dated seconds
	// before levels it read (rebased over what came between: a restock
	// counted twice).
	var at time.Time
	var lines []map[string]any
	for try := 0; try < 20 && ctx.Err() == nil; try++ {
		at, lines = time.Now(), nil
		for _, sku := range skus {
			a := wl.c.do(ctx, rng, http.MethodGet, "/v1/skus/"+sku, nil, wl.c.clientHeader())
			if a.Status != http.StatusOK {
				break
			}
			counted := a.num("on_hand")
			if rng.IntN(countOff) == 0 {
				counted += int64(rng.IntN(7) - 3)
			}
			lines = append(lines, map[string]any{"sku": sku, "counted": max(0, counted), "unshipped": 0})
		}
		if len(lines) == len(skus) && time.Since(at) <= countPass {
			break
		}
		lines = nil
		sleep(ctx, time.Duration(200+rng.IntN(300))*time.Millisecond)
	}
	if len(lines) == 0 {
		return // no quick pass before the end of the run: no count
	}
	sleep(ctx, time.Duration(1000+rng.IntN(2000))*time.Millisecond) // sold, paid and given back meanwhile: the rebase takes them out
	seen := &countSeen{ID: fmt.Sprintf("count-%d", wl.seed), CountedAt: at.UTC(), Lines: len(lines), Applied: map[int64]countedLine{}}
	body := map[string]any{"count_id": seen.ID, "counted_at": seen.CountedAt.Format(time.RFC3339Nano), "lines": lines}
	// Retried with the same body past the end of the run, as a careful
	// importer does: a replay answers as the first run did.
	settle := context.WithoutCancel(ctx)
	first := time.Now()
	a := wl.c.retry(settle, rng, 20, func() Answer {
		seen.Attempts++
		return wl.c.do(settle, rng, http.MethodPost, "/v1/stock/counts", body, wl.c.adminHeader())
	})
	end := time.Now()
	seen.Status = a.Status
	if a.Status == http.StatusOK {
		seen.Answered = true
		totals, _ := a.Body["totals"].(map[string]any)
		done, _ := totals["applied"].(float64)
		seen.Done = int(done)
		answered, _ := a.Body["lines"].([]any)
		for _, x := range answered {
			m, _ := x.(map[string]any)
			n, _ := m["line"].(float64)
			sku, _ := m["sku"].(string)
			outcome, _ := m["outcome"].(string)
			applied, _ := m["applied"].(float64)
			short, _ := m["short"].(float64)
			seen.Applied[int64(n)] = countedLine{SKU: sku, Outcome: outcome, Applied: int64(applied), Short: int64(short)}
		}
		wl.c.hist.recordCount(first, end, seen)
	}
	wl.w.counted(seen)
}

func (w *Witness) counted(c *countSeen) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.count = c
}

// recordCount adds an answered count to the history: one adjust per line
// that moved on_hand, by what it applied, from the first attempt's send to
// the answer. No reference: the line's one movement is the count's, and a
// retry does not add another (the count's replay is its own records).
func (h *History) recordCount(first, end time.Time, c *countSeen) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, n := range slices.Sorted(maps.Keys(c.Applied)) {
		l := c.Applied[n]
		if l.Applied == 0 {
			continue
		}
		h.ops = append(h.ops, histOp{Kind: opAdjust, SKU: l.SKU, N: l.Applied, Out: outOK, Status: http.StatusOK,
			Call: h.since(first), Ret: h.since(end)})
	}
}

// countReference is a line's movement reference and shortage token.
func countReference(id string, line int64) string { return arbiter.CountReference(id, line) }

// checkCount books the count's corrections (counts.go) as stocked, as the
// database recorded them (each line's COUNT movement, by its reference),
// and holds the answer to them: a line answered applied that the
// database does not have, or has otherwise, is lost; a movement of the
// count whose line was answered as moving nothing is a problem too. A
// count never answered is a problem of the run: what it did is unknown to
// the client, and the history cannot place it.
func checkCount(ctx context.Context, db *sql.DB, c *countSeen, skus map[string]*skuState, v *Verdict) error {
	recorded := map[string]int64{}
	if err := scan(ctx, db, `SELECT sku, reference, on_hand_delta FROM stock_movements WHERE kind = 'COUNT'`, func(r *sql.Rows) error {
		var sku, ref string
		var d int64
		if err := r.Scan(&sku, &ref, &d); err != nil {
			return err
		}
		s, ok := skus[sku]
		if !ok {
			return fmt.Errorf("a count's movement of unexpected SKU %q", sku)
		}
		s.stocked += d
		recorded[ref] += d
		return nil
	}); err != nil {
		return err
	}
	if c == nil {
		if len(recorded) > 0 {
			v.problem("%d COUNT movements, and the workload posted no count", len(recorded))
		}
		return nil
	}
	if !c.Answered {
		v.problem("count %s: no answer in %d attempts (last status %d); the database has %d of its lines' movements", c.ID, c.Attempts, c.Status, len(recorded))
		return nil
	}
	if c.Done != c.Lines {
		v.problem("count %s: %d lines sent, %d answered applied", c.ID, c.Lines, c.Done)
	}
	for n, l := range c.Applied {
		ref := countReference(c.ID, n)
		got, ok := recorded[ref]
		delete(recorded, ref)
		switch {
		case l.Applied != 0 && !ok:
			v.Lost += max(l.Applied, -l.Applied)
			v.problem("count %s line %d (%s) answered %d applied, not recorded", c.ID, n, l.SKU, l.Applied)
		case got != l.Applied:
			v.problem("count %s line %d (%s) answered %d applied, the database has %d", c.ID, n, l.SKU, l.Applied, got)
		}
	}
	for ref, d := range recorded {
		v.problem("a COUNT movement %s of %d no answered line accounts for (a line left out of the answer is unchanged)", ref, d)
	}
	return nil
}

// settleCountShortages holds the count's short lines to the anomalies the
// database recorded (one per short line, of its units, and none for a line
// answered otherwise), then resolves them as the operator who looked into
// the shortfall does: reconcile (Run.settle) reports every unresolved
// anomaly, and these are the count's answer, not drift. Any other anomaly
// stays for reconcile and the checker to report.
func (r *Run) settleCountShortages(ctx context.Context, v *Verdict) error {
	c := r.witness.count
	if c == nil {
		r.note("no count posted: no quick pass of reads before the workload ended")
		return nil
	}
	if !c.Answered {
		return nil // checkCount reports it
	}
	short := map[string]int64{}
	for n, l := range c.Applied {
		if l.Short > 0 {
			short[countReference(c.ID, n)] = l.Short
		}
	}
	recorded := map[string]int64{}
	if err := scan(ctx, r.db, `SELECT token, qty FROM stock_anomalies WHERE op = '`+string(arbiter.OpCount)+`'`, func(rows *sql.Rows) error {
		var token string
		var qty int64
		if err := rows.Scan(&token, &qty); err != nil {
			return err
		}
		recorded[token] += qty
		return nil
	}); err != nil {
		return err
	}
	var tokens []any
	for token, n := range short {
		switch got, ok := recorded[token]; {
		case !ok:
			v.problem("count line %s answered %d units short; no shortage recorded", token, n)
		case got != n:
			v.problem("count line %s answered %d units short; the anomalies say %d", token, n, got)
		default:
			tokens = append(tokens, token)
		}
		delete(recorded, token)
	}
	for token, n := range recorded {
		v.problem("a count's shortage %s of %d units no answered line accounts for", token, n)
	}
	var corrected, added, removed, units int64
	for _, l := range c.Applied {
		switch {
		case l.Applied > 0:
			corrected, added = corrected+1, added+l.Applied
		case l.Applied < 0:
			corrected, removed = corrected+1, removed-l.Applied
		}
		units += l.Short
	}
	r.note("count %s: %d lines counted at %.1fs, answered after %d attempt(s): %d corrected (+%d, -%d units), %d short by %d units (their anomalies resolved before reconcile)",
		c.ID, c.Lines, c.CountedAt.Sub(r.start).Seconds(), c.Attempts, corrected, added, removed, len(short), units)
	if len(tokens) == 0 {
		return nil
	}
	_, err := r.db.ExecContext(ctx, `UPDATE stock_anomalies SET resolved_at = CURRENT_TIMESTAMP(6) WHERE op = ? AND token IN (?`+
		strings.Repeat(", ?", len(tokens)-1)+`)`, append([]any{string(arbiter.OpCount)}, tokens...)...)
	return err
}
