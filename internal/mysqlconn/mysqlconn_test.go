package mysqlconn_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/mysqlconn"
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
