package migrations_test

import (
	"context"
	"database/sql"
	"testing"

	_ "github.com/glebarez/go-sqlite"
	_ "github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/testenv"
	"github.com/acme/inventory/migrations"
)

var tables = []string{"orders", "order_items", "skus", "stock_anomalies", "stock_ledger", "stock_outbox"}

func appTables(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query(`SELECT table_name FROM information_schema.tables
		WHERE table_schema = DATABASE() AND table_name <> 'goose_db_version' ORDER BY table_name`)
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
	require.EqualValues(t, len(p.ListSources()), v, "every migration applied")

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

	ins := `INSERT INTO stock_ledger (order_id, sku, op, qty) VALUES (?, ?, ?, ?)`
	_, err = db.Exec(ins, "o1", "SKU1", "DEDUCT", 2)
	require.NoError(t, err)
	_, err = db.Exec(ins, "o1", "SKU1", "DEDUCT", 2)
	require.ErrorContains(t, err, "Duplicate entry")
	_, err = db.Exec(ins, "o1", "SKU1", "RESTORE", 2)
	require.NoError(t, err)

	_, err = db.Exec(`INSERT INTO skus (sku, stock) VALUES ('BAD', -2)`)
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
			AND name NOT LIKE 'sqlite_%' AND name <> 'goose_db_version' ORDER BY name`)
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
