// Package rawtx runs a transaction on a GORM handle's connection pool with
// its statements sent straight to the connection (database/sql's
// ExecContext and QueryContext), past GORM's statement building and
// callbacks: for the hot path (the group commit) and the projector's
// rounds (multi-row INSERTs of hundreds of holds), whose statements are
// written out already and whose arguments need no reflection. The rest of
// the service keeps GORM.
//
// What GORM gave such a transaction is kept: it begins on the handle's
// ConnPool exactly as GORM's Transaction does (so the breaker's pool guards
// and counts BEGIN, every statement and COMMIT, and a writer's own
// connection (internal/prepconn) prepares its statements as before), rolls
// back on an error or a panic, and translates every error of the database
// with the dialector's translator when the handle's TranslateError is set
// (gorm.ErrDuplicatedKey for a duplicate key, as GORM's AddError does). And
// the statements stay visible to whoever watches GORM's: Observe calls a
// function after each statement a Tx sends for a handle (the statement
// counts of the tests and of cmd/benchtable, which count GORM's through its
// callbacks, count these through it too).
package rawtx

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"

	"gorm.io/gorm"
)

// Tx is a transaction run past GORM.
type Tx struct {
	ctx       context.Context
	conn      gorm.ConnPool // the transaction's statements
	dialect   string
	translate gorm.ErrorTranslator // nil: errors as the driver returned them
	key       any                  // the handle's callbacks: what Observe keys on
}

// Run runs fn in a transaction begun on db's ConnPool under ctx, as
// db.WithContext(ctx).Transaction would: committed when fn returns nil,
// rolled back when it returns an error or panics. The error is fn's, or
// BEGIN's or COMMIT's (translated).
func Run(ctx context.Context, db *gorm.DB, fn func(tx *Tx) error) (err error) {
	bctx := ctx // BEGIN's: the transaction's lifetime, as in GORM's Begin
	if db.DefaultTransactionTimeout > 0 {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			bctx, cancel = context.WithTimeout(ctx, db.DefaultTransactionTimeout)
			defer cancel()
		}
	}
	tx, err := begin(ctx, bctx, db)
	if err != nil {
		return err
	}
	panicked := true
	defer func() {
		if panicked || err != nil {
			_ = tx.conn.(gorm.TxCommitter).Rollback()
		}
	}()
	if err = fn(tx); err != nil {
		panicked = false
		return err
	}
	panicked = false
	return tx.fail(tx.conn.(gorm.TxCommitter).Commit())
}

// begin begins a transaction on db's ConnPool under bctx (what
// gorm.DB.Begin does); its statements go under ctx.
func begin(ctx, bctx context.Context, db *gorm.DB) (*Tx, error) {
	t := &Tx{ctx: ctx, dialect: db.Dialector.Name(), key: db.Callback()}
	if db.Config.TranslateError {
		t.translate, _ = db.Dialector.(gorm.ErrorTranslator)
	}
	var err error
	switch b := db.Statement.ConnPool.(type) {
	case gorm.TxBeginner:
		var tx *sql.Tx
		if tx, err = b.BeginTx(bctx, nil); err == nil {
			t.conn = tx
		}
	case gorm.ConnPoolBeginner:
		t.conn, err = b.BeginTx(bctx, nil)
	default:
		err = gorm.ErrInvalidTransaction
	}
	if err != nil {
		return nil, t.fail(err)
	}
	if _, ok := t.conn.(gorm.TxCommitter); !ok {
		return nil, gorm.ErrInvalidTransaction
	}
	return t, nil
}

// Dialect is the handle's dialector's name ("mysql", "sqlite").
func (t *Tx) Dialect() string { return t.dialect }

// Context is the context the transaction began under.
func (t *Tx) Context() context.Context { return t.ctx }

// ExecContext sends query with args in the transaction.
func (t *Tx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	res, err := t.conn.ExecContext(ctx, query, args...)
	err = t.fail(err)
	t.observe(ctx, query, args, err)
	return res, err
}

// QueryContext sends query with args in the transaction; the caller
// closes the rows (Scan reads them and does).
func (t *Tx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	rows, err := t.conn.QueryContext(ctx, query, args...)
	err = t.fail(err)
	t.observe(ctx, query, args, err)
	return rows, err
}

// fail is err as GORM's AddError would leave it.
func (t *Tx) fail(err error) error {
	if err != nil && t.translate != nil {
		return t.translate.Translate(err)
	}
	return err
}

// Statement is one statement a Tx sent, as an observer sees it.
type Statement struct {
	Context context.Context // the statement's
	SQL     string
	Args    []any
	Tx      *Tx   // the transaction it ran in
	Err     error // its error (translated), nil if it succeeded
}

// observers are the functions Observe registered, by the key of their
// handle (its callbacks, which every session of the handle shares);
// copied on write, so a statement reads them without a lock. nil: none
// anywhere (the service's case), one atomic load per statement.
var (
	observersMu sync.Mutex
	observers   atomic.Pointer[map[any][]*observer]
)

type observer struct{ fn func(Statement) }

// Observe calls fn after every statement a Tx sends on db or on any
// session of it (fn may run on many goroutines at once) until the
// returned function is called.
func Observe(db *gorm.DB, fn func(Statement)) (stop func()) {
	key, o := any(db.Callback()), &observer{fn}
	observersMu.Lock()
	defer observersMu.Unlock()
	next := map[any][]*observer{}
	if cur := observers.Load(); cur != nil {
		for k, v := range *cur {
			next[k] = v
		}
	}
	next[key] = append(append([]*observer(nil), next[key]...), o)
	observers.Store(&next)
	return sync.OnceFunc(func() {
		observersMu.Lock()
		defer observersMu.Unlock()
		next := map[any][]*observer{}
		for k, v := range *observers.Load() {
			var keep []*observer
			for _, x := range v {
				if x != o {
					keep = append(keep, x)
				}
			}
			if len(keep) > 0 {
				next[k] = keep
			}
		}
		if len(next) == 0 {
			observers.Store(nil)
			return
		}
		observers.Store(&next)
	})
}

func (t *Tx) observe(ctx context.Context, query string, args []any, err error) {
	m := observers.Load()
	if m == nil {
		return
	}
	for _, o := range (*m)[t.key] {
		o.fn(Statement{Context: ctx, SQL: query, Args: args, Tx: t, Err: err})
	}
}
