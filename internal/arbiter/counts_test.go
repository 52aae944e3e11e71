package arbiter_test

import (
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
		require.NoError(t, s.DB.Exec(`UPDATE skus SET on_hand = on_hand + ?, movement_position = movement_position + ? WHERE sku = ?`,
			sum, len(ms), sku).Error)
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
