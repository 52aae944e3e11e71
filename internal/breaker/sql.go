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
func (b *Breaker) ConnPool(db *sql.DB) gorm.ConnPool { return &pool{db: db, b: b} }

type pool struct {
	db *sql.DB
	b  *Breaker
}

// GetDBConn is how gorm.DB.DB() finds the *sql.DB beneath.
func (p *pool) GetDBConn() (*sql.DB, error) { return p.db, nil }

func (p *pool) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	return guard(ctx, p.b, func() (*sql.Stmt, error) { return p.db.PrepareContext(ctx, query) })
}

func (p *pool) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return guard(ctx, p.b, func() (sql.Result, error) { return p.db.ExecContext(ctx, query, args...) })
}

func (p *pool) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return guard(ctx, p.b, func() (*sql.Rows, error) { return p.db.QueryContext(ctx, query, args...) })
}

// QueryRowContext cannot be refused (a *sql.Row carries no error of ours);
// its outcome is counted.
func (p *pool) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	row := p.db.QueryRowContext(ctx, query, args...)
	record(p.b, row.Err())
	return row
}

// BeginTx satisfies gorm.ConnPoolBeginner, so statements inside a
// transaction are guarded too.
func (p *pool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	t, err := guard(ctx, p.b, func() (*sql.Tx, error) { return p.db.BeginTx(ctx, opts) })
	if err != nil {
		return nil, err
	}
	return &tx{tx: t, b: p.b, ctx: ctx}, nil
}

type tx struct {
	tx  *sql.Tx
	b   *Breaker
	ctx context.Context // the transaction's, from BeginTx
}

func (t *tx) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	return guard(ctx, t.b, func() (*sql.Stmt, error) { return t.tx.PrepareContext(ctx, query) })
}

func (t *tx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return guard(ctx, t.b, func() (sql.Result, error) { return t.tx.ExecContext(ctx, query, args...) })
}

func (t *tx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return guard(ctx, t.b, func() (*sql.Rows, error) { return t.tx.QueryContext(ctx, query, args...) })
}

func (t *tx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	row := t.tx.QueryRowContext(ctx, query, args...)
	record(t.b, row.Err())
	return row
}

// Commit is never refused: a transaction that got this far finishes (its
// outcome still counts). It ends with the transaction's context (see
// ConnPool).
func (t *tx) Commit() error {
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
