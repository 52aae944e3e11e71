package mysqlconn_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/mysqlconn"
	"github.com/acme/inventory/testkit/faultnet"
	"github.com/acme/inventory/testkit/testenv"
)

// Every session Prepare's DSN opens runs with the settings the service's
// transactions are written for, whatever the server's defaults or the
// operator's DSN asked: on this MariaDB (which has the variable),
// innodb_snapshot_isolation OFF even when the DSN asks ON.
func TestPrepareKeepsClassicRepeatableRead(t *testing.T) {
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN())
	require.NoError(t, err)
	cfg.Params = map[string]string{"innodb_snapshot_isolation": "ON"}
	require.NoError(t, mysqlconn.Prepare(context.Background(), cfg))
	require.True(t, cfg.ParseTime)
	require.True(t, cfg.InterpolateParams)
	require.Equal(t, time.UTC, cfg.Loc)

	db, err := sql.Open("mysql", cfg.FormatDSN())
	require.NoError(t, err)
	defer db.Close()
	db.SetMaxIdleConns(4)
	conns := make([]*sql.Conn, 4) // several sessions, each set on connect
	for i := range conns {
		conns[i], err = db.Conn(context.Background())
		require.NoError(t, err)
		var snapshot int
		var isolation string
		require.NoError(t, conns[i].QueryRowContext(context.Background(),
			`SELECT @@SESSION.innodb_snapshot_isolation, @@SESSION.tx_isolation`).Scan(&snapshot, &isolation))
		require.Equal(t, 0, snapshot, "session %d", i)
		require.Equal(t, "REPEATABLE-READ", isolation, "session %d", i)
	}
	for _, c := range conns {
		_ = c.Close()
	}
}

// A server it cannot reach is an error, not a silent default.
func TestPrepareNeedsTheServer(t *testing.T) {
	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.User = "tcp", "127.0.0.1:1", "nobody"
	cfg.Timeout = time.Second
	require.Error(t, mysqlconn.Prepare(context.Background(), cfg))
}

// A transaction's COMMIT whose answer never comes ends with the context it
// began under, not after the connection's ReadTimeout: the driver alone
// waits the whole ReadTimeout (checked here too, so a driver that starts
// watching the context is noticed). Committed with an answer, the rows
// are there, and the pool goes on.
func TestCommitIsBoundedByItsContext(t *testing.T) {
	const readTimeout = 4 * time.Second
	open := func(bounded bool) (*sql.DB, *faultnet.Link) {
		cfg, err := mysql.ParseDSN(testenv.MySQLDatabase(t)) // prepared as the service's sessions
		require.NoError(t, err)
		cfg.ReadTimeout = readTimeout
		link := testenv.NewLink(t, cfg.Addr)
		cfg.Addr = link.Addr()
		var c driver.Connector
		if bounded {
			c, err = mysqlconn.Connector(cfg)
		} else {
			c, err = mysql.NewConnector(cfg)
		}
		require.NoError(t, err)
		db := sql.OpenDB(c)
		t.Cleanup(func() { _ = db.Close() })
		return db, link
	}
	unanswered := func(db *sql.DB, link *faultnet.Link, deadline time.Duration) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		_, err = tx.ExecContext(ctx, `SELECT 1`)
		require.NoError(t, err)
		require.NoError(t, link.Blackhole())
		start := time.Now()
		err = tx.Commit()
		took := time.Since(start)
		require.NoError(t, link.Heal())
		return took, err
	}

	db, link := open(true)
	_, err := db.Exec(`CREATE TABLE committed (id INT PRIMARY KEY)`)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, `INSERT INTO committed VALUES (1)`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	require.ErrorIs(t, tx.Rollback(), sql.ErrTxDone, "database/sql knows the transaction ended")
	var n int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM committed`).Scan(&n))
	require.Equal(t, 1, n)
	var inTx int
	require.NoError(t, db.QueryRow(`SELECT @@in_transaction`).Scan(&inTx))
	require.Zero(t, inTx)

	took, err := unanswered(db, link, 300*time.Millisecond)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, took, readTimeout/2, "the COMMIT waited for the read timeout, not its context")
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM committed`).Scan(&n), "the pool goes on past the link's outage")

	plain, plainLink := open(false)
	took, err = unanswered(plain, plainLink, 300*time.Millisecond)
	require.Error(t, err)
	require.GreaterOrEqual(t, took, readTimeout-time.Second, "the driver now bounds COMMIT by the context itself: Connector's wrapper may go")
}
