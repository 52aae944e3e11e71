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

// Backstops of Serving: each bounds one network wait of a connection that
// no context does (a background job's, a statement the driver is writing).
const (
	DialTimeout  = 2 * time.Second
	ReadTimeout  = 10 * time.Second
	WriteTimeout = 10 * time.Second
	// IdleTransaction is how long MariaDB keeps a session that sits idle
	// inside a transaction before it kills it (idle_transaction_timeout).
	// The service never pauses inside a transaction for more than a round
	// trip to Redis; a transaction that idles longer was orphaned: its
	// client gave up on a deadline during a partition, and the server,
	// which never heard, would otherwise hold its row locks (the hot SKU's
	// among them) for hours after the network heals.
	IdleTransaction = 5 * time.Second
)

// Serving bounds every connection of the serving process, after Prepare:
// dial, read and write timeouts where the DSN sets none (requests carry
// their own deadlines; these bound what nothing else does), and on MariaDB
// an orphaned transaction rolled back after IdleTransaction. Operations that
// may run long statements (migrate) use Prepare alone.
func Serving(ctx context.Context, cfg *mysql.Config) error {
	if cfg.Timeout == 0 {
		cfg.Timeout = DialTimeout
	}
	if cfg.ReadTimeout == 0 {
		cfg.ReadTimeout = ReadTimeout
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = WriteTimeout
	}
	has, err := hasVariable(ctx, cfg, "idle_transaction_timeout")
	if err != nil || !has {
		return err
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	if _, set := cfg.Params["idle_transaction_timeout"]; !set {
		cfg.Params["idle_transaction_timeout"] = fmt.Sprint(int(IdleTransaction.Seconds()))
	}
	return nil
}

// probed remembers each server's answers (by address and variable): a
// process opens many pools on one server (the tests, one per database) and
// needs to ask once.
var probed sync.Map // cfg.Addr + " " + variable -> bool

func hasSnapshotIsolation(ctx context.Context, cfg *mysql.Config) (bool, error) {
	return hasVariable(ctx, cfg, "innodb_snapshot_isolation")
}

// hasVariable asks the server whether it has the session variable name.
func hasVariable(ctx context.Context, cfg *mysql.Config, name string) (bool, error) {
	key := cfg.Addr + " " + name
	if has, ok := probed.Load(key); ok {
		return has.(bool), nil
	}
	has, err := probeVariable(ctx, cfg, name)
	if err == nil {
		probed.Store(key, has)
	}
	return has, err
}

func probeVariable(ctx context.Context, cfg *mysql.Config, name string) (bool, error) {
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return false, err
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	var v sql.NullString
	err = db.QueryRowContext(ctx, `SELECT @@SESSION.`+name).Scan(&v)
	var me *mysql.MySQLError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &me) && me.Number == 1193: // unknown system variable
		return false, nil
	}
	return false, fmt.Errorf("mysql: %w", err)
}

// MultiStatements opens a pool of at most conns connections on a copy of
// cfg (as Prepare, and Serving for the serving process, left it) whose
// connections take several statements in one query (the driver's
// multiStatements): a path that must cost one round trip sends its
// statements as one text there, and reads its results in turn. Only
// fixed texts go to it, their parameters interpolated by the client (cfg's
// InterpolateParams, which Prepare sets, is required: a statement prepared
// by the server holds one statement), so no parameter becomes a
// statement. The service's own pool keeps multiStatements off.
func MultiStatements(cfg *mysql.Config, conns int) (*sql.DB, error) {
	if !cfg.InterpolateParams {
		return nil, errors.New("mysqlconn: MultiStatements needs interpolated parameters (Prepare sets them)")
	}
	c := cfg.Clone()
	c.MultiStatements = true
	connector, err := mysql.NewConnector(c)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	return db, nil
}
