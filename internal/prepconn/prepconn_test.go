package prepconn_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/prepconn"
	"github.com/acme/inventory/testkit/testenv"
)

// open returns a pool on a fresh test database (the service's session
// settings: parameters interpolated by the client) with a table t.
func open(t *testing.T) *sql.DB {
	t.Helper()
	db, _ := openDSN(t)
	return db
}

func openDSN(t *testing.T) (*sql.DB, string) {
	t.Helper()
	dsn := testenv.MySQLDatabase(t)
	db, err := sql.Open("mysql", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	_, err = db.Exec(`CREATE TABLE t (id BIGINT AUTO_INCREMENT PRIMARY KEY, a BIGINT NOT NULL, b VARCHAR(40) NOT NULL,
		at DATETIME(6) NULL) ENGINE=InnoDB`)
	require.NoError(t, err)
	return db, dsn
}

// counters are a session's statement counters, read on the transaction's
// own connection (as text: no argument).
type counters struct{ prepare, execute, close int64 }

func sessionCounters(t *testing.T, tx *prepconn.Tx) counters {
	t.Helper()
	rows, err := tx.QueryContext(context.Background(), `SHOW SESSION STATUS WHERE Variable_name IN ('Com_stmt_prepare', 'Com_stmt_execute', 'Com_stmt_close')`)
	require.NoError(t, err)
	defer rows.Close()
	var c counters
	for rows.Next() {
		var name string
		var v int64
		require.NoError(t, rows.Scan(&name, &v))
		switch strings.ToLower(name) {
		case "com_stmt_prepare":
			c.prepare = v
		case "com_stmt_execute":
			c.execute = v
		case "com_stmt_close":
			c.close = v
		}
	}
	require.NoError(t, rows.Err())
	return c
}

func connectionID(t *testing.T, tx *prepconn.Tx) int64 {
	t.Helper()
	var id int64
	rows, err := tx.QueryContext(context.Background(), `SELECT CONNECTION_ID()`)
	require.NoError(t, err)
	defer rows.Close()
	require.True(t, rows.Next())
	require.NoError(t, rows.Scan(&id))
	return id
}

func count(t *testing.T, db *sql.DB) int64 {
	t.Helper()
	var n int64
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM t`).Scan(&n))
	return n
}

const insert2 = `INSERT INTO t (a, b, at) VALUES (?, ?, ?), (?, ?, ?)`

// Each text is prepared once on the connection and then only executed, by
// every later transaction; values go and come back through the binary
// protocol unchanged; a rolled-back transaction keeps the connection and
// its statements.
func TestStatementsArePreparedOnceAndReused(t *testing.T) {
	db := open(t)
	c := prepconn.New(db, prepconn.Config{})
	defer c.Close()
	ctx := context.Background()
	at := time.Date(2026, 11, 24, 18, 47, 5, 123456000, time.UTC)
	const n = 20
	for i := range n {
		tx, err := c.BeginTx(ctx, nil)
		require.NoError(t, err)
		_, err = tx.ExecContext(ctx, insert2, i, fmt.Sprintf("x%d", i), at, i, "y", nil)
		require.NoError(t, err)
		rows, err := tx.QueryContext(ctx, `SELECT b, at FROM t WHERE a = ? AND at IS NOT NULL`, i)
		require.NoError(t, err)
		require.True(t, rows.Next())
		var b string
		var got time.Time
		require.NoError(t, rows.Scan(&b, &got))
		require.NoError(t, rows.Close())
		require.Equal(t, fmt.Sprintf("x%d", i), b)
		require.True(t, at.Equal(got), "%s", got)
		require.NoError(t, tx.Commit())
	}
	tx, err := c.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, counters{prepare: 2, execute: 2 * n}, sessionCounters(t, tx), "the server parsed each text once")
	_, err = tx.ExecContext(ctx, insert2, -1, "gone", at, -1, "gone", at)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())
	require.Equal(t, int64(2*n), count(t, db))
	require.Equal(t, prepconn.Stats{Statements: 2, Placeholders: 7, Prepares: 2, Executions: 2*n + 1, Connections: 1}, c.Stats())

	// A statement without arguments is text; an answer of the server (a
	// duplicate) leaves the connection as it was.
	tx, err = c.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, `INSERT INTO t (id, a, b) VALUES (?, ?, ?)`, 1, 0, "dup")
	var me *mysql.MySQLError
	require.ErrorAs(t, err, &me)
	require.EqualValues(t, 1062, me.Number)
	require.NoError(t, tx.Rollback())
	st := c.Stats()
	require.Equal(t, int64(1), st.Connections)
	require.Equal(t, 3, st.Statements)
}

// A connection that died is replaced, and its statements are prepared
// again on the new one: killed between transactions (the next BEGIN finds
// out and retries once on a fresh connection), and killed in the middle of
// one (the statement fails, the rollback discards the connection).
func TestReconnectPreparesAgain(t *testing.T) {
	db := open(t)
	admin, err := sql.Open("mysql", testenv.MySQLDSN())
	require.NoError(t, err)
	defer admin.Close()
	c := prepconn.New(db, prepconn.Config{})
	defer c.Close()
	ctx := context.Background()
	kill := func(id int64) {
		_, err := admin.Exec(fmt.Sprintf("KILL CONNECTION %d", id))
		require.NoError(t, err)
		for { // until the server has let it go
			var n int
			require.NoError(t, admin.QueryRow(`SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?`, id).Scan(&n))
			if n == 0 {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	write := func(tx *prepconn.Tx, i int) error {
		_, err := tx.ExecContext(ctx, insert2, i, "a", nil, i, "b", nil)
		return err
	}

	tx, err := c.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, write(tx, 1))
	first := connectionID(t, tx)
	require.NoError(t, tx.Commit())
	kill(first)

	tx, err = c.BeginTx(ctx, nil) // the held connection is dead: a fresh one
	require.NoError(t, err)
	second := connectionID(t, tx)
	require.NotEqual(t, first, second)
	require.NoError(t, write(tx, 2))
	require.Equal(t, counters{prepare: 1, execute: 1}, sessionCounters(t, tx), "prepared again on the new connection")
	require.NoError(t, tx.Commit())
	st := c.Stats()
	require.Equal(t, int64(2), st.Connections)
	require.Equal(t, int64(2), st.Prepares)

	tx, err = c.BeginTx(ctx, nil)
	require.NoError(t, err)
	kill(connectionID(t, tx))
	require.Error(t, write(tx, 3))
	require.Error(t, tx.Rollback(), "rolled back by the session's end, not by a ROLLBACK")
	require.Zero(t, c.Stats().Statements, "the dead connection's statements are forgotten")

	tx, err = c.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, write(tx, 4))
	require.Equal(t, counters{prepare: 1, execute: 1}, sessionCounters(t, tx))
	require.NoError(t, tx.Commit())
	st = c.Stats()
	require.Equal(t, int64(3), st.Connections)
	require.Equal(t, int64(3), st.Prepares)
	var as []int64
	rows, err := db.Query(`SELECT a FROM t ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var a int64
		require.NoError(t, rows.Scan(&a))
		as = append(as, a)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []int64{1, 1, 2, 2, 4, 4}, as, "the killed transaction wrote nothing")
}

// The bounds hold: at most MaxStatements statements and MaxPlaceholders
// placeholders stay prepared (the server closes the rest: prepared minus
// closed on the session is what the Conn holds), least recently used out
// first; a statement larger than a quarter of the placeholders goes as text.
func TestBoundsHold(t *testing.T) {
	db := open(t)
	c := prepconn.New(db, prepconn.Config{MaxStatements: 3, MaxPlaceholders: 40})
	defer c.Close()
	ctx := context.Background()
	insertN := func(tx *prepconn.Tx, rows int) {
		args := make([]any, 0, 2*rows)
		for i := range rows {
			args = append(args, i, "v")
		}
		q := `INSERT INTO t (a, b) VALUES ` + strings.TrimSuffix(strings.Repeat("(?, ?), ", rows), ", ")
		_, err := tx.ExecContext(ctx, q, args...)
		require.NoError(t, err)
	}
	tx, err := c.BeginTx(ctx, nil)
	require.NoError(t, err)
	for rows := 1; rows <= 5; rows++ { // 2 to 10 placeholders, 5 texts
		insertN(tx, rows)
		st := c.Stats()
		require.LessOrEqual(t, st.Statements, 3)
		require.LessOrEqual(t, st.Placeholders, 40)
	}
	st := c.Stats()
	require.Equal(t, 3, st.Statements)
	require.Equal(t, 6+8+10, st.Placeholders)
	require.Equal(t, int64(2), st.Evictions)
	srv := sessionCounters(t, tx)
	require.Equal(t, int64(st.Statements), srv.prepare-srv.close, "the server holds what the Conn holds")

	insertN(tx, 4) // recently used: no prepare
	insertN(tx, 1) // evicted: prepared again, and the least recent (3 rows) goes
	st = c.Stats()
	require.Equal(t, int64(6), st.Prepares)
	require.Equal(t, 2+8+10, st.Placeholders)
	insertN(tx, 6) // 12 placeholders > 40/4: text
	st = c.Stats()
	require.Equal(t, int64(1), st.Texts)
	require.Equal(t, int64(6), st.Prepares)
	// 4 more texts of 8 and 10 placeholders: the placeholder bound evicts.
	for _, rows := range []int{4, 5, 4, 5} {
		insertN(tx, rows)
	}
	st = c.Stats()
	require.LessOrEqual(t, st.Placeholders, 40)
	srv = sessionCounters(t, tx)
	require.Equal(t, int64(st.Statements), srv.prepare-srv.close)
	require.NoError(t, tx.Commit())
}

// Close closes every statement on the server and gives the connection
// back to the pool; a transaction after it is refused.
func TestCloseClosesStatements(t *testing.T) {
	db := open(t)
	db.SetMaxOpenConns(1) // the Conn's connection is the pool's only one
	c := prepconn.New(db, prepconn.Config{})
	ctx := context.Background()
	tx, err := c.BeginTx(ctx, nil)
	require.NoError(t, err)
	for i := range 3 {
		_, err := tx.ExecContext(ctx, fmt.Sprintf(`INSERT INTO t (a, b) VALUES (?, ?) /* %d */`, i), i, "v")
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit())
	require.NoError(t, c.Close())
	require.Zero(t, db.Stats().InUse)
	var prepared, closed int64
	var name string
	require.NoError(t, db.QueryRow(`SHOW SESSION STATUS LIKE 'Com_stmt_prepare'`).Scan(&name, &prepared))
	require.NoError(t, db.QueryRow(`SHOW SESSION STATUS LIKE 'Com_stmt_close'`).Scan(&name, &closed))
	require.Equal(t, []int64{3, 3}, []int64{prepared, closed})
	_, err = c.BeginTx(ctx, nil)
	require.ErrorIs(t, err, prepconn.ErrClosed)
	require.Equal(t, int64(3), count(t, db))
}

// A COMMIT sent into a partition ends at the transaction's deadline (the
// DSN here has no read timeout: without the context it would wait for
// ever), and the connection is discarded: its outcome is unknown. After
// the network heals the next transaction runs on a fresh connection.
func TestCommitEndsAtTheDeadline(t *testing.T) {
	_, raw := openDSN(t)
	dsn, err := mysql.ParseDSN(raw)
	require.NoError(t, err)
	link := testenv.NewLink(t, dsn.Addr)
	dsn.Addr = link.Addr()
	linked, err := sql.Open("mysql", dsn.FormatDSN())
	require.NoError(t, err)
	defer linked.Close()
	c := prepconn.New(linked, prepconn.Config{})
	defer c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	tx, err := c.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, insert2, 1, "a", nil, 1, "b", nil)
	require.NoError(t, err)
	require.NoError(t, link.Blackhole())
	err = tx.CommitContext(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Zero(t, c.Stats().Statements, "the connection and its statements are gone")
	require.NoError(t, link.Heal())

	tx, err = c.BeginTx(context.Background(), nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(context.Background(), insert2, 2, "a", nil, 2, "b", nil)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	st := c.Stats()
	require.Equal(t, int64(2), st.Connections)
	require.Equal(t, int64(2), st.Prepares)
}
