// Package mysqlconn prepares the service's MySQL/MariaDB connections: the
// session settings its transactions are written for.
package mysqlconn

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Prepare sets what every connection of the service needs on cfg: times as
// UTC time.Time, parameters interpolated by the client (one round trip per
// statement instead of prepare + execute), and, on a MariaDB that has
// innodb_snapshot_isolation, that setting OFF for each session.
//
// The order protocol's transactions are written for InnoDB's REPEATABLE
// READ as MySQL and MariaDB before 11.6.2 run it: a plain SELECT reads the
// transaction's snapshot, and an UPDATE or a locking read works on the
// latest committed row under its lock (the conditional UPDATE of a SKU's
// quantities is what arbitrates). MariaDB 11.6.2 turned
// innodb_snapshot_isolation on by default, and then a transaction that read
// anything before another committed the hot SKU row fails its UPDATE of
// that row with error 1020; under a flash sale every such transaction
// would, again on retry. Prepare asks the server (one short connection) and
// keeps the classic behaviour where the setting exists; MySQL has no such
// setting and is left as it is.
func Prepare(ctx context.Context, cfg *mysql.Config) error {
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	cfg.InterpolateParams = true
	has, err := hasSnapshotIsolation(ctx, cfg)
	if err != nil {
		return err
	}
	if has {
		if cfg.Params == nil {
			cfg.Params = map[string]string{}
		}
		cfg.Params["innodb_snapshot_isolation"] = "OFF"
	}
	return nil
}

// probed remembers each server's answer (by address): a process opens many
// pools on one server (the tests, one per database) and needs to ask once.
var probed sync.Map // cfg.Addr -> bool

func hasSnapshotIsolation(ctx context.Context, cfg *mysql.Config) (bool, error) {
	if has, ok := probed.Load(cfg.Addr); ok {
		return has.(bool), nil
	}
	has, err := probeSnapshotIsolation(ctx, cfg)
	if err == nil {
		probed.Store(cfg.Addr, has)
	}
	return has, err
}

func probeSnapshotIsolation(ctx context.Context, cfg *mysql.Config) (bool, error) {
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return false, err
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	var v sql.NullString
	err = db.QueryRowContext(ctx, `SELECT @@SESSION.innodb_snapshot_isolation`).Scan(&v)
	var me *mysql.MySQLError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &me) && me.Number == 1193: // unknown system variable
		return false, nil
	}
	return false, fmt.Errorf("mysql: %w", err)
}
