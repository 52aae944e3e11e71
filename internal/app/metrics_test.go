package app

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/migrations"
	"github.com/acme/inventory/testkit/testenv"
)

// A scrape reads live rows only: every gauge query runs on an index range
// over the live rows (pending orders, held reservations, unapplied outbox
// rows), never a full scan of tables that grow with history. Checked on the
// real MariaDB's plans with a history of finished rows loaded.
func TestScrapeReadsLiveRowsOnly(t *testing.T) {
	db, err := sql.Open("mysql", testenv.MySQLDatabase(t))
	require.NoError(t, err)
	defer db.Close()
	ctx := context.Background()
	require.NoError(t, migrations.Up(ctx, db, migrations.MySQL))
	// A history: many finished rows, a few live ones.
	for i := 0; i < 2000; i++ {
		status, state, applied := "PAID", "SOLD", "NOW(6)"
		if i%100 == 0 {
			status, state, applied = "PENDING", "HELD", "NULL"
		}
		id := fmt.Sprintf("o%05d", i)
		_, err := db.Exec(`INSERT INTO orders (id, user_id, status, reservation_token, expires_at) VALUES (?, 'u', ?, ?, NOW())`, id, status, id)
		require.NoError(t, err)
		_, err = db.Exec(`INSERT INTO stock_reservations (token, sku, order_id, qty, state, expires_at) VALUES (?, 'A', ?, 1, ?, NOW())`, id, id, state)
		require.NoError(t, err)
		_, err = db.Exec(`INSERT INTO stock_outbox (token, sku, op, qty, sent_at, applied_at) VALUES (?, 'A', 'DEDUCT', 1, NOW(6), `+applied+`)`, id)
		require.NoError(t, err)
	}
	_, err = db.Exec(`ANALYZE TABLE orders, stock_reservations, stock_outbox`)
	require.NoError(t, err)
	for name, q := range map[string]string{"pending": pendingQuery, "held": heldQuery, "backlog": backlogQuery} {
		rows, err := db.Query("EXPLAIN " + q)
		require.NoError(t, err)
		for _, plan := range testenv.Rows(t, rows) {
			require.Contains(t, []string{"ref", "range"}, plan["type"], "%s: %v", name, plan)
			require.NotEmpty(t, plan["key"], "%s uses an index: %v", name, plan)
			var n int
			fmt.Sscan(plan["rows"], &n)
			require.LessOrEqual(t, n, 200, "%s reads about the live rows (20 of 2000), not the history: %v", name, plan)
		}
	}
}
