package migrations_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	_ "github.com/glebarez/go-sqlite"
	_ "github.com/go-sql-driver/mysql"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/migrations"
	"github.com/acme/inventory/testkit/testenv"
)

var tables = []string{"buyer_quotas", "campaigns", "holds", "idempotency_keys", "orders", "order_items", "skus", "stock_adjustments", "stock_anomalies", "stock_counts", "stock_count_batches", "stock_count_pages", "stock_events", "stock_ledger", "stock_movements", "stock_outbox", "stock_reservations", "stock_shipping", "webhooks"}

func appTables(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query(`SELECT table_name FROM information_schema.tables
		WHERE table_schema = DATABASE() AND table_name NOT IN ('goose_db_version', 'goose_contract_version') ORDER BY table_name`)
	require.NoError(t, err)
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		names = append(names, n)
	}
	require.NoError(t, rows.Err())
	return names
}

// migratedTo is a fresh test database on the real MariaDB migrated up to
// version (data written under an old schema is then migrated further).
func migratedTo(t *testing.T, version int64) (*sql.DB, *goose.Provider) {
	t.Helper()
	db, err := sql.Open("mysql", testenv.MySQLDatabase(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	p, err := migrations.Provider(db, migrations.MySQL)
	require.NoError(t, err)
	_, err = p.UpTo(context.Background(), version)
	require.NoError(t, err)
	return db, p
}

// Up, all the way down, and up again on the real MariaDB.
func TestMigrationsUpDownUp(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("mysql", testenv.MySQLDatabase(t))
	require.NoError(t, err)
	defer db.Close()

	require.NoError(t, migrations.Up(ctx, db, migrations.MySQL))
	require.Equal(t, tables, appTables(t, db))

	p, err := migrations.Provider(db, migrations.MySQL)
	require.NoError(t, err)
	v, err := p.GetDBVersion(ctx)
	require.NoError(t, err)
	sources := p.ListSources()
	require.EqualValues(t, sources[len(sources)-1].Version, v, "every migration applied, up to the last")

	require.NoError(t, migrations.DownAll(ctx, db, migrations.MySQL))
	require.Empty(t, appTables(t, db))

	require.NoError(t, migrations.Up(ctx, db, migrations.MySQL))
	require.Equal(t, tables, appTables(t, db))
}

// The schema enforces what the code relies on: one ledger row per operation.
func TestLedgerUniquePerOperation(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("mysql", testenv.MySQLDatabase(t))
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, migrations.Up(ctx, db, migrations.MySQL))

	ins := `INSERT INTO stock_ledger (token, sku, op, qty) VALUES (?, ?, ?, ?)`
	_, err = db.Exec(ins, "o1", "SKU1", "DEDUCT", 2)
	require.NoError(t, err)
	_, err = db.Exec(ins, "o1", "SKU1", "DEDUCT", 2)
	require.ErrorContains(t, err, "Duplicate entry")
	_, err = db.Exec(ins, "o1", "SKU1", "RESTORE", 2)
	require.NoError(t, err)

	_, err = db.Exec(`INSERT INTO skus (sku, on_hand) VALUES ('BAD', -2)`)
	require.Error(t, err, "stock below -1 is refused by the CHECK constraint")
}

// The embedded default's schema goes up, down and up again too.
func TestSQLiteMigrationsUpDownUp(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:"+t.TempDir()+"/m.db")
	require.NoError(t, err)
	defer db.Close()
	sqliteTables := func() []string {
		rows, err := db.Query(`SELECT name FROM sqlite_master WHERE type = 'table'
			AND name NOT LIKE 'sqlite_%' AND name NOT IN ('goose_db_version', 'goose_contract_version') ORDER BY name`)
		require.NoError(t, err)
		defer rows.Close()
		var names []string
		for rows.Next() {
			var n string
			require.NoError(t, rows.Scan(&n))
			names = append(names, n)
		}
		return names
	}
	require.NoError(t, migrations.Up(ctx, db, migrations.SQLite))
	require.ElementsMatch(t, tables, sqliteTables())
	require.NoError(t, migrations.DownAll(ctx, db, migrations.SQLite))
	require.Empty(t, sqliteTables())
	require.NoError(t, migrations.Up(ctx, db, migrations.SQLite))
	require.ElementsMatch(t, tables, sqliteTables())
}

// Data written under the old schema (version 6: skus.stock, no reservation
// rows) comes through the migration with its quantity states right:
// on_hand = the old stock, one HELD row per pending line, one COMMITTED row
// per paid line not yet applied, reserved = their sum, and a late-paid
// order's token aligned with its outbox rows.
func TestMigrationBackfillsReservations(t *testing.T) {
	ctx := context.Background()
	db, _ := migratedTo(t, 6)
	for _, q := range []string{
		`INSERT INTO skus (sku, stock) VALUES ('A', 10), ('B', 5), ('U', -1)`,
		// pending: holds A 2, B 1
		`INSERT INTO orders (id, user_id, status, reservation_token, expires_at) VALUES ('p1', 'u', 'PENDING', 'p1', NOW())`,
		`INSERT INTO order_items (order_id, sku, qty) VALUES ('p1', 'A', 2), ('p1', 'B', 1)`,
		// paid, DEDUCT not applied: A 3; paid late, not applied: A 1 (token p3.late, outbox under p3)
		`INSERT INTO orders (id, user_id, status, reservation_token, payment_id, expires_at) VALUES
			('p2', 'u', 'PAID', 'p2', 'pay2', NOW()), ('p3', 'u', 'PAID', 'p3.late', 'pay3', NOW())`,
		`INSERT INTO order_items (order_id, sku, qty) VALUES ('p2', 'A', 3), ('p3', 'A', 1)`,
		`INSERT INTO stock_outbox (order_id, sku, op, qty) VALUES ('p2', 'A', 'DEDUCT', 3), ('p3', 'A', 'DEDUCT', 1)`,
		// paid and applied: B 2 (stock already 5 after it); cancelled: nothing
		`INSERT INTO orders (id, user_id, status, reservation_token, payment_id, expires_at) VALUES ('p4', 'u', 'PAID', 'p4', 'pay4', NOW())`,
		`INSERT INTO order_items (order_id, sku, qty) VALUES ('p4', 'B', 2)`,
		`INSERT INTO stock_outbox (order_id, sku, op, qty, sent_at) VALUES ('p4', 'B', 'DEDUCT', 2, NOW())`,
		`INSERT INTO stock_ledger (order_id, sku, op, qty) VALUES ('p4', 'B', 'DEDUCT', 2)`,
		`INSERT INTO orders (id, user_id, status, reservation_token, expires_at) VALUES ('p5', 'u', 'CANCELLED', 'p5', NOW())`,
		`INSERT INTO order_items (order_id, sku, qty) VALUES ('p5', 'A', 4)`,
	} {
		_, err := db.Exec(q)
		require.NoError(t, err, q)
	}
	require.NoError(t, migrations.Up(ctx, db, migrations.MySQL))

	type qty struct{ onHand, reserved int64 }
	got := map[string]qty{}
	rows, err := db.Query(`SELECT sku, on_hand, reserved FROM skus`)
	require.NoError(t, err)
	for rows.Next() {
		var sku string
		var q qty
		require.NoError(t, rows.Scan(&sku, &q.onHand, &q.reserved))
		got[sku] = q
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]qty{"A": {10, 6}, "B": {5, 1}, "U": {-1, 0}}, got)

	var res []string
	rows, err = db.Query(`SELECT CONCAT(token, '/', sku, '/', qty, '/', state) FROM stock_reservations ORDER BY token, sku`)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		res = append(res, s)
	}
	require.Equal(t, []string{"p1/A/2/HELD", "p1/B/1/HELD", "p2/A/3/COMMITTED", "p3/A/1/COMMITTED"}, res)
	var token string
	require.NoError(t, db.QueryRow(`SELECT reservation_token FROM orders WHERE id = 'p3'`).Scan(&token))
	require.Equal(t, "p3", token, "a refund's RESTORE carries the token its DEDUCT carried")

	_, err = db.Exec(`UPDATE skus SET reserved = 11 WHERE sku = 'A'`)
	require.ErrorContains(t, err, "skus_reserved_valid", "the database refuses reserved > on_hand")
}

// Migration 18 makes every name exact (binary collation), after looking for
// names that the old case-insensitive collation stored as one: it refuses
// with a report of each, changing nothing, until an operator picks one
// spelling; then two spellings are two rows.
func TestExactNamesMigration(t *testing.T) {
	ctx := context.Background()
	db, p := migratedTo(t, 17)
	exec := func(q string) {
		t.Helper()
		_, err := db.Exec(q)
		require.NoError(t, err, q)
	}
	exec(`INSERT INTO skus (sku, on_hand, reserved) VALUES ('PHONE-X', 10, 2), ('TEE', 5, 0)`)
	exec(`INSERT INTO orders (id, user_id, status, reservation_token, expires_at) VALUES ('o1', 'Alice', 'PENDING', 'o1', NOW())`)
	exec(`INSERT INTO order_items (order_id, sku, qty) VALUES ('o1', 'phone-x', 2)`)
	exec(`INSERT INTO stock_reservations (token, sku, order_id, buyer, qty, state, expires_at) VALUES ('o1', 'phone-x', 'o1', 'alice', 2, 'HELD', NOW())`)

	err := migrations.Up(ctx, db, migrations.MySQL)
	require.Error(t, err)
	for _, want := range []string{
		`sku "PHONE-X" in skus.sku (1 rows)`,
		`sku "phone-x" in order_items.sku (1 rows); stock_reservations.sku (1 rows)`,
		`user id "Alice" in orders.user_id (1 rows)`,
		`user id "alice" in stock_reservations.buyer (1 rows)`,
	} {
		require.Contains(t, err.Error(), want)
	}
	require.NotContains(t, err.Error(), "TEE")
	v, err := p.GetDBVersion(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 17, v, "nothing changed")

	exec(`UPDATE order_items SET sku = 'PHONE-X' WHERE sku = 'phone-x'`)
	exec(`UPDATE stock_reservations SET sku = 'PHONE-X', buyer = 'Alice' WHERE token = 'o1'`)
	require.NoError(t, migrations.Up(ctx, db, migrations.MySQL))
	exec(`INSERT INTO skus (sku, on_hand) VALUES ('phone-x', 1)`)
	var n int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM skus WHERE sku = 'PHONE-X'`).Scan(&n))
	require.Equal(t, 1, n, "two spellings, two rows")
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM order_items WHERE sku = 'phone-x'`).Scan(&n))
	require.Equal(t, 0, n)
}

// Migration 31 counts what campaigns already did as announced (no event
// for what was already so): a scheduled one nothing, a live one started,
// a live one sold out started and sold out, one past its window or whose
// pool was released ended.
func TestCampaignEventFlagsMigration(t *testing.T) {
	ctx := context.Background()
	db, _ := migratedTo(t, 28)
	for _, q := range []string{
		`INSERT INTO skus (sku, on_hand, reserved) VALUES ('S', 100, 10)`,
		`INSERT INTO campaigns (id, sku, allotment, starts_at, ends_at) VALUES
			('sched', 'S', 2, UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, UTC_TIMESTAMP(6) + INTERVAL 2 HOUR),
			('live', 'S', 2, UTC_TIMESTAMP(6) - INTERVAL 1 HOUR, UTC_TIMESTAMP(6) + INTERVAL 1 HOUR),
			('soldout', 'S', 2, UTC_TIMESTAMP(6) - INTERVAL 3 HOUR, UTC_TIMESTAMP(6) + INTERVAL 3 HOUR),
			('past', 'S', 2, UTC_TIMESTAMP(6) - INTERVAL 6 HOUR, UTC_TIMESTAMP(6) - INTERVAL 5 HOUR),
			('ended', 'S', 2, UTC_TIMESTAMP(6) - INTERVAL 9 HOUR, UTC_TIMESTAMP(6) + INTERVAL 9 HOUR)`,
		`INSERT INTO stock_reservations (token, sku, qty, state, expires_at, campaign_id) VALUES
			('c:sched', 'S', 2, 'HELD', NOW(), 'sched'), ('c:live', 'S', 2, 'HELD', NOW(), 'live'),
			('c:soldout', 'S', 0, 'HELD', NOW(), 'soldout'), ('c:past', 'S', 2, 'HELD', NOW(), 'past'),
			('c:ended', 'S', 2, 'RELEASED', NOW(), 'ended')`,
	} {
		_, err := db.Exec(q)
		require.NoError(t, err, q)
	}
	require.NoError(t, migrations.Up(ctx, db, migrations.MySQL))
	got := map[string]int{}
	rows, err := db.Query(`SELECT id, event_flags FROM campaigns`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		var flags int
		require.NoError(t, rows.Scan(&id, &flags))
		got[id] = flags
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]int{"sched": 0, "live": 1, "soldout": 3, "past": 5, "ended": 5}, got)
}

// Migration 33 numbers each SKU's existing movements 1, 2, 3, ... in id
// order (the order the history was read in), whatever the ids of other
// SKUs in between, and records each SKU's last position on its row (0 for
// a SKU with no movement); from then on the schema refuses a movement
// without a position, or at a position its SKU already has.
func TestMovementPositionsMigration(t *testing.T) {
	ctx := context.Background()
	db, p := migratedTo(t, 32)
	exec := func(q string) {
		t.Helper()
		_, err := db.Exec(q)
		require.NoError(t, err, q)
	}
	exec(`INSERT INTO skus (sku, on_hand, reserved) VALUES ('A', 7, 2), ('B', 3, 0), ('EMPTY', 0, 0)`)
	exec(`INSERT INTO stock_movements (id, sku, kind, on_hand_delta, reserved_delta, reason) VALUES
		(10, 'A', 'SET', 5, 0, 'opening balance'), (11, 'B', 'SET', 3, 0, ''), (12, 'A', 'RESTOCK', 2, 0, ''),
		(15, 'A', 'RESERVE', 0, 2, ''), (14, 'B', 'RESERVE', 0, 1, ''), (16, 'B', 'RELEASE', 0, -1, '')`)
	require.NoError(t, migrations.Up(ctx, db, migrations.MySQL))

	positions := func() []string {
		var out []string
		rows, err := db.Query(`SELECT CONCAT(sku, ' ', id, ' ', position) FROM stock_movements ORDER BY sku, position`)
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var s string
			require.NoError(t, rows.Scan(&s))
			out = append(out, s)
		}
		require.NoError(t, rows.Err())
		return out
	}
	require.Equal(t, []string{"A 10 1", "A 12 2", "A 15 3", "B 11 1", "B 14 2", "B 16 3"}, positions())
	last := map[string]int64{}
	rows, err := db.Query(`SELECT sku, movement_position FROM skus`)
	require.NoError(t, err)
	for rows.Next() {
		var sku string
		var n int64
		require.NoError(t, rows.Scan(&sku, &n))
		last[sku] = n
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]int64{"A": 3, "B": 3, "EMPTY": 0}, last)

	_, err = db.Exec(`INSERT INTO stock_movements (sku, kind, on_hand_delta, reserved_delta) VALUES ('A', 'RESTOCK', 1, 0)`)
	require.ErrorContains(t, err, "position", "a movement without a position")
	_, err = db.Exec(`INSERT INTO stock_movements (sku, position, kind, on_hand_delta, reserved_delta) VALUES ('A', 3, 'RESTOCK', 1, 0)`)
	require.ErrorContains(t, err, "Duplicate entry", "a position the SKU has")
	_, err = db.Exec(`INSERT INTO stock_movements (sku, position, kind, on_hand_delta, reserved_delta) VALUES ('B', 0, 'RESTOCK', 1, 0)`)
	require.ErrorContains(t, err, "stock_movements_position_valid")
	exec(`INSERT INTO stock_movements (sku, position, kind, on_hand_delta, reserved_delta) VALUES ('A', 4, 'RESTOCK', 1, 0)`)

	_, err = p.DownTo(ctx, 32)
	require.NoError(t, err)
	var n int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM stock_movements`).Scan(&n))
	require.Equal(t, 7, n, "down keeps the movements")
}

// The embedded default's migration 33 numbers existing movements as the
// real one does.
func TestMovementPositionsMigrationSQLite(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:"+t.TempDir()+"/m.db")
	require.NoError(t, err)
	defer db.Close()
	p, err := migrations.Provider(db, migrations.SQLite)
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 32)
	require.NoError(t, err)
	for _, q := range []string{
		`INSERT INTO skus (sku, on_hand, reserved) VALUES ('A', 7, 2), ('B', 3, 0), ('EMPTY', 0, 0)`,
		`INSERT INTO stock_movements (id, sku, kind, on_hand_delta, reserved_delta) VALUES
			(10, 'A', 'SET', 5, 0), (11, 'B', 'SET', 3, 0), (12, 'A', 'RESTOCK', 2, 0),
			(15, 'A', 'RESERVE', 0, 2), (14, 'B', 'RESERVE', 0, 1)`,
	} {
		_, err := db.Exec(q)
		require.NoError(t, err, q)
	}
	require.NoError(t, migrations.Up(ctx, db, migrations.SQLite))
	var got []string
	rows, err := db.Query(`SELECT m.sku || ' ' || m.id || ' ' || m.position || ' ' || s.movement_position
		FROM stock_movements m JOIN skus s ON s.sku = m.sku ORDER BY m.sku, m.position`)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		got = append(got, s)
	}
	require.NoError(t, rows.Err())
	require.NoError(t, rows.Close())
	require.Equal(t, []string{"A 10 1 3", "A 12 2 3", "A 15 3 3", "B 11 1 2", "B 14 2 2"}, got)
	_, err = db.Exec(`INSERT INTO stock_movements (sku, position, kind, on_hand_delta, reserved_delta) VALUES ('A', 3, 'SET', 1, 0)`)
	require.ErrorContains(t, err, "UNIQUE", "a position the SKU has")
	_, err = p.DownTo(ctx, 32)
	require.NoError(t, err)
}

// Migration 39 lets a movement be a count's (COUNT) on both databases: the
// embedded one edits the stored CHECK in place rather than rebuilding the
// table, so a column another migration added survives it.
func TestMovementKindCount(t *testing.T) {
	ctx := context.Background()
	mdb, err := sql.Open("mysql", testenv.MySQLDatabase(t))
	require.NoError(t, err)
	defer mdb.Close()
	sdb, err := sql.Open("sqlite", "file:"+t.TempDir()+"/m.db")
	require.NoError(t, err)
	defer sdb.Close()
	for _, c := range []struct {
		db *sql.DB
		d  migrations.Dialect
	}{{mdb, migrations.MySQL}, {sdb, migrations.SQLite}} {
		require.NoError(t, migrations.Up(ctx, c.db, c.d))
		_, err := c.db.Exec(`INSERT INTO stock_movements (sku, position, kind, on_hand_delta, reserved_delta) VALUES ('A', 1, 'COUNT', 1, 0)`)
		require.NoError(t, err, "%s", c.d)
		_, err = c.db.Exec(`INSERT INTO stock_movements (sku, position, kind, on_hand_delta, reserved_delta) VALUES ('A', 2, 'NOPE', 1, 0)`)
		require.Error(t, err, "%s: the CHECK still refuses other kinds", c.d)
		p, err := migrations.Provider(c.db, c.d)
		require.NoError(t, err)
		_, err = p.DownTo(ctx, 38) // 39 rolled back, and every migration after it
		require.NoError(t, err)
		v, err := p.GetDBVersion(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 38, v)
		var kind string
		require.NoError(t, c.db.QueryRow(`SELECT kind FROM stock_movements WHERE sku = 'A'`).Scan(&kind))
		require.Equal(t, "CORRECTION", kind, "%s: down turns a count's movements into corrections", c.d)
		_, err = c.db.Exec(`INSERT INTO stock_movements (sku, position, kind, on_hand_delta, reserved_delta) VALUES ('A', 2, 'COUNT', 1, 0)`)
		require.Error(t, err, "%s: down refuses COUNT again", c.d)
	}
}

// Migration 42 records on each SKU's row its last movement that changed
// on_hand, a count's aside (a SET always counts): its position and its
// created_at, on both databases; a SKU with none has 0 and NULL. Down
// drops them.
func TestOnHandPositionMigration(t *testing.T) {
	ctx := context.Background()
	mdb, mp := migratedTo(t, 41)
	sdb, err := sql.Open("sqlite", "file:"+t.TempDir()+"/m.db")
	require.NoError(t, err)
	defer sdb.Close()
	sp, err := migrations.Provider(sdb, migrations.SQLite)
	require.NoError(t, err)
	_, err = sp.UpTo(ctx, 41)
	require.NoError(t, err)
	for _, c := range []struct {
		db *sql.DB
		p  *goose.Provider
	}{{mdb, mp}, {sdb, sp}} {
		for _, q := range []string{
			`INSERT INTO skus (sku, on_hand, reserved, movement_position) VALUES
				('A', 9, 1, 6), ('B', 5, 0, 2), ('C', 0, 0, 1), ('EMPTY', 0, 0, 0)`,
			`INSERT INTO stock_movements (sku, position, kind, on_hand_delta, reserved_delta, created_at) VALUES
				('A', 1, 'SET', 5, 0, '2026-01-01 00:00:01'), ('A', 2, 'RESTOCK', 3, 0, '2026-01-01 00:00:02'),
				('A', 3, 'SALE', -1, -1, '2026-01-01 00:00:03'), ('A', 4, 'RESERVE', 0, 2, '2026-01-01 00:00:04'),
				('A', 5, 'COUNT', 2, 0, '2026-01-01 00:00:05'), ('A', 6, 'RELEASE', 0, -1, '2026-01-01 00:00:06'),
				('B', 1, 'SET', 5, 0, '2026-01-02 00:00:01'), ('B', 2, 'CORRECTION', 0, 0, '2026-01-02 00:00:02'),
				('C', 1, 'SET', 0, 0, '2026-01-03 00:00:01')`,
		} {
			_, err := c.db.Exec(q)
			require.NoError(t, err, q)
		}
		_, err := c.p.UpTo(ctx, 42)
		require.NoError(t, err)
		got := map[string]string{}
		rows, err := c.db.Query(`SELECT sku, on_hand_position, on_hand_moved_at FROM skus`)
		require.NoError(t, err)
		for rows.Next() {
			var sku string
			var pos int64
			var at sql.NullTime
			require.NoError(t, rows.Scan(&sku, &pos, &at))
			got[sku] = fmt.Sprint(pos, " NULL")
			if at.Valid {
				got[sku] = fmt.Sprint(pos, " ", at.Time.UTC().Format(time.DateTime))
			}
		}
		require.NoError(t, rows.Err())
		require.NoError(t, rows.Close())
		require.Equal(t, map[string]string{
			"A":     "3 2026-01-01 00:00:03", // the sale: the count's and the reservations' movements aside
			"B":     "1 2026-01-02 00:00:01", // a correction of reserved only does not count
			"C":     "1 2026-01-03 00:00:01", // a put counts, whatever it moved
			"EMPTY": "0 NULL",
		}, got)
		_, err = c.p.DownTo(ctx, 41)
		require.NoError(t, err)
		_, err = c.db.Exec(`SELECT on_hand_position FROM skus`)
		require.Error(t, err, "down drops the columns")
	}
}
