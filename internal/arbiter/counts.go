package arbiter

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/acme/inventory"
)

// A stock count says how many units of each SKU were on the shelf at
// counted_at (T). The arbiter turns each line into a correction now,
// rebased to T (docs/design.md "Counts are rebased"):
//
//	on_hand(T)    = on_hand now − Σ on_hand_delta of the SKU's movements
//	                created at or after T (COUNT movements aside: see below)
//	unshipped(T)  = the line's unshipped, or Σ qty × ([sold_at < T] −
//	                [shipped_at < T]) over the SKU's stock_shipping rows
//	                not restored before T (shipping.go)
//	correction    = counted − unshipped(T) − on_hand(T)
//
// applied now as a COUNT movement under the SKU's row lock, never below
// reserved: what it cannot take is a shortage (an anomaly and a
// sku.shortage event). Movements are stamped with the writing node's clock
// when the statement runs (not when it commits), and every one is written
// under its SKU's row lock; so the rebase is exact when the clocks of the
// counting warehouse and of the service's nodes agree, and reads every
// movement that counts while holding the row lock.
//
// The read is split so the row lock is held briefly even on a SKU selling
// thousands of units since T: ReadRebase sums, without any lock and in
// one snapshot, the movements since T it sees, noting the SKU's
// movement_position in that snapshot (the position of the last movement
// it saw); then ApplyCount, holding the lock, compares it with the locked
// row's last change of on_hand (below) and adds, for the few SKUs whose
// on_hand moved since, the movements at higher positions. No movement is
// missed between them: a SKU's movements are numbered under its row lock,
// in commit order, so when ReadRebase ran, only the lock's holder could
// have had uncommitted ones, numbered after every committed one.
//
// Both read a SKU's movements by the (sku, position) key the history's
// pages use, a short range per SKU, and not by id: a key on (sku, id)
// would cost every movement's INSERT, every sale's, one more index entry.
// And both read only up to the SKU's last movement that changed on_hand,
// a count's aside (a put's SET always counts): the SKU's row says which
// (on_hand_position) and its stamp (on_hand_moved_at, the movement's own
// created_at), set by the UPDATE of every change of on_hand but a count's
// (Set, Restock, settleSKU), under the row lock, in the transaction that
// writes the movement. The movements past it are reservations and
// releases (and COUNT movements, a reconcile's correction of reserved, an
// unlimited SKU's sales), which change nothing the rebase sums: a hot SKU
// in a seckill writes tens of thousands of them since T, and the rebase
// reads none of them. The movements since T up to it are a range of
// positions too (see rebaseMargin): ReadRebase walks each SKU's movements
// back from that one until one stamped before T less rebaseMargin, and
// sums those after it; when that one was itself stamped before T less
// rebaseMargin (then it and every one below it were stamped before T), it
// reads no movement of the SKU at all. Under the lock, ApplyCount reads
// movements only for a SKU whose on_hand_position is past what ReadRebase
// saw. (A retention
// fold's opening balance may sit above on_hand_position, at the position
// of the last movement it folded: it was stamped before the retention
// horizon, older than any count's T, CountHorizon.)
//
// A COUNT movement is a correction as of its own count's counted_at, not
// of when it was written, and a SKU takes only counts later than the
// latest that corrected it (skus.counted_at, written with every COUNT
// movement; an earlier or equal count is superseded): so every COUNT
// movement written after T belongs to an earlier count and is part of
// on_hand(T), and the sum leaves them out. A line that confirms the level
// writes nothing to its SKU (most lines of a count do: that is what keeps
// a count beside a sale cheap), so a count older than one that only
// confirmed a SKU still applies to it. An admin's put (a
// SET movement) after T states the level outright, later than the count:
// it supersedes the count as a later count would (rebased, its delta would
// count the units it stated twice). A restock or a correction after T is
// units that came or went after the count, and is rebased over.

// CountLine is one line of a count to apply: its number in the count (from
// 1), the SKU, the units counted and, when the line said it, the units paid
// and not shipped at counted_at (nil: computed from the shipped signal).
type CountLine struct {
	Line      int64
	SKU       string
	Counted   int64
	Unshipped *int64
}

// A count line's outcomes.
const (
	CountCorrected  = "corrected"  // on_hand moved by the correction
	CountUnchanged  = "unchanged"  // the correction was 0
	CountShort      = "short"      // on_hand went down to reserved; the rest is a shortage
	CountUnknown    = "unknown"    // no such SKU: nothing applied
	CountUnlimited  = "unlimited"  // the SKU has unlimited stock: nothing applied
	CountSuperseded = "superseded" // a count at or after this counted_at, or a put, set the SKU later: nothing applied
)

// CountBatchLines is how many lines of a count one transaction applies, and
// one stock_count_batches row records: a request's lines from its first, a
// thousand at a time. It is a constant, not a setting: a replay must cut
// its request into the batches the first run did.
const CountBatchLines = 1000

// CountedLine is a count's line as applied: what the answer to its
// request, and to every replay of it, says.
type CountedLine struct {
	Line           int64  `json:"line"`
	SKU            string `json:"sku"`
	Counted        int64  `json:"counted"`
	Unshipped      int64  `json:"unshipped"`
	UnshippedGiven bool   `json:"unshipped_given,omitempty"`
	Outcome        string `json:"outcome"`
	// OnHandThen is on_hand as of counted_at; nil when nothing was applied.
	OnHandThen *int64 `json:"on_hand_then,omitempty"`
	Correction int64  `json:"correction,omitempty"`
	Applied    int64  `json:"applied,omitempty"`
	Short      int64  `json:"short,omitempty"`
	// OnHand is on_hand after the line; nil when nothing was applied.
	OnHand *int64 `json:"on_hand,omitempty"`
}

// CountTotals sum a batch's (or a count's) lines by outcome, and the units
// they moved.
type CountTotals struct {
	Corrected, Unchanged, Short, Unknown, Unlimited, Superseded int64
	UnitsAdded, UnitsRemoved, UnitsShort                        int64
}

// Add counts line l in t.
func (t *CountTotals) Add(l CountedLine) {
	switch l.Outcome {
	case CountCorrected:
		t.Corrected++
	case CountUnchanged:
		t.Unchanged++
	case CountShort:
		t.Short++
	case CountUnknown:
		t.Unknown++
	case CountUnlimited:
		t.Unlimited++
	case CountSuperseded:
		t.Superseded++
	}
	if l.Applied > 0 {
		t.UnitsAdded += l.Applied
	} else {
		t.UnitsRemoved -= l.Applied
	}
	t.UnitsShort += l.Short
}

// Sum adds u to t.
func (t *CountTotals) Sum(u CountTotals) {
	t.Corrected += u.Corrected
	t.Unchanged += u.Unchanged
	t.Short += u.Short
	t.Unknown += u.Unknown
	t.Unlimited += u.Unlimited
	t.Superseded += u.Superseded
	t.UnitsAdded += u.UnitsAdded
	t.UnitsRemoved += u.UnitsRemoved
	t.UnitsShort += u.UnitsShort
}

// CountBatchRecord is a batch of a count as applied (stock_count_batches):
// its lines' totals, and (Outcomes, JSON) the lines a request's answer
// lists, every one but the unchanged (see CountOutcome).
type CountBatchRecord struct {
	CountID   string `gorm:"primaryKey;column:count_id"`
	FirstLine int64  `gorm:"primaryKey;column:first_line"`
	LineCount int64  `gorm:"column:line_count"`
	CountTotals
	Outcomes  []byte    `gorm:"column:outcomes"`
	CreatedAt time.Time `gorm:"column:created_at"`
}

func (CountBatchRecord) TableName() string { return "stock_count_batches" }

// CountOutcome is a batch as a request's answer shows it: how many lines
// it has, their totals by outcome, and the lines that changed a SKU or
// were not applied (Lines: every outcome but CountUnchanged, in line
// order). A count mostly confirms the stock; an unchanged line is a
// number in the totals, so neither the answer nor the record carries it.
type CountOutcome struct {
	LineCount int64
	CountTotals
	Lines []CountedLine
}

// outcomeOf is the outcome of a batch whose lines are lines.
func outcomeOf(lines []CountedLine) *CountOutcome {
	o := &CountOutcome{LineCount: int64(len(lines)), Lines: []CountedLine{}}
	for _, l := range lines {
		o.Add(l)
		if l.Outcome != CountUnchanged {
			o.Lines = append(o.Lines, l)
		}
	}
	return o
}

// Decode is the batch's outcome.
func (r CountBatchRecord) Decode() (*CountOutcome, error) {
	o := &CountOutcome{LineCount: r.LineCount, CountTotals: r.CountTotals}
	if err := json.Unmarshal(r.Outcomes, &o.Lines); err != nil {
		return nil, fmt.Errorf("count %s: the batch from line %d does not decode: %w", r.CountID, r.FirstLine, err)
	}
	return o, nil
}

var countBatchColumns = []string{"count_id", "first_line", "line_count", "corrected", "unchanged", "short", "unknown",
	"unlimited", "superseded", "units_added", "units_removed", "units_short", "outcomes", "created_at"}

// OpCount is the op of a count's shortage in stock_anomalies.
const OpCount Op = "COUNT"

// CountReference names line of count id as a movement's reference and a
// shortage anomaly's token.
func CountReference(id string, line int64) string { return fmt.Sprintf("count:%s:%d", id, line) }

// clockSlack is how far apart two nodes' clocks may be for rebaseMargin
// to hold (never for the rebase's exactness, which wants them together).
const clockSlack = time.Minute

// Rebase is what ReadRebase read of a SKU outside its row lock.
type Rebase struct {
	// After sums the on_hand deltas of the SKU's movements created at or
	// after counted_at (COUNT ones aside) up to position Seen (those past
	// its last change of on_hand change nothing, and are not read).
	After int64
	// Seen is the SKU's movement_position in the read's snapshot, the
	// position of the last movement it saw (0: none, or no such SKU):
	// ApplyCount adds what came after it, when the SKU's on_hand moved
	// since.
	Seen int64
	// Set says an admin's put set the SKU's on_hand at or after
	// counted_at: a statement of the level later than the count's, which
	// supersedes it as a later count does.
	Set bool
	// Unshipped is unshipped(counted_at) from the shipped signal.
	Unshipped int64
	// Exists, OnHand, Reserved and CountedAt are the SKU's record in the
	// same snapshot (Exists false: none), and Settled says counted_at is
	// old enough for a line that changes nothing to be answered from them
	// (decided).
	Exists           bool
	OnHand, Reserved int64
	CountedAt        *time.Time
	Settled          bool
}

// settleAfter is how much older than a read its counted_at must be for
// a line that needs no correction to be answered from that read alone,
// without its SKU's row lock: every movement stamped before counted_at was
// committed by then (a transaction that writes movements commits within
// its request's deadline; MariaDB ends an idle one in 5 s).
const settleAfter = time.Minute

// rebaseMargin is how far before counted_at a read of a SKU's movements
// back from its last change of on_hand may stop (and when that change
// itself is older, need not start): every movement at a lower position than
// one stamped before T less rebaseMargin was stamped before T. A lower
// position committed before the later movement's transaction took the
// SKU's row lock (positions are numbered under it, in commit order), and
// that transaction committed within settleAfter of its own stamp (the
// assumption a settled line rests on); the two stamps come from clocks at
// most clockSlack apart. A movement's created_at is stamped inside its
// transaction before it commits, so it is not monotonic in position: the
// margin is what makes the stop safe.
const rebaseMargin = settleAfter + clockSlack

// ReadRebase reads, for each of skus, without locking anything and in one
// snapshot (a read-only repeatable-read transaction): its record, its
// movements since at, and unshipped(at). A SKU's movements are read as
// two short ranges of (sku, position) below its last change of on_hand
// (on_hand_position), and only for a SKU whose last change of on_hand was
// stamped at or after at less rebaseMargin (on_hand_moved_at): one
// statement walks each such SKU's movements back from that position until
// one stamped before at less rebaseMargin (ORDER BY position DESC LIMIT 1
// on the key: it stops at the first it finds), and a second sums, for the
// SKUs with movements past that one, those created at or after at. The
// record's statement reads no movement: a subquery there, correlated with
// the SKU, would be read by MariaDB from the SKU's newest movement down
// (its access by the key's sku alone), not from on_hand_position.
func ReadRebase(db *gorm.DB, skus []string, at time.Time) (map[string]Rebase, error) {
	at = at.UTC()
	out := make(map[string]Rebase, len(skus))
	if len(skus) == 0 {
		return out, nil
	}
	settled := at.Before(time.Now().Add(-settleAfter))
	stop := at.Add(-rebaseMargin) // a movement stamped before it is one to stop at
	for _, sku := range skus {
		out[sku] = Rebase{Settled: settled}
	}
	dialect := db.Dialector.Name()
	var opts []*sql.TxOptions
	if dialect != "sqlite" { // the embedded SQLite has one connection, and one writer
		opts = append(opts, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	}
	return out, db.Transaction(func(tx *gorm.DB) error {
		each := func(scan func(*sql.Rows) error, q string, args ...any) error {
			rows, err := tx.Raw(q, args...).Rows()
			if err != nil {
				return err
			}
			for rows.Next() {
				if err := scan(rows); err != nil {
					_ = rows.Close()
					return err
				}
			}
			return errors.Join(rows.Err(), rows.Close())
		}
		q, args := skuRows(dialect, `s.sku, s.on_hand, s.reserved, s.counted_at, s.movement_position, s.on_hand_position, s.on_hand_moved_at`,
			"skus", "s", "PRIMARY", skus)
		walk := map[string]int64{} // the SKUs whose last change of on_hand is recent: its position
		if err := each(func(rows *sql.Rows) error {
			var sku string
			var counted, moved sql.NullTime
			var last int64
			r := Rebase{Exists: true}
			if err := rows.Scan(&sku, &r.OnHand, &r.Reserved, &counted, &r.Seen, &last, &moved); err != nil {
				return err
			}
			if counted.Valid {
				t := counted.Time.UTC()
				r.CountedAt = &t
			}
			r.Settled = settled
			out[sku] = r
			if last > 0 && !(moved.Valid && moved.Time.Before(stop)) {
				walk[sku] = last
			}
			return nil
		}, q, args...); err != nil {
			return err
		}
		// The SKUs with movements past their stop (0 when none was found),
		// to sum up to their last change of on_hand.
		spans := map[string]span{}
		if len(walk) > 0 {
			stops := map[string]int64{}
			q, args := movementStops(dialect, walk, stop)
			if err := each(func(rows *sql.Rows) error {
				var sku string
				var p sql.NullInt64
				if err := rows.Scan(&sku, &p); err != nil {
					return err
				}
				stops[sku] = p.Int64
				return nil
			}, q, args...); err != nil {
				return err
			}
			for sku, last := range walk {
				if stops[sku] < last {
					spans[sku] = span{stops[sku], last}
				}
			}
		}
		if len(spans) > 0 {
			q, args := movementSums(dialect, spans, at)
			if err := each(func(rows *sql.Rows) error {
				var sku string
				var sum, set int64
				if err := rows.Scan(&sku, &sum, &set); err != nil {
					return err
				}
				r := out[sku]
				r.After, r.Set = sum, set == 1
				out[sku] = r
				return nil
			}, q, args...); err != nil {
				return err
			}
		}
		q, args = skuRows(dialect, `sh.sku, COALESCE(SUM(sh.qty * ((CASE WHEN sh.sold_at < ? THEN 1 ELSE 0 END) - (CASE WHEN sh.shipped_at < ? THEN 1 ELSE 0 END))), 0)`,
			"stock_shipping", "sh", "stock_shipping_sku", skus, at, at)
		q += ` AND (sh.restored_at IS NULL OR sh.restored_at >= ?) GROUP BY sh.sku`
		return each(func(rows *sql.Rows) error {
			var sku string
			var unshipped int64
			if err := rows.Scan(&sku, &unshipped); err != nil {
				return err
			}
			r := out[sku]
			r.Unshipped = unshipped
			out[sku] = r
			return nil
		}, q, append(args, at)...)
	}, opts...)
}

// skuRows is SELECT cols FROM table alias (args: the values of cols'
// placeholders) narrowed to the rows of skus by index (on table's sku),
// ending in a WHERE clause a caller may extend with AND. On MySQL the SKUs
// are one JSON argument read as a table (JSON_TABLE) that drives the join
// (STRAIGHT_JOIN, by index: a small table would otherwise be scanned): a
// list of a thousand SKUs in IN (?, ...) cost MariaDB 7-10 us a value to
// parse and plan (a 1,000-line batch's two reads were two fifths of a
// count's database time), the JSON table 5 us with the rows' own lookups.
// The embedded SQLite keeps the IN list.
func skuRows(dialect, cols, table, alias, index string, skus []string, args ...any) (string, []any) {
	if dialect == "sqlite" {
		return inList(`SELECT `+cols+` FROM `+table+` `+alias+` WHERE `+alias+`.sku IN ?`, len(skus)), append(args, anys(skus)...)
	}
	return `SELECT ` + cols + ` FROM ` + skuTable + ` STRAIGHT_JOIN ` + table + ` ` + alias + ` FORCE INDEX (` + index + `) ON ` +
		alias + `.sku = j.sku WHERE 1 = 1`, append(args, jsonStrings(skus))
}

// skuTable is a JSON array of SKUs (the statement's next argument) as a
// table j with one column, sku, compared as skus.sku is (binary).
const skuTable = `JSON_TABLE(?, '$[*]' COLUMNS (sku VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) j`

// jsonStrings is values as a JSON array.
func jsonStrings(values []string) string {
	b, _ := json.Marshal(values) // strings always marshal
	return string(b)
}

// decided is line l's outcome from its SKU's read alone when that needs
// no lock: the read is settled (see settleAfter) and the line changes
// nothing (an unknown or unlimited SKU, a later count or put, a count
// that finds the level the movements say). ok false: the line is applied
// under the SKU's row lock.
func (rb Rebase) decided(l CountLine, at time.Time) (CountedLine, bool) {
	if !rb.Settled {
		return CountedLine{}, false
	}
	row := CountedLine{Line: l.Line, SKU: l.SKU, Counted: l.Counted, Unshipped: rb.Unshipped}
	if l.Unshipped != nil {
		row.Unshipped, row.UnshippedGiven = *l.Unshipped, true
	}
	switch {
	case !rb.Exists:
		row.Outcome = CountUnknown
	case rb.OnHand == inventory.Unlimited:
		row.Outcome = CountUnlimited
	case rb.CountedAt != nil && !rb.CountedAt.Before(at), rb.Set:
		row.Outcome = CountSuperseded
	default:
		then := rb.OnHand - rb.After
		if l.Counted-row.Unshipped-then != 0 {
			return CountedLine{}, false
		}
		onHand := rb.OnHand
		row.Outcome, row.OnHandThen, row.OnHand = CountUnchanged, &then, &onHand
	}
	return row, true
}

// CountBatch is a batch of one count: its lines (distinct SKUs, in line
// order, numbered from FirstLine) with what ReadRebase read of their SKUs.
type CountBatch struct {
	CountID   string
	CountedAt time.Time
	FirstLine int64
	Lines     []CountLine
	Rebase    map[string]Rebase
}

// CountApplied is what ApplyCount did: the batch's outcome, as its record
// and a request's answer show it (nil when an earlier or concurrent run
// had applied it: its record has it), and the changes of available for
// Redis.
type CountApplied struct {
	Outcome *CountOutcome
	Changes []inventory.Change
}

// countLevel is a SKU's row as ApplyCount locks it: what a count needs,
// and what its fence and events need.
type countLevel struct {
	levelRow
	CountedAt      *time.Time
	OnHandPosition int64      // the position of its last change of on_hand (see ReadRebase)
	LevelAt        *time.Time // its last sku.level_changed
}

// levelDue says whether a SKU whose last sku.level_changed was at last
// may have another at now (levelEvery apart).
func levelDue(last *time.Time, now time.Time) bool {
	return last == nil || !last.After(now.Add(-levelEvery))
}

// ApplyCount applies batch b unless it was applied, under its SKUs' row
// locks (taken together, in SKU order, as every writer takes them; a line
// its read decided needs none, see Rebase.decided): each line rebased to
// b.CountedAt, one UPDATE of the SKUs, a COUNT movement
// per line that moved on_hand, per shortage an anomaly and a sku.shortage
// event, then the threshold events the new levels cross, and the batch's
// record (whatever its lines' outcomes: the batch is then applied, and a
// replay finds it). Run it in a transaction. A concurrent run of the same
// batch waits for the first's row locks and finds the record; with no
// existing SKU to lock, the two collide on the record's key
// (errInsertRaced: Transact runs the loser again, and it finds it).
func (a Arbiter) ApplyCount(b CountBatch) (CountApplied, error) {
	var out CountApplied
	if len(b.Lines) == 0 {
		return out, nil
	}
	at := b.CountedAt.UTC()
	decided := make(map[int64]CountedLine, len(b.Lines))
	var skus []string // to lock
	for _, l := range b.Lines {
		if row, ok := b.Rebase[l.SKU].decided(l, at); ok {
			decided[l.Line] = row
		} else {
			skus = append(skus, l.SKU)
		}
	}
	slices.Sort(skus)
	locked, err := a.lockCountLevels(skus)
	if err != nil {
		return out, err
	}
	var done int64
	if err := a.query(func(rs *sql.Rows) error { return rs.Scan(&done) },
		`SELECT COUNT(*) FROM stock_count_batches WHERE count_id = ? AND first_line = ?`, b.CountID, b.FirstLine); err != nil || done > 0 {
		return out, err
	}
	applies := func(l CountLine) bool {
		if _, ok := decided[l.Line]; ok {
			return false
		}
		lv, ok := locked[l.SKU]
		return ok && lv.OnHand != inventory.Unlimited && (lv.CountedAt == nil || lv.CountedAt.Before(at)) && !b.Rebase[l.SKU].Set
	}
	// The movements committed since ReadRebase, read for the SKUs whose
	// on_hand moved since: the locked row's last change of on_hand is past
	// what the read saw (reservations and releases since change nothing
	// the rebase sums).
	changed := map[string]span{}
	for _, l := range b.Lines {
		if lv := locked[l.SKU]; applies(l) && lv.OnHandPosition > b.Rebase[l.SKU].Seen {
			changed[l.SKU] = span{b.Rebase[l.SKU].Seen, lv.OnHandPosition}
		}
	}
	since, err := a.movementsSince(changed, at)
	if err != nil {
		return out, err
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	rec := &CountBatchRecord{CountID: b.CountID, FirstLine: b.FirstLine, LineCount: int64(len(b.Lines)), CreatedAt: now}
	lines := make([]CountedLine, len(b.Lines))
	var moves []Movement
	var shortages []CountedLine
	var rows []levelRow // the SKUs whose available moved, as the batch leaves them
	var levels []any    // their sku.level_changed events (eventColumns)
	update := countUpdate{now: now}
	for i, l := range b.Lines {
		if row, ok := decided[l.Line]; ok {
			lines[i] = row
			continue
		}
		row := CountedLine{Line: l.Line, SKU: l.SKU, Counted: l.Counted}
		rb := b.Rebase[l.SKU]
		row.Unshipped = rb.Unshipped
		if l.Unshipped != nil {
			row.Unshipped, row.UnshippedGiven = *l.Unshipped, true
		}
		lv, ok := locked[l.SKU]
		switch {
		case !ok:
			row.Outcome = CountUnknown
		case lv.OnHand == inventory.Unlimited:
			row.Outcome = CountUnlimited
		case !applies(l), since[l.SKU].Set:
			row.Outcome = CountSuperseded
		default:
			then := lv.OnHand - rb.After - since[l.SKU].After
			row.OnHandThen = &then
			row.Correction = l.Counted - row.Unshipped - then
			target := lv.OnHand + row.Correction
			row.Applied, row.Outcome = row.Correction, CountCorrected
			if target < lv.Reserved {
				row.Applied, row.Short, row.Outcome = lv.Reserved-lv.OnHand, lv.Reserved-target, CountShort
			} else if row.Correction == 0 {
				row.Outcome = CountUnchanged
			}
			after := lv.OnHand + row.Applied
			row.OnHand = &after
			// A line that moved on_hand announces the SKU's levels
			// itself (sku.level_changed, under the row lock it holds)
			// unless one went out within levelEvery: then the events job
			// does, as for a sale.
			announced := row.Applied != 0 && levelDue(lv.LevelAt, now)
			if row.Applied != 0 || row.Short > 0 {
				update.add(l.SKU, row.Applied, row.Short > 0, announced)
			}
			if row.Applied != 0 {
				moves = append(moves, Movement{SKU: l.SKU, Kind: MoveCount, OnHandDelta: row.Applied,
					Reason: countReason(row, at), Reference: CountReference(b.CountID, l.Line), CreatedAt: now})
				r := lv.levelRow
				r.Seq, r.OnHand, r.MovementPosition = r.Seq+1, after, r.MovementPosition+1
				if row.Short > 0 {
					r.EventSeq++ // the sku.shortage's
				}
				if announced {
					r.EventSeq++
					levels = append(levels, EventLevelChanged, r.SKU, r.EventSeq, nil, now, r.OnHand, r.Reserved, r.available())
				}
				rows = append(rows, r)
			}
			if row.Short > 0 {
				shortages = append(shortages, row)
			}
		}
		lines[i] = row
	}
	if err := a.updateCounted(update, at); err != nil {
		return out, err
	}
	last := positions{} // the UPDATE numbered each moved SKU's one COUNT movement
	for _, r := range rows {
		last[r.SKU] = r.MovementPosition
	}
	if err := a.moved(moves, last); err != nil {
		return out, err
	}
	if err := a.recordShortages(b.CountID, at, shortages, locked, now); err != nil {
		return out, err
	}
	if err := a.insertRows("stock_events", eventColumns, levels); err != nil { // after the shortages: their seqs come first
		return out, err
	}
	// The row's levels are known: the threshold events without reading
	// them again (fencesAfter's read).
	if err := a.announce(rows); err != nil {
		return out, err
	}
	outcome := outcomeOf(lines)
	rec.CountTotals = outcome.CountTotals
	if rec.Outcomes, err = json.Marshal(outcome.Lines); err != nil {
		return out, err
	}
	if err := a.insertBatchRecord(rec); err != nil {
		return out, err
	}
	moved, fences := map[string]int64{}, map[string]Fence{}
	for _, r := range rows {
		fences[r.SKU] = Fence{Seq: r.Seq, Epoch: r.RedisEpoch}
	}
	for _, m := range moves {
		moved[m.SKU] = m.OnHandDelta
	}
	out.Outcome, out.Changes = outcome, Changes(moved, fences, 1)
	return out, nil
}

// lockCountLevels locks skus' rows (in SKU order) and reads what a count
// needs of them; a SKU absent from the answer does not exist.
func (a Arbiter) lockCountLevels(skus []string) (map[string]countLevel, error) {
	if len(skus) == 0 {
		return map[string]countLevel{}, nil
	}
	q := `SELECT sku, on_hand, reserved, seq, redis_epoch, low_stock_threshold, event_flags, event_seq, movement_position, counted_at,
		on_hand_position, level_at FROM skus WHERE sku IN ? ORDER BY sku`
	if a.dialect != "sqlite" {
		q += ` FOR UPDATE`
	}
	out := make(map[string]countLevel, len(skus))
	err := a.query(func(rs *sql.Rows) error {
		var lv countLevel
		var counted, levelAt sql.NullTime
		if err := rs.Scan(&lv.SKU, &lv.OnHand, &lv.Reserved, &lv.Seq, &lv.RedisEpoch, &lv.LowStockThreshold,
			&lv.EventFlags, &lv.EventSeq, &lv.MovementPosition, &counted, &lv.OnHandPosition, &levelAt); err != nil {
			return err
		}
		if counted.Valid {
			t := counted.Time.UTC()
			lv.CountedAt = &t
		}
		if levelAt.Valid {
			t := levelAt.Time.UTC()
			lv.LevelAt = &t
		}
		out[lv.SKU] = lv
		return nil
	}, inList(q, len(skus)), anys(skus)...)
	return out, err
}

// movementsSince sums, per SKU of spans, the on_hand deltas of the
// movements since at (COUNT ones aside) that ReadRebase did not see, those
// past its Seen up to the locked row's last change of on_hand, and says
// whether one of them is a put's (SET). One statement, a short range of
// (sku, position) per SKU; run under the SKUs' row locks (then nothing of
// theirs is uncommitted).
func (a Arbiter) movementsSince(spans map[string]span, at time.Time) (map[string]Rebase, error) {
	out := make(map[string]Rebase, len(spans))
	if len(spans) == 0 {
		return out, nil
	}
	q, args := movementSums(a.dialect, spans, at)
	err := a.query(func(rs *sql.Rows) error {
		var sku string
		var sum, set int64
		if err := rs.Scan(&sku, &sum, &set); err != nil {
			return err
		}
		out[sku] = Rebase{After: sum, Set: set == 1}
		return nil
	}, q, args...)
	return out, err
}

// span is a range of a SKU's movement positions: past after, up to and
// including last.
type span struct{ after, last int64 }

// movementSums is the statement that sums, for each SKU of spans, its
// movements in its span created at or after at: per SKU, the on_hand
// deltas (COUNT movements aside) and whether one is a put's (SET, 1 or
// 0). Each SKU's movements are one range of (sku, position). MySQL is
// given the ranges as one OR (its range optimizer reads each); SQLite,
// whose expression tree would be as deep as the SKUs are many (a batch's
// thousand is past its limit of 1,000), joins the list of SKUs to the key,
// a range per SKU in turn.
func movementSums(dialect string, spans map[string]span, at time.Time) (string, []any) {
	skus := slices.Sorted(maps.Keys(spans))
	sums := `COALESCE(SUM(CASE WHEN m.kind <> ? THEN m.on_hand_delta ELSE 0 END), 0), MAX(CASE WHEN m.kind = ? THEN 1 ELSE 0 END)`
	var b strings.Builder
	args := make([]any, 0, 3+3*len(skus))
	if dialect == "sqlite" {
		b.WriteString(`WITH f (sku, lo, hi) AS (VALUES `)
		for i, sku := range skus {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("(?, ?, ?)")
			args = append(args, sku, spans[sku].after, spans[sku].last)
		}
		b.WriteString(`) SELECT m.sku, ` + sums + ` FROM f CROSS JOIN stock_movements AS m` + movementsBySKU(dialect) +
			` WHERE m.sku = f.sku AND m.position > f.lo AND m.position <= f.hi AND m.created_at >= ? GROUP BY m.sku`)
		return b.String(), append(args, MoveCount, MoveSet, at)
	}
	args = append(args, MoveCount, MoveSet, at)
	b.WriteString(`SELECT m.sku, ` + sums + ` FROM stock_movements AS m` + movementsBySKU(dialect) + ` WHERE m.created_at >= ? AND (`)
	for i, sku := range skus {
		if i > 0 {
			b.WriteString(" OR ")
		}
		b.WriteString("(m.sku = ? AND m.position > ? AND m.position <= ?)")
		args = append(args, sku, spans[sku].after, spans[sku].last)
	}
	b.WriteString(") GROUP BY m.sku")
	return b.String(), args
}

// movementStops is the statement that finds, for each SKU of from, the
// last of its movements at or below position from[sku] stamped before
// stop: a row (sku, position) per SKU, the position NULL or the row absent
// when there is none. Each SKU's is one read of (sku, position) back from
// from[sku], stopping at the first it finds. MySQL is given a SELECT per
// SKU, every bound a constant (a subquery correlated with a list of SKUs
// reads the key by sku alone, from the SKU's newest movement down);
// SQLite, whose compound SELECT takes 500 at most, a subquery correlated
// with the list of SKUs, which it reads as a range of the key.
func movementStops(dialect string, from map[string]int64, stop time.Time) (string, []any) {
	skus := slices.Sorted(maps.Keys(from))
	var b strings.Builder
	args := make([]any, 0, 1+3*len(skus))
	if dialect == "sqlite" {
		b.WriteString(`WITH f (sku, hi) AS (VALUES `)
		for i, sku := range skus {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("(?, ?)")
			args = append(args, sku, from[sku])
		}
		b.WriteString(`) SELECT f.sku, (SELECT m.position FROM stock_movements AS m` + movementsBySKU(dialect) +
			` WHERE m.sku = f.sku AND m.position <= f.hi AND m.created_at < ? ORDER BY m.position DESC LIMIT 1) FROM f`)
		return b.String(), append(args, stop)
	}
	one := `SELECT m.sku, m.position FROM stock_movements AS m` + movementsBySKU(dialect) +
		` WHERE m.sku = ? AND m.position <= ? AND m.created_at < ? ORDER BY m.position DESC LIMIT 1`
	if len(skus) == 1 {
		return one, []any{skus[0], from[skus[0]], stop}
	}
	for i, sku := range skus {
		if i > 0 {
			b.WriteString(" UNION ALL ")
		}
		b.WriteString("(" + one + ")")
		args = append(args, sku, from[sku], stop)
	}
	return b.String(), args
}

// movementsBySKU has a read of some SKUs' recent movements use the (sku,
// position) key, a short range per SKU: the optimizer could otherwise
// walk the primary key, every SKU's movements, or another key.
func movementsBySKU(dialect string) string {
	if dialect == "sqlite" {
		return ` INDEXED BY stock_movements_sku_position`
	}
	return ` FORCE INDEX (stock_movements_sku_position)`
}

// countUpdate is what one UPDATE writes of each SKU a count's lines
// applied to (skuCount), at now.
type countUpdate struct {
	now  time.Time
	skus []skuCount
}

// skuCount is one SKU's part of a countUpdate: the on_hand delta, whether
// a shortage is announced, and whether the count announces its levels
// (sku.level_changed at now).
type skuCount struct {
	SKU       string `json:"s"`
	Delta     int64  `json:"d"`
	Short     bool   `json:"-"`
	Announced bool   `json:"-"`
}

func (u *countUpdate) add(sku string, delta int64, short, announced bool) {
	u.skus = append(u.skus, skuCount{SKU: sku, Delta: delta, Short: short, Announced: announced})
}

// updateCounted writes the SKUs a batch's lines moved (or found short) in
// one UPDATE: on_hand moves by each line's applied units (the CHECK keeps
// it at or above reserved, as the computation did), counted_at becomes at
// (so an earlier count is superseded), and a SKU whose available moved
// takes a seq (Redis's fence), counts its COUNT movement in
// movement_position (ApplyCount numbers it) and either takes the event seq
// of the sku.level_changed ApplyCount writes (level_at now, no longer
// marked) or is marked for the events job's; a shortage takes an event seq
// too. Every row is changed (counted_at moves forward), so the
// number of rows changed says whether each SKU was as locked. On MySQL
// the SKUs' values are a derived table joined on the primary key (a
// CASE per column costs a comparison per SKU per row: two thirds of a
// 1,000-line batch's time); the embedded SQLite keeps the CASEs.
func (a Arbiter) updateCounted(u countUpdate, at time.Time) error {
	if len(u.skus) == 0 {
		return nil
	}
	var q string
	var args []any
	if a.dialect == "sqlite" {
		q, args = u.caseUpdate(at)
	} else {
		q, args = u.joinUpdate(at)
	}
	n, err := a.exec(q, args...)
	if err != nil {
		return err
	}
	if n != int64(len(u.skus)) {
		return fmt.Errorf("count: %d of %d SKUs were as their locked rows said", n, len(u.skus))
	}
	return nil
}

// joinUpdate is updateCounted's UPDATE on MySQL: the values a JSON
// argument read as a table (JSON_TABLE), its SKU column binary as
// skus.sku (names are exact), driving the join by the primary key (so only
// the batch's rows are locked, however small the table). A derived table
// of SELECT ... UNION ALL SELECT ... cost MariaDB 130 us a SKU to parse
// and materialise.
func (u countUpdate) joinUpdate(at time.Time) (string, []any) {
	type value struct {
		skuCount
		Moved int `json:"m"`
		Short int `json:"x"`
		Level int `json:"l"`
	}
	values := make([]value, len(u.skus))
	for i, c := range u.skus {
		values[i] = value{c, b2i(c.Delta != 0), b2i(c.Short), b2i(c.Announced)}
	}
	b, _ := json.Marshal(values) // strings and integers always marshal
	return `UPDATE JSON_TABLE(?, '$[*]' COLUMNS (sku VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.s',
		d BIGINT PATH '$.d', moved INT PATH '$.m', short INT PATH '$.x', announced INT PATH '$.l')) c
		STRAIGHT_JOIN skus s FORCE INDEX (PRIMARY) ON s.sku = c.sku
		SET s.on_hand = s.on_hand + c.d, s.counted_at = ?, s.seq = s.seq + c.moved,
		s.movement_position = s.movement_position + c.moved,
		s.level_dirty = CASE WHEN c.announced = 1 THEN 0 WHEN c.moved = 1 THEN 1 ELSE s.level_dirty END,
		s.level_at = CASE WHEN c.announced = 1 THEN ? ELSE s.level_at END,
		s.event_seq = s.event_seq + c.short + c.announced
		WHERE s.on_hand <> -1 AND (s.counted_at IS NULL OR s.counted_at < ?)`, []any{string(b), at, u.now, at}
}

// caseUpdate is updateCounted's UPDATE on SQLite: a CASE per column.
func (u countUpdate) caseUpdate(at time.Time) (string, []any) {
	var onHand, seq, dirty, short strings.Builder
	var ohArgs, seqArgs, shortArgs, announced, skus []any
	for _, c := range u.skus {
		onHand.WriteString(" WHEN ? THEN ?")
		ohArgs = append(ohArgs, c.SKU, c.Delta)
		if c.Delta != 0 {
			seq.WriteString(" WHEN ? THEN 1")
			dirty.WriteString(" WHEN ? THEN " + strconv.Itoa(1-b2i(c.Announced)))
			seqArgs = append(seqArgs, c.SKU)
		}
		if n := b2i(c.Short) + b2i(c.Announced); n > 0 {
			short.WriteString(" WHEN ? THEN " + strconv.Itoa(n))
			shortArgs = append(shortArgs, c.SKU)
		}
		if c.Announced {
			announced = append(announced, c.SKU)
		}
		skus = append(skus, c.SKU)
	}
	q := `UPDATE skus SET on_hand = on_hand + CASE sku` + onHand.String() + ` ELSE 0 END, counted_at = ?`
	args := append(ohArgs, at)
	if len(seqArgs) > 0 {
		q += `, seq = seq + CASE sku` + seq.String() + ` ELSE 0 END, movement_position = movement_position + CASE sku` + seq.String() +
			` ELSE 0 END, level_dirty = CASE sku` + dirty.String() + ` ELSE level_dirty END`
		args = append(append(append(args, seqArgs...), seqArgs...), seqArgs...)
	}
	if len(announced) > 0 {
		q += `, level_at = CASE WHEN sku IN (` + strings.TrimSuffix(strings.Repeat("?,", len(announced)), ",") + `) THEN ? ELSE level_at END`
		args = append(append(args, announced...), u.now)
	}
	if len(shortArgs) > 0 {
		q += `, event_seq = event_seq + CASE sku` + short.String() + ` ELSE 0 END`
		args = append(args, shortArgs...)
	}
	q = inList(q+` WHERE sku IN ? AND on_hand <> -1 AND (counted_at IS NULL OR counted_at < ?)`, len(u.skus))
	return q, append(append(args, skus...), at)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// insertBatchRecord writes the batch's record. One a concurrent run wrote
// first (possible only for a batch with no existing SKU: no row lock
// orders the two) makes the transaction run again, and find it.
func (a Arbiter) insertBatchRecord(r *CountBatchRecord) error {
	t := r.CountTotals
	err := a.insertRows("stock_count_batches", countBatchColumns, []any{r.CountID, r.FirstLine, r.LineCount,
		t.Corrected, t.Unchanged, t.Short, t.Unknown, t.Unlimited, t.Superseded, t.UnitsAdded, t.UnitsRemoved, t.UnitsShort,
		r.Outcomes, r.CreatedAt})
	if IsDuplicate(err) {
		return InsertRaced(err)
	}
	return err
}

// recordShortages records each short line once: an anomaly (reconcile
// reports it until an operator resolves it) and a sku.shortage event
// naming the units, with the SKU's levels after the line and the event seq
// updateCounted took for it.
func (a Arbiter) recordShortages(countID string, countedAt time.Time, short []CountedLine, levels map[string]countLevel, at time.Time) error {
	if len(short) == 0 {
		return nil
	}
	anomalies := make([]any, 0, 6*len(short))
	events := make([]any, 0, 10*len(short))
	for _, l := range short {
		lv := levels[l.SKU]
		anomalies = append(anomalies, CountReference(countID, l.Line), l.SKU, OpCount, l.Short, *l.OnHand,
			clip(fmt.Sprintf("count %s line %d: %d counted at %s, %d unshipped: %d fewer units than are held; on_hand set to reserved (%d)",
				countID, l.Line, l.Counted, countedAt.Format(time.RFC3339Nano), l.Unshipped, l.Short, lv.Reserved)))
		events = append(events, EventShortage, l.SKU, lv.EventSeq+1, nil, at, *l.OnHand, lv.Reserved, *l.OnHand-lv.Reserved, l.Short, countID)
	}
	if err := a.insertRows("stock_anomalies", []string{"token", "sku", "op", "qty", "on_hand", "reason"}, anomalies); err != nil {
		return err
	}
	return a.insertRows("stock_events", append(slices.Clip(eventColumns), "short", "count_id"), events)
}

// countReason is a COUNT movement's reason: what the line said and what
// on_hand was then.
func countReason(l CountedLine, at time.Time) string {
	return clip(fmt.Sprintf("count: %d counted at %s, %d unshipped, on_hand %d then",
		l.Counted, at.Format(time.RFC3339Nano), l.Unshipped, *l.OnHandThen))
}

// clip keeps the first 255 bytes of s (a reason column's width).
func clip(s string) string { return s[:min(len(s), 255)] }

// CountHorizon is how far back a count's counted_at may be, with
// retention folding movements older than retention: an hour less (a
// twenty-fourth of it when that is less), so that a count being applied
// never needs a movement a retention run folds meanwhile.
func CountHorizon(retention time.Duration) time.Duration {
	return retention - min(time.Hour, retention/24)
}
