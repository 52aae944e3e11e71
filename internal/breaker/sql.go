package breaker

import (
	"context"
	"database/sql"

	"gorm.io/gorm"
)

// ConnPool is db as GORM's connection pool, every statement, BEGIN and
// COMMIT under b (gorm's mysql dialector takes it as Config.Conn). A
// transaction begun before the breaker opened still commits or rolls back:
// only new statements are refused.
//
// A transaction commits under the context it began with: database/sql sends
// COMMIT without watching any context (the MySQL driver watches a context
// only around statements), so a COMMIT sent into a partition would wait for
// the driver's read timeout, far past the request's deadline. The pool sends
// COMMIT as a statement under that context instead, then ends the
// database/sql transaction (an empty COMMIT: one more round trip per
// transaction, the price of the bound).
func (b *Breaker) ConnPool(db *sql.DB) gorm.ConnPool {
	return &pool{statements: statements{conn: db, b: b}, db: db}
}

// Tx is a transaction the breaker guards besides *sql.Tx: one that a
// Beginner begins on a connection of its own (internal/prepconn). If it
// has CommitContext(ctx) error, that sends COMMIT under the context (one
// round trip), instead of a COMMIT statement and an empty Commit.
type Tx interface {
	conn
	Commit() error
	Rollback() error
}

// Beginner begins the transactions of a ConnPool returned by On.
type Beginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (Tx, error)
}

// BeginFunc is a function as a Beginner.
type BeginFunc func(ctx context.Context, opts *sql.TxOptions) (Tx, error)

func (f BeginFunc) BeginTx(ctx context.Context, opts *sql.TxOptions) (Tx, error) { return f(ctx, opts) }

// GuardedPool is a ConnPool of a breaker's (ConnPool's).
type GuardedPool interface {
	gorm.ConnPool
	// On returns a ConnPool under the same breaker whose transactions
	// begin with begin instead of on the pool: BEGIN, every statement
	// and COMMIT still guarded and counted.
	On(begin Beginner) gorm.ConnPool
}

func (p *pool) On(begin Beginner) gorm.ConnPool {
	return &pool{statements: p.statements, db: p.db, begin: begin}
}

// conn is what *sql.DB and *sql.Tx both run statements with.
type conn interface {
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// statements runs conn's statements under b: the pool's and a
// transaction's alike.
type statements struct {
	conn conn
	b    *Breaker
}

func (s statements) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	return guard(ctx, s.b, func() (*sql.Stmt, error) { return s.conn.PrepareContext(ctx, query) })
}

func (s statements) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return guard(ctx, s.b, func() (sql.Result, error) { return s.conn.ExecContext(ctx, query, args...) })
}

func (s statements) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return guard(ctx, s.b, func() (*sql.Rows, error) { return s.conn.QueryContext(ctx, query, args...) })
}

// QueryRowContext cannot be refused (a *sql.Row carries no error of ours);
// its outcome is counted.
func (s statements) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	row := s.conn.QueryRowContext(ctx, query, args...)
	record(s.b, row.Err())
	return row
}

type pool struct {
	statements
	db    *sql.DB
	begin Beginner // nil: transactions begin on db
}

// GetDBConn is how gorm.DB.DB() finds the *sql.DB beneath.
func (p *pool) GetDBConn() (*sql.DB, error) { return p.db, nil }

// BeginTx satisfies gorm.ConnPoolBeginner, so statements inside a
// transaction are guarded too.
func (p *pool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	t, err := guard(ctx, p.b, func() (Tx, error) {
		if p.begin != nil {
			return p.begin.BeginTx(ctx, opts)
		}
		return p.db.BeginTx(ctx, opts)
	})
	if err != nil {
		return nil, err
	}
	return &tx{statements: statements{conn: t, b: p.b}, tx: t, ctx: ctx}, nil
}

type tx struct {
	statements
	tx  Tx
	ctx context.Context // the transaction's, from BeginTx
}

// contextCommitter is a Tx that sends COMMIT under a context itself.
type contextCommitter interface {
	CommitContext(ctx context.Context) error
}

// Commit is never refused: a transaction that got this far finishes (its
// outcome still counts). It ends with the transaction's context (see
// ConnPool).
func (t *tx) Commit() error {
	if c, ok := t.tx.(contextCommitter); ok {
		err := c.CommitContext(t.ctx)
		record(t.b, err)
		return err
	}
	_, err := t.tx.ExecContext(t.ctx, "COMMIT")
	record(t.b, err)
	if err != nil {
		_ = t.tx.Rollback()
		return err
	}
	// Committed. Ending database/sql's transaction can still fail (the
	// context ended just now); that changes nothing on the server.
	_ = t.tx.Commit()
	return nil
}

func (t *tx) Rollback() error { return t.tx.Rollback() }

// record counts the outcome of a call that was made without asking (an
// open breaker learns nothing from it).
func record(b *Breaker, err error) {
	if done, aerr := b.Allow(context.Background()); aerr == nil {
		done(err)
	}
}

// guard runs call under b.
func guard[T any](ctx context.Context, b *Breaker, call func() (T, error)) (T, error) {
	var out T
	err := b.Do(ctx, func() error {
		var err error
		out, err = call()
		return err
	})
	return out, err
}
