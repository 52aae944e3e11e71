package arbiter

import (
	"database/sql"
	"fmt"
	"slices"
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
// thousands of units since T: ReadRebase sums, without any lock, the
// movements since T it sees and notes the highest id it saw per SKU; then
// ApplyCount, holding the lock, adds only the movements with a higher id.
// No movement is missed between them: a SKU's movements are inserted under
// its row lock, so when ReadRebase ran, only the lock's holder could have
// had uncommitted ones, inserted after (ids above) every committed one.
//
// A COUNT movement is a correction as of its own count's counted_at, not
// of when it was written, and a SKU takes only counts later than the
// latest it took (skus.counted_at; an earlier or equal one is superseded):
// so every COUNT movement written after T belongs to an earlier count and
// is part of on_hand(T), and the sum leaves them out. An admin's put (a
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

// A count line's outcomes (stock_count_lines.outcome).
const (
	CountCorrected  = "corrected"  // on_hand moved by the correction
	CountUnchanged  = "unchanged"  // the correction was 0
	CountShort      = "short"      // on_hand went down to reserved; the rest is a shortage
	CountUnknown    = "unknown"    // no such SKU: nothing applied
	CountUnlimited  = "unlimited"  // the SKU has unlimited stock: nothing applied
	CountSuperseded = "superseded" // a count at or after this counted_at, or a put, set the SKU later: nothing applied
)

// CountedLine is a count's line as applied (stock_count_lines): what the
// answer to its request, and to every replay of it, says.
type CountedLine struct {
	CountID        string `gorm:"primaryKey;column:count_id"`
	Line           int64  `gorm:"primaryKey;column:line"`
	SKU            string `gorm:"column:sku"`
	Counted        int64  `gorm:"column:counted"`
	Unshipped      int64  `gorm:"column:unshipped"`
	UnshippedGiven bool   `gorm:"column:unshipped_given"`
	Outcome        string `gorm:"column:outcome"`
	// OnHandThen is on_hand as of counted_at; nil when nothing was applied.
	OnHandThen *int64 `gorm:"column:on_hand_then"`
	Correction int64  `gorm:"column:correction"`
	Applied    int64  `gorm:"column:applied"`
	Short      int64  `gorm:"column:short"`
	// OnHand is on_hand after the line; nil when nothing was applied.
	OnHand    *int64    `gorm:"column:on_hand"`
	CreatedAt time.Time `gorm:"column:created_at"`
}

func (CountedLine) TableName() string { return "stock_count_lines" }

var countLineColumns = []string{"count_id", "line", "sku", "counted", "unshipped", "unshipped_given", "outcome",
	"on_hand_then", "correction", "applied", "short", "on_hand", "created_at"}

// OpCount is the op of a count's shortage in stock_anomalies.
const OpCount Op = "COUNT"

// CountReference names line of count id as a movement's reference and a
// shortage anomaly's token.
func CountReference(id string, line int64) string { return fmt.Sprintf("count:%s:%d", id, line) }

// clockSlack is how far apart two nodes' clocks may be for MovementsFrom's
// bound to hold (never for the rebase's exactness, which wants them
// together).
const clockSlack = time.Minute

// MovementsFrom is an id below which no movement was written at or after
// t (less a minute for the nodes' clocks): the first id whose created_at
// is at or after it, found by bisecting the ids (movements are numbered in
// the order they are written, each stamped as it is written), a few dozen
// primary-key reads whatever the table's size. ReadRebase reads from it,
// so a count reads the movements since its counted_at and not the SKU's
// whole history.
func MovementsFrom(db *gorm.DB, t time.Time) (int64, error) {
	t = t.Add(-clockSlack).UTC()
	var bounds struct{ Lo, Hi sql.NullInt64 }
	if err := db.Raw(`SELECT MIN(id) AS lo, MAX(id) AS hi FROM stock_movements`).Scan(&bounds).Error; err != nil {
		return 0, err
	}
	if !bounds.Lo.Valid {
		return 0, nil
	}
	lo, hi := bounds.Lo.Int64, bounds.Hi.Int64+1 // the answer is in [lo, hi]
	for lo < hi {
		mid := lo + (hi-lo)/2
		var at []time.Time
		if err := db.Raw(`SELECT created_at FROM stock_movements WHERE id >= ? ORDER BY id LIMIT 1`, mid).
			Scan(&at).Error; err != nil {
			return 0, err
		}
		if len(at) == 0 || !at[0].Before(t) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo, nil
}

// Rebase is what ReadRebase read of a SKU outside its row lock.
type Rebase struct {
	// After sums the on_hand deltas of the SKU's movements created at or
	// after counted_at (COUNT ones aside) up to id Seen.
	After int64
	// Seen is the highest movement id of the SKU the read saw (from - 1
	// when none from on): ApplyCount adds what came after it.
	Seen int64
	// Unshipped is unshipped(counted_at) from the shipped signal.
	Unshipped int64
	// Set says an admin's put set the SKU's on_hand at or after
	// counted_at: a statement of the level later than the count's, which
	// supersedes it as a later count does.
	Set bool
}

// ReadRebase reads, for each of skus, without locking anything, the
// movements since at (from MovementsFrom on) and unshipped(at): two
// statements, each a consistent read. A SKU with no movement nor shipping
// row has its zero Rebase with Seen = from - 1.
func ReadRebase(db *gorm.DB, skus []string, at time.Time, from int64) (map[string]Rebase, error) {
	at = at.UTC()
	out := make(map[string]Rebase, len(skus))
	for _, sku := range skus {
		out[sku] = Rebase{Seen: from - 1}
	}
	if len(skus) == 0 {
		return out, nil
	}
	args := append([]any{at, MoveCount, at, MoveSet}, anys(skus, from)...)
	rows, err := db.Raw(inList(`SELECT sku, COALESCE(SUM(CASE WHEN created_at >= ? AND kind <> ? THEN on_hand_delta ELSE 0 END), 0), MAX(id),
		MAX(CASE WHEN created_at >= ? AND kind = ? THEN 1 ELSE 0 END)
		FROM stock_movements WHERE sku IN ? AND id >= ? GROUP BY sku`, len(skus)), args...).Rows()
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var sku string
		var after, seen, set int64
		if err := rows.Scan(&sku, &after, &seen, &set); err != nil {
			_ = rows.Close()
			return nil, err
		}
		r := out[sku]
		r.After, r.Seen, r.Set = after, max(seen, from-1), set == 1
		out[sku] = r
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	args = append([]any{at, at}, anys(skus, at)...)
	rows, err = db.Raw(inList(`SELECT sku, COALESCE(SUM(qty * ((CASE WHEN sold_at < ? THEN 1 ELSE 0 END) - (CASE WHEN shipped_at < ? THEN 1 ELSE 0 END))), 0)
		FROM stock_shipping WHERE sku IN ? AND (restored_at IS NULL OR restored_at >= ?) GROUP BY sku`, len(skus)), args...).Rows()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var sku string
		var unshipped int64
		if err := rows.Scan(&sku, &unshipped); err != nil {
			return nil, err
		}
		r := out[sku]
		r.Unshipped = unshipped
		out[sku] = r
	}
	return out, rows.Err()
}

// CountBatch is some lines of one count (distinct SKUs, in line order)
// with what ReadRebase read of their SKUs.
type CountBatch struct {
	CountID   string
	CountedAt time.Time
	Lines     []CountLine
	Rebase    map[string]Rebase
}

// CountApplied is what ApplyCount did: the lines it wrote (those a
// concurrent or earlier run had written already are not among them), and
// the changes of available for Redis.
type CountApplied struct {
	Lines   []CountedLine
	Changes []inventory.Change
}

// countLevel is a SKU's row as ApplyCount locks it.
type countLevel struct {
	OnHand, Reserved, EventSeq int64
	CountedAt                  *time.Time
}

// ApplyCount applies the lines of b not applied yet, under their SKUs' row
// locks (taken together, in SKU order, as every writer takes them): each
// rebased to b.CountedAt, one UPDATE of every SKU that moves, a COUNT
// movement per line that moved on_hand, a stock_count_lines row per line
// (whatever its outcome: the line is then applied, and a replay finds it),
// and per shortage an anomaly and a sku.shortage event, then the threshold
// events the new levels cross. Run it in a transaction; a line written by a
// concurrent run of the same request is skipped (its SKU's lock orders the
// two; lines of unknown SKUs only collide on their key: errInsertRaced,
// which Transact runs again).
func (a Arbiter) ApplyCount(b CountBatch) (CountApplied, error) {
	var out CountApplied
	if len(b.Lines) == 0 {
		return out, nil
	}
	at := b.CountedAt.UTC()
	skus := make([]string, 0, len(b.Lines))
	first, last := b.Lines[0].Line, b.Lines[0].Line
	for _, l := range b.Lines {
		skus = append(skus, l.SKU)
		first, last = min(first, l.Line), max(last, l.Line)
	}
	slices.Sort(skus)
	levels, err := a.lockCountLevels(skus)
	if err != nil {
		return out, err
	}
	done := map[int64]bool{}
	if err := a.query(func(rs *sql.Rows) error {
		var line int64
		if err := rs.Scan(&line); err != nil {
			return err
		}
		done[line] = true
		return nil
	}, `SELECT line FROM stock_count_lines WHERE count_id = ? AND line BETWEEN ? AND ?`, b.CountID, first, last); err != nil {
		return out, err
	}
	var todo []CountLine
	var rebased []string // SKUs whose line applies: their movements since ReadRebase are read
	for _, l := range b.Lines {
		if done[l.Line] {
			continue
		}
		todo = append(todo, l)
		if lv, ok := levels[l.SKU]; ok && lv.OnHand != inventory.Unlimited && (lv.CountedAt == nil || lv.CountedAt.Before(at)) {
			rebased = append(rebased, l.SKU)
		}
	}
	if len(todo) == 0 {
		return out, nil
	}
	since, err := a.movementsSince(rebased, b.Rebase, at)
	if err != nil {
		return out, err
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	var moves []Movement
	var shortages []CountedLine
	update := countUpdate{}
	for _, l := range todo {
		row := CountedLine{CountID: b.CountID, Line: l.Line, SKU: l.SKU, Counted: l.Counted, CreatedAt: now}
		rb := b.Rebase[l.SKU]
		row.Unshipped = rb.Unshipped
		if l.Unshipped != nil {
			row.Unshipped, row.UnshippedGiven = *l.Unshipped, true
		}
		lv, ok := levels[l.SKU]
		switch {
		case !ok:
			row.Outcome = CountUnknown
		case lv.OnHand == inventory.Unlimited:
			row.Outcome = CountUnlimited
		case lv.CountedAt != nil && !lv.CountedAt.Before(at), rb.Set, since[l.SKU].Set:
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
			update.add(l.SKU, row.Applied, row.Short > 0)
			if row.Applied != 0 {
				moves = append(moves, Movement{SKU: l.SKU, Kind: MoveCount, OnHandDelta: row.Applied,
					Reason: countReason(row, at), Reference: CountReference(b.CountID, l.Line), CreatedAt: now})
			}
			if row.Short > 0 {
				shortages = append(shortages, row)
			}
		}
		out.Lines = append(out.Lines, row)
	}
	if err := a.updateCounted(update, at); err != nil {
		return out, err
	}
	if err := a.moved(moves); err != nil {
		return out, err
	}
	if err := a.insertCountLines(out.Lines); err != nil {
		return out, err
	}
	if err := a.recordShortages(b.CountID, at, shortages, levels, now); err != nil {
		return out, err
	}
	moved := map[string]int64{}
	for _, m := range moves {
		moved[m.SKU] = m.OnHandDelta
	}
	fences, err := a.fencesAfter(sortedKeys(moved))
	if err != nil {
		return out, err
	}
	out.Changes = Changes(moved, fences, 1)
	return out, nil
}

// lockCountLevels locks skus' rows (in SKU order) and reads what a count
// needs of them; a SKU absent from the answer does not exist.
func (a Arbiter) lockCountLevels(skus []string) (map[string]countLevel, error) {
	q := `SELECT sku, on_hand, reserved, event_seq, counted_at FROM skus WHERE sku IN ? ORDER BY sku`
	if a.dialect != "sqlite" {
		q += ` FOR UPDATE`
	}
	out := make(map[string]countLevel, len(skus))
	err := a.query(func(rs *sql.Rows) error {
		var sku string
		var lv countLevel
		var counted sql.NullTime
		if err := rs.Scan(&sku, &lv.OnHand, &lv.Reserved, &lv.EventSeq, &counted); err != nil {
			return err
		}
		if counted.Valid {
			t := counted.Time.UTC()
			lv.CountedAt = &t
		}
		out[sku] = lv
		return nil
	}, inList(q, len(skus)), anys(skus)...)
	return out, err
}

// movementsSince sums, per SKU, the on_hand deltas of the movements since
// at (COUNT ones aside) that ReadRebase did not see, those above its Seen,
// and says whether one of them is a put's (SET).
// One statement, a short range of the (sku, id) index per SKU. Run under
// the SKUs' row locks.
func (a Arbiter) movementsSince(skus []string, rb map[string]Rebase, at time.Time) (map[string]Rebase, error) {
	out := make(map[string]Rebase, len(skus))
	if len(skus) == 0 {
		return out, nil
	}
	var b strings.Builder
	args := make([]any, 0, 3+2*len(skus))
	args = append(args, MoveCount, MoveSet, at)
	b.WriteString(`SELECT sku, COALESCE(SUM(CASE WHEN kind <> ? THEN on_hand_delta ELSE 0 END), 0), MAX(CASE WHEN kind = ? THEN 1 ELSE 0 END)
		FROM stock_movements WHERE created_at >= ? AND (`)
	for i, sku := range skus {
		if i > 0 {
			b.WriteString(" OR ")
		}
		b.WriteString("(sku = ? AND id > ?)")
		args = append(args, sku, rb[sku].Seen)
	}
	b.WriteString(") GROUP BY sku")
	err := a.query(func(rs *sql.Rows) error {
		var sku string
		var sum, set int64
		if err := rs.Scan(&sku, &sum, &set); err != nil {
			return err
		}
		out[sku] = Rebase{After: sum, Set: set == 1}
		return nil
	}, b.String(), args...)
	return out, err
}

// countUpdate is what one UPDATE writes of each SKU a count's lines
// applied to: the on_hand delta, and whether a shortage is announced.
type countUpdate struct {
	skus  []string
	delta map[string]int64
	short map[string]bool
}

func (u *countUpdate) add(sku string, delta int64, short bool) {
	if u.delta == nil {
		u.delta, u.short = map[string]int64{}, map[string]bool{}
	}
	u.skus = append(u.skus, sku)
	u.delta[sku], u.short[sku] = delta, short
}

// updateCounted writes the batch's SKUs in one UPDATE: on_hand moves by
// each line's applied units (the CHECK keeps it at or above reserved, as
// the computation did), counted_at becomes at (so an earlier count is
// superseded), and a SKU whose available moved takes a seq (Redis's
// fence) and is marked for sku.level_changed; a shortage takes the next
// event seq. Every row is changed (counted_at moves forward), so the
// number of rows changed says whether each SKU was as locked.
func (a Arbiter) updateCounted(u countUpdate, at time.Time) error {
	if len(u.skus) == 0 {
		return nil
	}
	var onHand, seq, short strings.Builder
	var ohArgs, seqArgs, shortArgs []any
	for _, sku := range u.skus {
		onHand.WriteString(" WHEN ? THEN ?")
		ohArgs = append(ohArgs, sku, u.delta[sku])
		if u.delta[sku] != 0 {
			seq.WriteString(" WHEN ? THEN 1")
			seqArgs = append(seqArgs, sku)
		}
		if u.short[sku] {
			short.WriteString(" WHEN ? THEN 1")
			shortArgs = append(shortArgs, sku)
		}
	}
	q := `UPDATE skus SET on_hand = on_hand + CASE sku` + onHand.String() + ` ELSE 0 END, counted_at = ?`
	args := append(ohArgs, at)
	if len(seqArgs) > 0 {
		q += `, seq = seq + CASE sku` + seq.String() + ` ELSE 0 END, level_dirty = CASE sku` + seq.String() + ` ELSE level_dirty END`
		args = append(append(args, seqArgs...), seqArgs...)
	}
	if len(shortArgs) > 0 {
		q += `, event_seq = event_seq + CASE sku` + short.String() + ` ELSE 0 END`
		args = append(args, shortArgs...)
	}
	q = inList(q+` WHERE sku IN ? AND on_hand <> -1 AND (counted_at IS NULL OR counted_at < ?)`, len(u.skus))
	args = append(append(args, anys(u.skus)...), at)
	n, err := a.exec(q, args...)
	if err != nil {
		return err
	}
	if n != int64(len(u.skus)) {
		return fmt.Errorf("count: %d of %d SKUs were as their locked rows said", n, len(u.skus))
	}
	return nil
}

// insertCountLines writes lines in one multi-row INSERT. A line a
// concurrent run wrote first (possible only for lines whose SKU does not
// exist: no row lock orders the two) makes the transaction run again.
func (a Arbiter) insertCountLines(lines []CountedLine) error {
	args := make([]any, 0, len(lines)*len(countLineColumns))
	for _, l := range lines {
		args = append(args, l.CountID, l.Line, l.SKU, l.Counted, l.Unshipped, l.UnshippedGiven, l.Outcome,
			l.OnHandThen, l.Correction, l.Applied, l.Short, l.OnHand, l.CreatedAt)
	}
	err := a.insertRows("stock_count_lines", countLineColumns, args)
	if IsDuplicate(err) {
		return fmt.Errorf("%w: %w", errInsertRaced, err)
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
