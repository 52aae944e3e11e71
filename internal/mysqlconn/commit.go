package mysqlconn

import (
	"context"
	"database/sql/driver"
	"fmt"

	"github.com/go-sql-driver/mysql"
)

// Connector is mysql.NewConnector(cfg) whose transactions commit under the
// context they began with. The driver sends COMMIT with no watcher of any
// context (database/sql's Tx.Commit takes none, and the driver's
// maintainers keep it so: go-sql-driver/mysql issues 1274 and 1407), so a
// COMMIT whose answer never comes (the database's link gone dark) waits
// out the connection's ReadTimeout, 10 s in serving (Serving), whatever
// the request's deadline: make faults' mariadb-blackhole saw answers after
// 10 s where the deadline is 1 s. Here a transaction begun under a context
// that can end sends its COMMIT as a statement under that context, which
// the driver watches: when the context ends first, the driver closes the
// connection (the pool discards it) and the commit's error is the
// context's. The outcome is then unknown, as it was after ReadTimeout: the
// database may have committed. A transaction begun under a context that
// never ends commits as the driver does.
func Connector(cfg *mysql.Config) (driver.Connector, error) {
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return connector{c}, nil
}

type connector struct{ driver.Connector }

func (c connector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	full, ok := dc.(fullConn)
	if !ok { // the driver's connection has every one of these (TestCommitIsBoundedByItsContext)
		_ = dc.Close()
		return nil, fmt.Errorf("mysqlconn: the driver's connection (%T) lacks an interface database/sql uses", dc)
	}
	return conn{full}, nil
}

// fullConn is what the driver's connection implements and database/sql
// looks for: a wrapper passes every one on, so nothing the pool does
// changes but the commit.
type fullConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
	driver.SessionResetter
	driver.Validator
	driver.NamedValueChecker
}

type conn struct{ fullConn }

func (c conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	tx, err := c.fullConn.BeginTx(ctx, opts)
	if err != nil || ctx.Done() == nil {
		return tx, err
	}
	return boundedTx{Tx: tx, conn: c.fullConn, ctx: ctx}, nil
}

// boundedTx commits under ctx; it rolls back as the driver does (the
// database/sql pool rolls back when the context ends, on a connection it
// then discards).
type boundedTx struct {
	driver.Tx
	conn fullConn
	ctx  context.Context
}

func (t boundedTx) Commit() error {
	_, err := t.conn.ExecContext(t.ctx, "COMMIT", nil)
	return err
}
