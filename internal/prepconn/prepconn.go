// Package prepconn is a database connection of a writer's own whose
// transactions send their statements as server-side prepared statements
// (the binary protocol), each prepared once on the connection and reused
// by every later transaction: the server parses a statement's text once
// instead of on every execution. The group commit's writers (order/batch.go)
// each hold one; the rest of the service keeps its pool, whose statements
// the client interpolates (internal/mysqlconn).
//
// Why a connection of its own, and the transaction run by hand on it:
// database/sql prepares a *sql.DB statement on whichever pooled connection
// it grabs first and then again on every connection a transaction of it runs
// on (up to the pool's 64), while a statement prepared on a *sql.Conn is
// prepared again by every Tx.StmtContext. So a Conn holds one *sql.Conn,
// prepares on it, and sends START TRANSACTION, the statements and COMMIT on
// it itself: one round trip for COMMIT, under the transaction's context.
//
// Bounded: a Conn keeps at most Config.MaxStatements statements and at most
// Config.MaxPlaceholders placeholders summed over them, least recently used
// first out; a statement with more than a quarter of that many
// placeholders, or refused by the server's max_prepared_stmt_count, is sent
// as text as before. Statements without arguments are always sent as text.
// The server's memory is what the placeholders bound: MariaDB 10.11 holds
// ~560 bytes per placeholder of a prepared multi-row INSERT (~360 KB for
// 64 rows of 10 columns), ~33 KB per statement besides. The defaults hold
// a seckill group commit's statements at every batch size (its four
// INSERTs at 1 to 64 rows are 256 statements, 62,400 placeholders): at most
// ~37 MB of server memory per Conn. With 16,384 placeholders the seckill
// bench's batches (1 to 64 sales, 16 on average) evicted and prepared again
// 15% of their statements, which costs more than text.
//
// A connection that fails (a reset, a partition, a deadline that ended a
// statement, a commit or rollback that got no answer) is discarded with its
// statements, and the next transaction takes a fresh one from the pool and
// prepares again as it goes. Close closes the statements and gives the
// connection back.
package prepconn

import (
	"container/list"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/go-sql-driver/mysql"
	"gorm.io/gorm"
)

// Defaults of Config.
const (
	DefaultMaxStatements   = 320
	DefaultMaxPlaceholders = 65536
)

// Config bounds a Conn's prepared statements.
type Config struct {
	// MaxStatements is how many statements the connection keeps prepared.
	// Default DefaultMaxStatements.
	MaxStatements int
	// MaxPlaceholders bounds the placeholders summed over the prepared
	// statements (the server's memory for them grows with it). Default
	// DefaultMaxPlaceholders.
	MaxPlaceholders int
}

// Stats counts what a Conn did.
type Stats struct {
	Statements   int // prepared on the connection now
	Placeholders int // summed over them
	// Prepares counts statements prepared (a reconnect prepares again),
	// Executions statements executed by a prepared statement, Texts
	// statements with arguments sent as text, Evictions statements closed to
	// stay within the bounds, Connections connections taken from the pool.
	Prepares, Executions, Texts, Evictions, Connections int64
}

// Add is s and o summed, field by field (what several Conns did).
func (s Stats) Add(o Stats) Stats {
	s.Statements += o.Statements
	s.Placeholders += o.Placeholders
	s.Prepares += o.Prepares
	s.Executions += o.Executions
	s.Texts += o.Texts
	s.Evictions += o.Evictions
	s.Connections += o.Connections
	return s
}

// ErrClosed is a transaction begun on a closed Conn.
var ErrClosed = errors.New("prepconn: connection closed")

var errBusy = errors.New("prepconn: a transaction is already open on this connection")

// Conn is one connection of db held for one writer. Its transactions run
// one at a time.
type Conn struct {
	db  *sql.DB
	cfg Config

	mu           sync.Mutex
	conn         *sql.Conn // nil: none held (not yet, or discarded)
	lru          *list.List
	byText       map[string]*list.Element
	placeholders int
	inTx         bool
	closed       bool

	prepares, executions, texts, evictions, connections atomic.Int64
}

type entry struct {
	text string
	st   *sql.Stmt
	n    int // placeholders
}

// New returns a Conn of db; it takes its connection at the first transaction.
func New(db *sql.DB, cfg Config) *Conn {
	if cfg.MaxStatements <= 0 {
		cfg.MaxStatements = DefaultMaxStatements
	}
	if cfg.MaxPlaceholders <= 0 {
		cfg.MaxPlaceholders = DefaultMaxPlaceholders
	}
	return &Conn{db: db, cfg: cfg, lru: list.New(), byText: map[string]*list.Element{}}
}

// Stats reports what c holds and did.
func (c *Conn) Stats() Stats {
	c.mu.Lock()
	s := Stats{Statements: c.lru.Len(), Placeholders: c.placeholders}
	c.mu.Unlock()
	s.Prepares, s.Executions, s.Texts = c.prepares.Load(), c.executions.Load(), c.texts.Load()
	s.Evictions, s.Connections = c.evictions.Load(), c.connections.Load()
	return s
}

// BeginTx takes the connection (from the pool, if c holds none) and begins
// a transaction on it. opts must ask for nothing but the defaults. A held
// connection that cannot begin (the server closed it while it sat idle,
// or restarted) is replaced once: nothing was done on it.
func (c *Conn) BeginTx(ctx context.Context, opts *sql.TxOptions) (*Tx, error) {
	if opts != nil && (opts.Isolation != sql.LevelDefault || opts.ReadOnly) {
		return nil, errors.New("prepconn: transaction options are not supported")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return nil, ErrClosed
	case c.inTx:
		return nil, errBusy
	}
	for attempt := 0; ; attempt++ {
		held := c.conn != nil
		if !held {
			conn, err := c.db.Conn(ctx)
			if err != nil {
				return nil, err
			}
			c.conn = conn
			c.connections.Add(1)
		}
		_, err := c.conn.ExecContext(ctx, "START TRANSACTION")
		if err == nil {
			c.inTx = true
			return &Tx{c: c, ctx: ctx}, nil
		}
		c.discardLocked()
		if !held || attempt > 0 || ctx.Err() != nil {
			return nil, err
		}
	}
}

// Close closes c's statements and gives its connection back to the pool;
// a transaction under way is not disturbed, and the connection goes back
// when it ends. Later transactions fail with ErrClosed.
func (c *Conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.inTx {
		return nil
	}
	return c.releaseLocked()
}

// releaseLocked closes the statements and gives the connection back.
func (c *Conn) releaseLocked() error {
	c.dropStatementsLocked()
	if c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn = nil
	return err
}

// discardLocked closes the connection rather than give it back to the pool
// (its state on the server is unknown), then forgets its statements.
func (c *Conn) discardLocked() {
	if c.conn != nil {
		// database/sql closes a connection whose use returned ErrBadConn.
		_ = c.conn.Raw(func(any) error { return driver.ErrBadConn })
		c.conn = nil
	}
	c.dropStatementsLocked()
}

func (c *Conn) dropStatementsLocked() {
	for e := c.lru.Front(); e != nil; e = e.Next() {
		_ = e.Value.(*entry).st.Close()
	}
	c.lru.Init()
	clear(c.byText)
	c.placeholders = 0
}

// stmtLocked returns the statement prepared for query (n placeholders),
// preparing it if need be, or nil when query goes as text.
func (c *Conn) stmtLocked(ctx context.Context, query string, n int) (*sql.Stmt, error) {
	if n == 0 || n > c.cfg.MaxPlaceholders/4 {
		return nil, nil
	}
	if e, ok := c.byText[query]; ok {
		c.lru.MoveToFront(e)
		return e.Value.(*entry).st, nil
	}
	st, err := c.conn.PrepareContext(ctx, query)
	if err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1461 { // ER_MAX_PREPARED_STMT_COUNT_REACHED
			return nil, nil
		}
		return nil, err
	}
	c.prepares.Add(1)
	c.byText[query] = c.lru.PushFront(&entry{text: query, st: st, n: n})
	c.placeholders += n
	for c.lru.Len() > 1 && (c.lru.Len() > c.cfg.MaxStatements || c.placeholders > c.cfg.MaxPlaceholders) {
		c.removeLocked(c.lru.Back())
		c.evictions.Add(1)
	}
	return st, nil
}

func (c *Conn) removeLocked(el *list.Element) {
	e := c.lru.Remove(el).(*entry)
	delete(c.byText, e.text)
	c.placeholders -= e.n
	_ = e.st.Close() // COM_STMT_CLOSE: no answer to wait for
}

// forgetLocked drops query's statement when the server says it no longer
// knows it or could not prepare it again after a schema change; the next
// use prepares it afresh.
func (c *Conn) forgetLocked(query string, err error) {
	var me *mysql.MySQLError
	if !errors.As(err, &me) || me.Number != 1243 && me.Number != 1615 { // ER_UNKNOWN_STMT_HANDLER, ER_NEED_REPREPARE
		return
	}
	if el, ok := c.byText[query]; ok {
		c.removeLocked(el)
	}
}

// Tx is a transaction on a Conn: every statement with arguments goes as
// the connection's prepared statement of its text. Its methods are those
// of a *sql.Tx that GORM and internal/breaker use.
type Tx struct {
	c      *Conn
	ctx    context.Context // BeginTx's
	done   bool
	broken bool // a statement failed to reach the server, or its context ended
}

var errTxDone = sql.ErrTxDone

// use runs f with the connection and the statement of query (nil: text),
// noting a failure that leaves the connection unusable.
func (t *Tx) use(ctx context.Context, query string, n int, f func(conn *sql.Conn, st *sql.Stmt) error) error {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.done {
		return errTxDone
	}
	if t.broken || c.conn == nil {
		return driver.ErrBadConn
	}
	st, err := c.stmtLocked(ctx, query, n)
	if err == nil {
		if st != nil {
			c.executions.Add(1)
		} else if n > 0 {
			c.texts.Add(1)
		}
		err = f(c.conn, st)
	}
	if err != nil {
		c.forgetLocked(query, err)
		if lost(err) || ctx.Err() != nil {
			t.broken = true
		}
	}
	return err
}

// lost reports an error after which the connection cannot be trusted.
func lost(err error) bool {
	var me *mysql.MySQLError
	return !errors.As(err, &me) // anything but the server's answer
}

func (t *Tx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	var res sql.Result
	err := t.use(ctx, query, len(args), func(conn *sql.Conn, st *sql.Stmt) (err error) {
		if st != nil {
			res, err = st.ExecContext(ctx, args...)
		} else {
			res, err = conn.ExecContext(ctx, query, args...)
		}
		return err
	})
	return res, err
}

func (t *Tx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	var rows *sql.Rows
	err := t.use(ctx, query, len(args), func(conn *sql.Conn, st *sql.Stmt) (err error) {
		if st != nil {
			rows, err = st.QueryContext(ctx, args...)
		} else {
			rows, err = conn.QueryContext(ctx, query, args...)
		}
		return err
	})
	return rows, err
}

// QueryRowContext cannot report a failure before Scan; a Tx whose
// connection failed finds out at its next statement or at Commit.
func (t *Tx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	var row *sql.Row
	err := t.use(ctx, query, len(args), func(conn *sql.Conn, st *sql.Stmt) error {
		if st != nil {
			row = st.QueryRowContext(ctx, args...)
		} else {
			row = conn.QueryRowContext(ctx, query, args...)
		}
		return row.Err()
	})
	if row == nil {
		// The statement never ran: a Row that carries err needs a query
		// that fails without a round trip.
		row = failedRow(ctx, t.c, err)
	}
	return row
}

// failedRow is a *sql.Row whose Scan returns err.
func failedRow(ctx context.Context, c *Conn, err error) *sql.Row {
	cctx, cancel := context.WithCancelCause(ctx)
	cancel(err)
	return c.db.QueryRowContext(cctx, "SELECT 1")
}

// PrepareContext prepares query on the transaction's connection, apart
// from the cache (the caller closes it).
func (t *Tx) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	var st *sql.Stmt
	err := t.use(ctx, query, 0, func(conn *sql.Conn, _ *sql.Stmt) (err error) {
		st, err = conn.PrepareContext(ctx, query)
		return err
	})
	return st, err
}

// CommitContext sends COMMIT under ctx: one round trip. When it gets no
// answer the connection is discarded (the outcome is unknown; the server
// rolls back a transaction it had not committed when the session ends).
func (t *Tx) CommitContext(ctx context.Context) error {
	return t.end(ctx, "COMMIT")
}

// Commit is CommitContext under the context the transaction began with.
func (t *Tx) Commit() error { return t.CommitContext(t.ctx) }

// Rollback sends ROLLBACK under the transaction's context, or, when that
// context has ended or the connection failed, discards the connection
// instead (the server rolls back when the session ends), as database/sql
// does.
func (t *Tx) Rollback() error {
	if t.ctx.Err() != nil {
		t.c.mu.Lock()
		if !t.done {
			t.broken = true
		}
		t.c.mu.Unlock()
	}
	return t.end(t.ctx, "ROLLBACK")
}

// end ends the transaction with statement (COMMIT or ROLLBACK).
func (t *Tx) end(ctx context.Context, statement string) error {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.done {
		return errTxDone
	}
	t.done = true
	c.inTx = false
	var err error
	if t.broken || c.conn == nil {
		err = driver.ErrBadConn
	} else {
		_, err = c.conn.ExecContext(ctx, statement)
	}
	if err != nil && (statement == "COMMIT" || lost(err) || ctx.Err() != nil) || t.broken {
		c.discardLocked()
	}
	if c.closed {
		_ = c.releaseLocked()
	}
	return err
}

// ConnPool is c as GORM's connection pool (gorm.ConnPool with BeginTx):
// GORM's transactions begin on c; a statement outside one goes to the
// pool, as text.
func (c *Conn) ConnPool() gorm.ConnPool { return pool{c} }

type pool struct{ c *Conn }

func (p pool) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	return p.c.db.PrepareContext(ctx, query)
}

func (p pool) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return p.c.db.ExecContext(ctx, query, args...)
}

func (p pool) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return p.c.db.QueryContext(ctx, query, args...)
}

func (p pool) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return p.c.db.QueryRowContext(ctx, query, args...)
}

func (p pool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	tx, err := p.c.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return tx, nil
}

// GetDBConn is how gorm.DB.DB() finds the *sql.DB beneath.
func (p pool) GetDBConn() (*sql.DB, error) { return p.c.db, nil }
