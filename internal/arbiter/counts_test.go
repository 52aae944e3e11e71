package arbiter_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/testkit/testenv"
)

// A count's rebase reads each SKU's movements as a short range of the
// (sku, position) key the history's pages use, never its whole history,
// and without a key on (sku, id), which would cost every sale's INSERT an
// index entry: back from the newest position until a movement stamped
// before counted_at less the margin (a movement at a higher position may
// be stamped earlier than one below it), then the sum past it. On MariaDB
// ANALYZE says how many rows each read took; on SQLite the plan says each
// is a search of the key.
func TestCountRebaseReadsShortRanges(t *testing.T) {
	s := newStmts(t)
	hot, cold := testenv.Unique("RBHOT"), testenv.Unique("RBCOLD")
	s.put(hot, 0, 0)
	s.put(cold, 0, 0)
	now := time.Now().UTC().Truncate(time.Microsecond)
	old, at := now.Add(-time.Hour), now.Add(-70*time.Second)
	require.NoError(t, s.DB.Exec(`UPDATE stock_movements SET created_at = ? WHERE sku IN ?`, old, []string{hot, cold}).Error)

	const history = 2000
	type move struct {
		delta int64
		at    time.Time
	}
	var hotMoves, coldMoves []move
	for range history {
		hotMoves = append(hotMoves, move{1, old})
	}
	hotMoves = append(hotMoves,
		move{1, at.Add(-90 * time.Second)},   // before counted_at, inside the margin: walked, not summed
		move{10, at.Add(5 * time.Second)},    // after counted_at
		move{100, at.Add(-10 * time.Second)}) // a higher position stamped before counted_at: not summed
	for range 20 {
		hotMoves = append(hotMoves, move{1, at.Add(10 * time.Second)})
	}
	for range 100 {
		coldMoves = append(coldMoves, move{1, old})
	}
	insert := func(sku string, ms []move) {
		var rows []string
		var args []any
		var sum int64
		for i, m := range ms {
			rows = append(rows, "(?, ?, 'RESTOCK', ?, 0, '', '', ?)")
			args = append(args, sku, int64(i)+2, m.delta, m.at)
			sum += m.delta
		}
		require.NoError(t, s.DB.Exec(`INSERT INTO stock_movements (sku, position, kind, on_hand_delta, reserved_delta, reason, reference, created_at)
			VALUES `+strings.Join(rows, ", "), args...).Error)
		// As the arbiter writes a change of on_hand: its last movement is
		// the SKU's last change of on_hand.
		require.NoError(t, s.DB.Exec(`UPDATE skus SET on_hand = on_hand + ?, on_hand_position = movement_position + ?, on_hand_moved_at = ?,
			movement_position = movement_position + ? WHERE sku = ?`, sum, len(ms), ms[len(ms)-1].at, len(ms), sku).Error)
	}
	insert(hot, hotMoves)
	insert(cold, coldMoves)

	var sent []string
	name := "capture:" + t.Name()
	require.NoError(t, s.DB.Callback().Row().After("gorm:row").Register(name, func(tx *gorm.DB) {
		sent = append(sent, tx.Dialector.Explain(tx.Statement.SQL.String(), tx.Statement.Vars...))
	}))
	rb, err := arbiter.ReadRebase(s.DB, []string{hot, cold, "NO-SUCH-SKU"}, at)
	require.NoError(t, s.DB.Callback().Row().Remove(name))
	require.NoError(t, err)
	require.Equal(t, int64(10+20), rb[hot].After)
	require.EqualValues(t, 1+len(hotMoves), rb[hot].Seen)
	require.Zero(t, rb[cold].After)
	require.EqualValues(t, 1+len(coldMoves), rb[cold].Seen)
	require.False(t, rb["NO-SUCH-SKU"].Exists)

	var movements int
	for _, q := range sent {
		if !strings.Contains(q, "stock_movements") {
			continue
		}
		movements++
		if s.DB.Dialector.Name() == "sqlite" {
			// Every read of m is a search of the (sku, position) key: the
			// subquery's by sku, in the key's order (no temporary B-tree
			// for its ORDER BY), the sum's by sku and a lower position.
			var plan []struct{ Detail string }
			require.NoError(t, s.DB.Raw("EXPLAIN QUERY PLAN "+q).Scan(&plan).Error)
			var reads int
			for _, p := range plan {
				t.Log(p.Detail)
				require.NotContains(t, p.Detail, "FOR ORDER BY", "%+v\n%s", plan, q)
				if strings.Contains(p.Detail, " m ") || strings.HasSuffix(p.Detail, " m") {
					reads++
					require.Contains(t, p.Detail, "SEARCH m USING INDEX stock_movements_sku_position (sku=?", "%+v\n%s", plan, q)
				}
			}
			require.Equal(t, 1, reads, "%+v\n%s", plan, q)
			continue
		}
		var plan []struct {
			SelectType              string `gorm:"column:select_type"`
			Table, Type, Key, Extra string
			RRows                   float64 `gorm:"column:r_rows"`
		}
		require.NoError(t, s.DB.Raw("ANALYZE "+q).Scan(&plan).Error)
		var reads int
		for _, p := range plan {
			t.Logf("%s %s %s %s r_rows=%v %s", p.SelectType, p.Table, p.Type, p.Key, p.RRows, p.Extra)
			if p.Table != "m" {
				continue
			}
			reads++
			require.Equal(t, "stock_movements_sku_position", p.Key, "%+v\n%s", p, q)
			if p.SelectType == "DEPENDENT SUBQUERY" { // ORDER BY position DESC LIMIT 1 read from the key, stopping at the first
				require.NotContains(t, p.Extra, "filesort", "%+v", p)
			}
			require.Less(t, p.RRows, float64(history)/10, "a short range, not the history: %+v\n%s", p, q)
		}
		require.Equal(t, 1, reads, "%+v\n%s", plan, q)
	}
	require.Equal(t, 2, movements, "%s", fmt.Sprint(sent))
}

// A hot SKU's movements during a seckill are nearly all reservations
// (RESERVE, on_hand_delta 0), tens of thousands of them since a count's
// counted_at, and none changes what the rebase sums. ReadRebase reads none
// of them: no movement at all when the SKU's last change of on_hand is
// older than counted_at less the margin (the SKU's row says when it was),
// else a walk back only from that change (a RESTOCK here, after
// counted_at, with thousands of reservations on either side); and
// ApplyCount, holding the row lock, reads nothing for the reservations
// committed since ReadRebase, and the movements since it up to the last
// change of on_hand when there is one. On MariaDB the session's
// Handler_read_* counters say how many index entries each read took.
func TestCountRebaseReadsNoReservation(t *testing.T) {
	s := newStmts(t)
	quiet, hot, put := testenv.Unique("RBQUIET"), testenv.Unique("RBHOT"), testenv.Unique("RBPUT")
	for _, sku := range []string{quiet, hot, put} {
		s.put(sku, 1_000_000, 0)
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	at := now.Add(-70 * time.Second)
	var tokens int
	reserve := func(sku string, n int) {
		t.Helper()
		for n > 0 {
			k := min(n, 1000)
			holds := make([]arbiter.Hold, k)
			for i := range holds {
				tokens++
				holds[i] = hold(fmt.Sprintf("t.rb%d", tokens), sku, 1)
			}
			_, err := s.reserve(holds...)
			require.NoError(t, err)
			n -= k
		}
	}
	// The SKUs were put, and reserved from, an hour ago: their movements,
	// and their rows' stamp of their last change of on_hand, as the arbiter
	// wrote them then (put's row keeps the stamp of now: its rebase reads
	// its one movement).
	const before, after = 3000, 3000
	reserve(quiet, before)
	reserve(hot, before)
	old := now.Add(-time.Hour)
	require.NoError(t, s.DB.Exec(`UPDATE stock_movements SET created_at = ? WHERE sku IN ?`, old, []string{quiet, hot, put}).Error)
	require.NoError(t, s.DB.Exec(`UPDATE skus SET on_hand_moved_at = ? WHERE sku IN ?`, old, []string{quiet, hot}).Error)
	// Since counted_at: reservations; and a restock of hot, rebased over.
	reserve(quiet, after)
	s.restock(hot, 7)
	reserve(hot, after)

	// quiet's last change of on_hand is older than counted_at less the
	// margin: no movement of it is read.
	var sent []string
	name := "capture:" + t.Name()
	require.NoError(t, s.DB.Callback().Row().After("gorm:row").Register(name, func(tx *gorm.DB) {
		sent = append(sent, tx.Statement.SQL.String())
	}))
	rb, err := arbiter.ReadRebase(s.DB, []string{quiet}, at)
	require.NoError(t, s.DB.Callback().Row().Remove(name))
	require.NoError(t, err)
	require.Zero(t, rb[quiet].After)
	require.EqualValues(t, 1+before+after, rb[quiet].Seen)
	require.NotEmpty(t, sent)
	for _, q := range sent {
		require.NotContains(t, q, "stock_movements")
	}

	// hot's is the restock: its walk starts there, not at its newest.
	reads := handlerReads(t, s.DB)
	n := reads(func(db *gorm.DB) {
		var err error
		rb, err = arbiter.ReadRebase(db, []string{quiet, hot, put}, at)
		require.NoError(t, err)
	})
	require.Zero(t, rb[quiet].After)
	require.Equal(t, int64(7), rb[hot].After)
	require.EqualValues(t, 1+before+1+after, rb[hot].Seen)
	require.False(t, rb[hot].Set)
	require.Zero(t, rb[put].After)
	require.False(t, rb[put].Set)
	if n >= 0 {
		t.Logf("ReadRebase read %d index entries", n)
		require.Less(t, n, int64(40), "ReadRebase read %d index entries: the reservations are not read", n)
	}

	apply := func(id string, counted int64) (arbiter.CountedLine, int64) {
		t.Helper()
		var out arbiter.CountApplied
		n := reads(func(db *gorm.DB) {
			require.NoError(t, arbiter.Transact(context.Background(), db, func(tx *gorm.DB) error {
				var err error
				out, err = arbiter.In(tx).ApplyCount(arbiter.CountBatch{CountID: id, CountedAt: at, FirstLine: 1,
					Lines: []arbiter.CountLine{{Line: 1, SKU: hot, Counted: counted}}, Rebase: rb})
				return err
			}))
		})
		if n >= 0 {
			t.Logf("ApplyCount read %d index entries", n)
		}
		return out.Outcome.Lines[0], n
	}
	// Reservations committed since ReadRebase: under the lock, nothing of
	// theirs is read. (The count announces the SKU's levels: the first
	// statement on stock_events opens the table, which reads its
	// statistics, 18 entries; open it before counting.)
	var events int64
	require.NoError(t, s.DB.Raw(`SELECT COUNT(*) FROM stock_events`).Scan(&events).Error)
	reserve(hot, 2000)
	l, n := apply("rb-1", 1_000_000+100)
	if n >= 0 {
		require.Less(t, n, int64(30), "ApplyCount read %d index entries: the reservations since ReadRebase are not read", n)
	}
	require.Equal(t, arbiter.CountCorrected, l.Outcome)
	require.Equal(t, int64(1_000_000), *l.OnHandThen)
	require.Equal(t, int64(100), l.Applied)

	// A restock among them: ApplyCount reads the movements since ReadRebase
	// up to it, and rebases over it.
	rb, err = arbiter.ReadRebase(s.DB, []string{hot}, at.Add(time.Second))
	require.NoError(t, err)
	reserve(hot, 1000)
	s.restock(hot, 5)
	reserve(hot, 1000)
	at = at.Add(time.Second)
	l, _ = apply("rb-2", 1_000_000+100+40)
	require.Equal(t, arbiter.CountCorrected, l.Outcome)
	require.Equal(t, int64(1_000_000+100), *l.OnHandThen, "the two restocks since counted_at are rebased over, the earlier count's movement is not")
	require.Equal(t, int64(40), l.Applied)
	require.Equal(t, int64(1_000_000+7+100+5+40), *l.OnHand)
	requireLastOnHandChange(t, s.DB, hot) // the second restock: COUNT movements leave it
	requireLastOnHandChange(t, s.DB, quiet)
}

// handlerReads returns a function that runs fn on one connection of db
// and returns how many index entries the session read meanwhile
// (MariaDB's Handler_read_key, _next, _prev, _first, _last), or -1 on a
// database without those counters (the embedded SQLite).
func handlerReads(t *testing.T, db *gorm.DB) func(fn func(*gorm.DB)) int64 {
	return func(fn func(*gorm.DB)) int64 {
		t.Helper()
		if db.Dialector.Name() == "sqlite" {
			fn(db)
			return -1
		}
		var n int64
		require.NoError(t, db.Connection(func(c *gorm.DB) error {
			status := func() int64 {
				var rows []struct {
					Name  string `gorm:"column:Variable_name"`
					Value int64  `gorm:"column:Value"`
				}
				require.NoError(t, c.Raw(`SHOW SESSION STATUS WHERE Variable_name IN
					('Handler_read_key', 'Handler_read_next', 'Handler_read_prev', 'Handler_read_first', 'Handler_read_last')`).Scan(&rows).Error)
				var sum int64
				for _, r := range rows {
					sum += r.Value
				}
				return sum
			}
			start := status()
			fn(c)
			n = status() - start
			return nil
		}))
		return n
	}
}
