package arbiter

import (
	"context"
	"database/sql"
	"errors"
	"strings"

	"gorm.io/gorm"
)

// Conn is where the arbiter sends a transaction's statements, as
// database/sql has them: a GORM transaction's (In: through GORM, its
// callbacks and error translation seeing each as any statement), or a
// transaction run past GORM (OnConn: internal/rawtx's, the group commit's,
// which translates errors as GORM does and reports its statements to the
// same counters). Reserve and what it calls send through it, so one
// Reserve serves both.
type Conn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// gormConn is a GORM transaction as a Conn: Exec (GORM's raw callback) and
// Raw(...).Rows() (its row callback), under the transaction's context.
type gormConn struct{ tx *gorm.DB }

func (g gormConn) ExecContext(_ context.Context, query string, args ...any) (sql.Result, error) {
	res := g.tx.Exec(query, args...)
	if res.Error != nil {
		return nil, res.Error
	}
	return affected(res.RowsAffected), nil
}

func (g gormConn) QueryContext(_ context.Context, query string, args ...any) (*sql.Rows, error) {
	return g.tx.Raw(query, args...).Rows()
}

// affected is a statement's result as GORM reports it: the rows it changed.
type affected int64

func (affected) LastInsertId() (int64, error) {
	return 0, errors.New("arbiter: no insert id through GORM")
}
func (n affected) RowsAffected() (int64, error) { return int64(n), nil }

// Direct is the arbiter's hot path on a transaction run past GORM: Reserve
// and InsertRows, their statements sent on the Conn under its context.
type Direct struct{ a Arbiter }

// OnConn is the arbiter of the transaction c (internal/rawtx's), its
// statements sent under ctx; dialect is GORM's dialector's name for the
// database ("mysql", "sqlite"), which picks a statement's dialect.
func OnConn(ctx context.Context, c Conn, dialect string) Direct {
	return Direct{Arbiter{c: c, ctx: ctx, dialect: dialect}}
}

// WithLimits has Reserve take the SKUs' per-user limits from c when it
// holds them and keep there those it reads (LimitCache).
func (d Direct) WithLimits(c *LimitCache) Direct { d.a.known = c; return d }

// Reserve is Arbiter.Reserve on the transaction.
func (d Direct) Reserve(holds []Hold) (map[string]Fence, error) { return d.a.Reserve(holds) }

// ProjectBacklog is Arbiter.ProjectBacklog on the transaction: the
// projector's round, whose multi-row INSERTs of hundreds of holds GORM's
// statement builder would scan placeholder by placeholder.
func (d Direct) ProjectBacklog(b Backlog) (Projected, error) { return d.a.ProjectBacklog(b) }

// InsertRows is InsertRows on the transaction.
func (d Direct) InsertRows(table string, cols []string, args []any) error {
	return d.a.insertRows(table, cols, args)
}

// exec sends query and returns the rows it changed.
func (a Arbiter) exec(query string, args ...any) (int64, error) {
	res, err := a.c.ExecContext(a.ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// query sends query and calls scan on each row it returns (none: nothing,
// as GORM's Scan leaves its destination).
func (a Arbiter) query(scan func(*sql.Rows) error, query string, args ...any) error {
	rows, err := a.c.QueryContext(a.ctx, query, args...)
	if err != nil {
		return err
	}
	for rows.Next() {
		if err := scan(rows); err != nil {
			_ = rows.Close()
			return err
		}
	}
	if err := rows.Err(); err != nil {
		_ = rows.Close()
		return err
	}
	return rows.Close()
}

// inList is query with its " IN ?" (the first) written out for n values
// as GORM writes a slice's: " IN (?,?,?)", so the text sent is the one
// GORM sent for it.
func inList(query string, n int) string {
	i := strings.Index(query, " IN ?")
	if i < 0 {
		return query
	}
	var b strings.Builder
	b.Grow(len(query) + 2*n)
	b.WriteString(query[:i])
	b.WriteString(" IN (")
	for k := range n {
		if k > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('?')
	}
	if n == 0 { // GORM's for an empty slice
		b.Reset()
		b.WriteString(query[:i])
		b.WriteString(" IN (NULL")
	}
	b.WriteByte(')')
	b.WriteString(query[i+len(" IN ?"):])
	return b.String()
}

// anys is values as statement arguments.
func anys[T any](values []T, more ...any) []any {
	out := make([]any, 0, len(values)+len(more))
	for _, v := range values {
		out = append(out, v)
	}
	return append(out, more...)
}
