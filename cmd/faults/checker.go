package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	gormmysql "gorm.io/driver/mysql"

	"github.com/acme/inventory/internal/arbiter"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Verdict is what the checker found after a scenario settled, read from the
// database and the API alone, held against the workload's witness.
type Verdict struct {
	Scenario   string
	Ops        int64
	Oversold   int64 // units sold, or still offered by the database, beyond units ever stocked
	Lost       int64 // units neither sold, available nor held; acknowledged orders/payments/commits/restocks missing
	Duplicated int64 // operations applied twice (two movements for one cause); orders answered PAID to two payments
	Stuck      int64 // orders PENDING past deadline + sweep, holds past expiry, operations not applied
	Drift      string
	Sold       int64 // units sold, over every SKU (to see the run sold out, not idled)
	Stocked    int64
	FiveXX     map[int]int64
	Problems   []string       // every non-zero finding, in words
	History    *HistVerdict   // the history check (linearizable.go)
	Campaign   *CampaignCheck // a campaign run's own checks (campaign.go); their units are in the columns too
	Webhooks   *HookCheck     // a webhook run's deliveries, judged (webhooks.go)
	Notes      []string       // what the scenario did (faults injected, when)

	Timing         Timing   // the answers' times
	Timed          bool     // the timing thresholds are verdicts in this scenario
	TimingProblems []string // every threshold missed (Timed scenarios, and a takeover wherever measured)
}

func (v *Verdict) problem(format string, args ...any) {
	v.Problems = append(v.Problems, fmt.Sprintf(format, args...))
}

// Passed: the promise held (ZerosPassed), the history is linearizable
// (linearizable.go) and, in a Timed scenario, every answer came within the
// thresholds of docs/SPEC.md section 7.
func (v *Verdict) Passed() bool {
	return v.ZerosPassed() && len(v.TimingProblems) == 0 && (v.History == nil || v.History.passed())
}

// ZerosPassed: nothing oversold, lost, duplicated or stuck, reconcile
// clean, no 5xx but 503 (an outage is allowed to say so).
func (v *Verdict) ZerosPassed() bool {
	for code := range v.FiveXX {
		if code != http.StatusServiceUnavailable {
			return false
		}
	}
	return v.Oversold == 0 && v.Lost == 0 && v.Duplicated == 0 && v.Stuck == 0 && v.Drift == "clean" && len(v.Problems) == 0
}

func (v *Verdict) fiveXX() string {
	if len(v.FiveXX) == 0 {
		return "0"
	}
	var codes []int
	for c := range v.FiveXX {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	var parts []string
	for _, c := range codes {
		parts = append(parts, fmt.Sprintf("%d×%d", v.FiveXX[c], c))
	}
	return strings.Join(parts, " ")
}

// skuState is one SKU's numbers at the end of a run.
type skuState struct {
	onHand, reserved, live, sold, stocked int64
}

// check reads the final state. stocked is what the workload put in: the
// initial stock plus every restock the database recorded (stock_adjustments,
// never pruned; an acknowledged restock it lacks is lost).
//
// redisAvailable is what Redis says is available (the API's
// redis_available in a run).
func check(ctx context.Context, db *sql.DB, outbox arbiter.Outbox, redisAvailable func(context.Context, string) (int64, error), w *Witness, ttlPlusSweep time.Duration, v *Verdict) error {
	skus := map[string]*skuState{}
	for sku, n := range initialStock {
		skus[sku] = &skuState{stocked: n}
	}
	refs := map[string]bool{}
	if err := scan(ctx, db, `SELECT reference FROM stock_adjustments`, func(r *sql.Rows) error {
		var ref string
		err := r.Scan(&ref)
		refs[ref] = true
		return err
	}); err != nil {
		return err
	}
	for _, r := range w.restocks {
		switch {
		case refs[r.Ref]:
			skus[r.SKU].stocked += r.Delta
		case r.Acked:
			v.Lost += r.Delta
			v.problem("restock %s of %d %s acknowledged, not recorded", r.Ref, r.Delta, r.SKU)
		}
	}
	if err := checkCount(ctx, db, w.count, skus, v); err != nil {
		return err
	}
	if err := scan(ctx, db, `SELECT sku, on_hand, reserved FROM skus`, func(r *sql.Rows) error {
		var sku string
		var onHand, reserved int64
		if err := r.Scan(&sku, &onHand, &reserved); err != nil {
			return err
		}
		s, ok := skus[sku]
		if !ok {
			return fmt.Errorf("unexpected SKU %q in the database", sku)
		}
		s.onHand, s.reserved = onHand, reserved
		return nil
	}); err != nil {
		return err
	}
	// Sold: paid orders' lines, and committed token holds (not orders').
	for _, q := range []string{
		`SELECT r.sku, COALESCE(SUM(r.qty), 0) FROM orders o JOIN stock_reservations r ON r.token = o.reservation_token WHERE o.status = 'PAID' GROUP BY r.sku`,
		`SELECT sku, COALESCE(SUM(qty), 0) FROM stock_reservations WHERE order_id IS NULL AND state IN ('COMMITTED', 'SOLD') GROUP BY sku`,
	} {
		if err := scanSKUs(ctx, db, q, func(s *skuState, n int64) { s.sold += n }, skus); err != nil {
			return err
		}
	}
	// Held: unpaid holds. (Committed ones are sold already, and still in
	// on_hand and reserved until applied.)
	if err := scanSKUs(ctx, db, `SELECT sku, COALESCE(SUM(qty), 0) FROM stock_reservations WHERE state = 'HELD' GROUP BY sku`,
		func(s *skuState, n int64) { s.live += n }, skus); err != nil {
		return err
	}
	// The history must add up to the counters (docs/SPEC.md: one movement
	// per change, in the change's transaction).
	if err := scan(ctx, db, `SELECT s.sku, s.on_hand, s.reserved, COALESCE(SUM(m.on_hand_delta), 0), COALESCE(SUM(m.reserved_delta), 0)
		FROM skus s LEFT JOIN stock_movements m ON m.sku = s.sku GROUP BY s.sku, s.on_hand, s.reserved`, func(r *sql.Rows) error {
		var sku string
		var onHand, reserved, onHandSum, reservedSum int64
		if err := r.Scan(&sku, &onHand, &reserved, &onHandSum, &reservedSum); err != nil {
			return err
		}
		if onHand != onHandSum || reserved != reservedSum {
			v.problem("%s: on_hand %d, reserved %d, but the movements sum to %d and %d", sku, onHand, reserved, onHandSum, reservedSum)
		}
		return nil
	}); err != nil {
		return err
	}
	// What clients were told was sold must fit in what was stocked too: a
	// second sale of one unit the database somehow kept no trace of would
	// show here, whatever its counters say.
	status := map[string]string{}
	paymentID := map[string]string{}
	if err := scan(ctx, db, `SELECT id, status, COALESCE(payment_id, '') FROM orders`, func(r *sql.Rows) error {
		var id, st, pid string
		err := r.Scan(&id, &st, &pid)
		status[id], paymentID[id] = st, pid
		return err
	}); err != nil {
		return err
	}
	told := map[string]int64{}
	for _, o := range w.orders {
		// Refunded (answered so, or refunded by a refund whose answer was lost).
		if len(o.Paid) > 0 && !w.refunds[o.ID] && status[o.ID] != "REFUNDED" {
			for sku, q := range o.Items {
				told[sku] += q
			}
		}
	}
	for _, q := range w.commits {
		told[tokenSKU] += q
	}

	names := make([]string, 0, len(skus))
	for sku := range skus {
		names = append(names, sku)
	}
	sort.Strings(names)
	for _, sku := range names {
		s := skus[sku]
		redis, err := redisAvailable(ctx, sku)
		if err != nil {
			return err
		}
		v.Sold += s.sold
		v.Stocked += s.stocked
		// Every unit stocked is sold, available or held, once:
		// stocked = sold + (on_hand - reserved) + held. More than that is
		// oversold (sold, or still offered, beyond stock); less is lost.
		// Clients told more units were theirs than were stocked is oversold
		// too; the larger of the two counts.
		excess := told[sku] - s.stocked
		d := s.sold + (s.onHand - s.reserved) + s.live - s.stocked
		if excess > 0 {
			v.problem("%s: clients were told %d units were theirs, of %d stocked", sku, told[sku], s.stocked)
		}
		if d > 0 {
			v.problem("%s: sold %d + available %d + held %d exceeds stocked %d", sku, s.sold, s.onHand-s.reserved, s.live, s.stocked)
		}
		v.Oversold += max(0, excess, d)
		if d < 0 {
			v.Lost += -d
			v.problem("%s: sold %d + available %d + held %d falls short of stocked %d", sku, s.sold, s.onHand-s.reserved, s.live, s.stocked)
		}
		switch avail := s.onHand - s.reserved; {
		case redis < avail:
			v.Lost += avail - redis
			v.problem("%s: Redis shows %d available, the database %d", sku, redis, avail)
		case redis > avail: // the database arbitrates: not sold, but not aligned either
			v.problem("%s: Redis shows %d available, the database only %d", sku, redis, avail)
		}
	}

	// Acknowledged orders, payments and commits must be recorded.
	items := map[string]map[string]int64{}
	// An order's lines are its reservations under its reservation token.
	if err := scan(ctx, db, `SELECT o.id, r.sku, r.qty FROM orders o JOIN stock_reservations r ON r.token = o.reservation_token`, func(r *sql.Rows) error {
		var id, sku string
		var q int64
		err := r.Scan(&id, &sku, &q)
		if items[id] == nil {
			items[id] = map[string]int64{}
		}
		items[id][sku] = q
		return err
	}); err != nil {
		return err
	}
	ledger := map[string]bool{} // "op token sku", tokens of orders as order ids
	if err := scan(ctx, db, `SELECT op, token, sku FROM stock_ledger`, func(r *sql.Rows) error {
		var op, tok, sku string
		err := r.Scan(&op, &tok, &sku)
		ledger[op+" "+strings.TrimSuffix(tok, ".late")+" "+sku] = true
		return err
	}); err != nil {
		return err
	}
	for _, o := range w.orders {
		st, ok := status[o.ID]
		if !ok {
			v.Lost += sum(o.Items)
			v.problem("order %s answered 201, not in the database", o.ID)
			continue
		}
		if fmt.Sprint(items[o.ID]) != fmt.Sprint(o.Items) {
			v.Lost += sum(o.Items)
			v.problem("order %s answered with items %v, the database has %v", o.ID, o.Items, items[o.ID])
		}
		for sku, q := range o.Items {
			if len(o.Paid) > 0 && !ledger["DEDUCT "+o.ID+" "+sku] {
				v.Lost += q
				v.problem("order %s answered PAID; no deduction of %s was applied", o.ID, sku)
			}
			if w.refunds[o.ID] && !ledger["RESTORE "+o.ID+" "+sku] {
				v.Lost += q
				v.problem("order %s answered REFUNDED; no restore of %s was applied", o.ID, sku)
			}
		}
		if len(o.Paid) > 1 {
			v.Duplicated++
			v.problem("order %s answered PAID to %d payments", o.ID, len(o.Paid))
			continue
		}
		for pid := range o.Paid {
			if (st != "PAID" && st != "REFUNDED") || paymentID[o.ID] != pid {
				v.Lost += sum(o.Items)
				v.problem("order %s answered PAID by %s, the database has %s by %q", o.ID, pid, st, paymentID[o.ID])
			}
		}
	}
	type hold struct {
		state string
		qty   int64
	}
	holds := map[string]hold{}
	if err := scan(ctx, db, `SELECT SUBSTRING(token, 3), state, qty FROM stock_reservations WHERE order_id IS NULL AND token LIKE 't.%'`, func(r *sql.Rows) error {
		var tok string
		var h hold
		err := r.Scan(&tok, &h.state, &h.qty)
		holds[tok] = h
		return err
	}); err != nil {
		return err
	}
	for tok, q := range w.commits {
		if h := holds[tok]; (h.state != "COMMITTED" && h.state != "SOLD") || h.qty != q {
			v.Lost += q
			v.problem("token %s answered %d committed, the database has %d %q", tok, q, h.qty, h.state)
		}
	}

	// An operation applied twice leaves two movements for one cause: an
	// order or token is sold, refunded or released at most once per SKU, a
	// count's line applied once.
	if err := scan(ctx, db, `SELECT sku, kind, reference, COUNT(*) FROM stock_movements
		WHERE kind IN ('SALE', 'REFUND', 'RELEASE', 'COUNT') GROUP BY sku, kind, reference HAVING COUNT(*) > 1`, func(r *sql.Rows) error {
		var sku, kind, ref string
		var n int64
		if err := r.Scan(&sku, &kind, &ref, &n); err != nil {
			return err
		}
		v.Duplicated += n - 1
		v.problem("%s %s of %s recorded %d times", sku, kind, ref, n)
		return nil
	}); err != nil {
		return err
	}

	// Stuck: nothing pending past its deadline plus the sweep, no hold past
	// expiry, every stock operation applied.
	before := time.Now().UTC().Add(-ttlPlusSweep)
	rowsBefore := func(query string) func() (int64, error) {
		return func() (n int64, err error) { return n, db.QueryRowContext(ctx, query, before).Scan(&n) }
	}
	for _, q := range []struct {
		what  string
		count func() (int64, error)
	}{
		{"orders PENDING past their deadline", rowsBefore(`SELECT COUNT(*) FROM orders WHERE status = 'PENDING' AND expires_at < ?`)},
		{"holds HELD past their expiry", rowsBefore(`SELECT COUNT(*) FROM stock_reservations WHERE state = 'HELD' AND expires_at < ?`)},
		{"stock operations not applied", func() (int64, error) { return outbox.UnappliedBefore(before) }},
		{"sales committed and never applied", rowsBefore(`SELECT COUNT(*) FROM stock_reservations WHERE state = 'COMMITTED' AND updated_at < ?`)},
	} {
		n, err := q.count()
		if err != nil {
			return err
		}
		if n > 0 {
			v.Stuck += n
			v.problem("%d %s", n, q.what)
		}
	}
	var anomalies int64
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM stock_anomalies WHERE resolved_at IS NULL`).Scan(&anomalies); err != nil {
		return err
	}
	if anomalies > 0 {
		v.problem("%d unresolved stock anomalies", anomalies)
	}
	return nil
}

func sum(m map[string]int64) int64 {
	var n int64
	for _, q := range m {
		n += q
	}
	return n
}

func scan(ctx context.Context, db *sql.DB, q string, row func(*sql.Rows) error) error {
	rows, err := db.QueryContext(ctx, q)
	if err != nil {
		return fmt.Errorf("%s: %w", strings.Fields(q)[1], err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := row(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

func scanSKUs(ctx context.Context, db *sql.DB, q string, add func(*skuState, int64), skus map[string]*skuState) error {
	return scan(ctx, db, q, func(r *sql.Rows) error {
		var sku string
		var n int64
		if err := r.Scan(&sku, &n); err != nil {
			return err
		}
		if s, ok := skus[sku]; ok {
			add(s, n)
		}
		return nil
	})
}

// outboxDB is db as GORM, opened once per run: the stock outbox's owner,
// internal/arbiter, speaks through it.
func outboxDB(db *sql.DB) *gorm.DB {
	g, err := gorm.Open(gormmysql.New(gormmysql.Config{Conn: db, SkipInitializeWithVersion: true}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		panic(err) // an existing connection pool, no version query: nothing can fail
	}
	return g
}
