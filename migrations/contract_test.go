package migrations_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/migrations"
	"github.com/acme/inventory/testkit/testenv"
)

// hasIndex reports whether table has an index named name.
func hasIndex(t *testing.T, db *sql.DB, table, name string) bool {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM information_schema.statistics
		WHERE table_schema = DATABASE() AND table_name = ? AND index_name = ?`, table, name).Scan(&n))
	return n > 0
}

// keyRows is idempotency_keys as "user/key/order" strings.
func keyRows(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query(`SELECT user_id, idempotency_key, order_id FROM idempotency_keys ORDER BY user_id, idempotency_key`)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var u, k, o string
		require.NoError(t, rows.Scan(&u, &k, &o))
		out = append(out, u+"/"+k+"/"+o)
	}
	require.NoError(t, rows.Err())
	return out
}

// A database a fleet serves is upgraded by migrate (the expand set) and
// contracted only when asked: the keys an older release wrote only in the
// orders' rows, over more than one page of orders, are copied into
// idempotency_keys beside the ones a newer release wrote there, and then
// orders_idempotency is dropped. Down puts the index back first.
func TestContractCopiesOldKeysThenDropsTheirIndex(t *testing.T) {
	ctx := context.Background()
	db, _ := migratedTo(t, 43) // the release before idempotency_keys
	var values []string
	var want []string
	for i := range 2345 { // three pages; every third order keyed
		id := fmt.Sprintf("o%05d", i)
		key := "NULL"
		if i%3 == 0 {
			key = fmt.Sprintf("'k%d'", i)
			want = append(want, fmt.Sprintf("u%d/k%d/%s", i%7, i, id))
		}
		values = append(values, fmt.Sprintf("('%s', 'u%d', %s, 'PENDING', '%s', NOW())", id, i%7, key, id))
	}
	_, err := db.Exec(`INSERT INTO orders (id, user_id, idempotency_key, status, reservation_token, expires_at) VALUES ` + strings.Join(values, ", "))
	require.NoError(t, err)

	require.NoError(t, migrations.Up(ctx, db, migrations.MySQL))
	require.True(t, hasIndex(t, db, "orders", "orders_idempotency"), "migrate alone leaves what an older release reads")
	v, err := migrations.Contracted(ctx, db, migrations.MySQL)
	require.NoError(t, err)
	require.Zero(t, v)
	// A newer release's order, its key already in the table.
	_, err = db.Exec(`INSERT INTO orders (id, user_id, idempotency_key, status, reservation_token, expires_at) VALUES ('n1', 'u1', 'kn', 'PENDING', 'n1', NOW())`)
	require.NoError(t, err)
	_, err = db.Exec(`INSERT INTO idempotency_keys (user_id, idempotency_key, order_id) VALUES ('u1', 'kn', 'n1')`)
	require.NoError(t, err)
	want = append(want, "u1/kn/n1")

	n, err := migrations.Contract(ctx, db, migrations.MySQL)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	got := keyRows(t, db)
	require.Len(t, got, len(want))
	require.ElementsMatch(t, want, got)
	require.False(t, hasIndex(t, db, "orders", "orders_idempotency"))
	n, err = migrations.Contract(ctx, db, migrations.MySQL)
	require.NoError(t, err)
	require.Zero(t, n, "a second contract has nothing to do")

	step, err := migrations.Down(ctx, db, migrations.MySQL)
	require.NoError(t, err)
	require.Equal(t, "contract step 2", step.String())
	require.True(t, hasIndex(t, db, "orders", "orders_idempotency"))
	step, err = migrations.Down(ctx, db, migrations.MySQL)
	require.NoError(t, err)
	require.Equal(t, "contract step 1", step.String())
	require.Len(t, keyRows(t, db), len(want), "the copied keys stay: they say what the orders' column says")
	p, err := migrations.Provider(db, migrations.MySQL)
	require.NoError(t, err)
	top, err := p.GetDBVersion(ctx)
	require.NoError(t, err)
	step, err = migrations.Down(ctx, db, migrations.MySQL)
	require.NoError(t, err)
	require.Equal(t, migrations.Step{Version: top}, step, "then the expand set's newest")
}

// The contract waits for the expand set: on a database migrate has not
// brought up to date it refuses and changes nothing.
func TestContractRefusesBeforeMigrate(t *testing.T) {
	ctx := context.Background()
	db, _ := migratedTo(t, 43)
	_, err := migrations.Contract(ctx, db, migrations.MySQL)
	require.ErrorContains(t, err, "run migrate (up) first")
	v, err := migrations.Contracted(ctx, db, migrations.MySQL)
	require.NoError(t, err)
	require.Zero(t, v)
	require.True(t, hasIndex(t, db, "orders", "orders_idempotency"))
}

// A new database is contracted by migrate itself: no older release can
// be serving it.
func TestUpContractsANewDatabase(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("mysql", testenv.MySQLDatabase(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, migrations.Up(ctx, db, migrations.MySQL))
	v, err := migrations.Contracted(ctx, db, migrations.MySQL)
	require.NoError(t, err)
	require.EqualValues(t, 2, v)
	require.False(t, hasIndex(t, db, "orders", "orders_idempotency"))
	require.NoError(t, migrations.DownAll(ctx, db, migrations.MySQL))
	require.Empty(t, appTables(t, db))
	require.NoError(t, migrations.Up(ctx, db, migrations.MySQL))
	require.False(t, hasIndex(t, db, "orders", "orders_idempotency"), "after everything rolled back, it is new again")
}

// On SQLite the contract is the copy alone (the embedded default
// contracts at every start).
func TestSQLiteContractCopiesOldKeys(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:"+t.TempDir()+"/c.db")
	require.NoError(t, err)
	defer db.Close()
	db.SetMaxOpenConns(1) // as the embedded default runs it: a step that asked for a second connection would wait forever
	p, err := migrations.Provider(db, migrations.SQLite)
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 43)
	require.NoError(t, err)
	_, err = db.Exec(`INSERT INTO orders (id, user_id, idempotency_key, status, reservation_token, expires_at) VALUES
		('a', 'u', 'k1', 'PENDING', 'a', CURRENT_TIMESTAMP), ('b', 'u', NULL, 'PENDING', 'b', CURRENT_TIMESTAMP)`)
	require.NoError(t, err)
	require.NoError(t, migrations.Up(ctx, db, migrations.SQLite))
	require.Empty(t, keyRows(t, db))
	n, err := migrations.Contract(ctx, db, migrations.SQLite)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, []string{"u/k1/a"}, keyRows(t, db))
}
