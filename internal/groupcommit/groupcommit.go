// Package groupcommit records reservations with group commit: concurrent
// callers queue theirs (an order's row with its lines, or one raw
// reservation of the token API), and whichever caller finds no write in
// progress takes up to maxBatch queued requests (oldest first) and writes
// them in one transaction: the batch's records (its orders' rows) in one
// multi-row INSERT per table, then the arbiter's one conditional UPDATE per
// SKU for the batch's total and the reservation rows. A caller returns once
// its own request is committed or refused, so a 201 still means the
// reservation is durable and arbitrated; under load one commit serves many.
// The writers' own connections (internal/prepconn) belong to it.
//
// The transaction's statements go straight to the connection
// (internal/rawtx, arbiter.OnConn), past GORM: they are written out
// already, and GORM's statement building and callbacks around each (a
// 160-placeholder INSERT scanned again for its values) were most of the
// commit's CPU. rawtx keeps what GORM gave it: BEGIN and COMMIT on the
// same ConnPool (the breaker's guard and counts, a writer's prepared
// statements), GORM's error translation, and the statement counters
// (rawtx.Observe).
package groupcommit

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/batchq"
	"github.com/acme/inventory/internal/breaker"
	"github.com/acme/inventory/internal/prepconn"
	"github.com/acme/inventory/internal/rawtx"
)

// maxBatch bounds the reservations one transaction writes.
const maxBatch = 64

// writers is how many group commits may be in flight at once. A commit is
// mostly waiting (a round trip per statement, then the log flush), so a
// second one fills that wait: the next batch writes its rows while the first
// holds the hot SKU row, and takes that row when the first commits (the SKU
// update comes last for that reason). More than two queue on the hot row
// and split the batches smaller: make bench's seckill selling phase sold
// most with two (docs/benchmarks.md, "two group commits in flight").
const writers = 2

// maxQueued bounds the reservations waiting for a group commit: past it a
// request is refused at once (503) rather than pile up behind a database
// that is not keeping up.
const maxQueued = 16 * maxBatch

// Writer is the group commit. When a batch
// does not fit (a SKU cannot cover the total, a duplicate), each request is
// written alone so each caller gets its own answer. Up to writers batches
// are written at once. No goroutine runs between calls: the callers take
// turns through internal/batchq's queue.
//
// Deadlines: a caller whose context ends while its request is still queued
// leaves the queue (nothing was written); a batch is written under the
// earliest deadline of its callers, and a request with less time left than a
// commit takes is not taken into one. When the commit itself gets no
// answer in time, the outcome is unknown: the caller is told so
// (ErrUnknownOutcome) and must not undo its admission, since the rows may
// exist.
type Writer struct {
	db *gorm.DB
	q  *batchq.Queue[*Request]

	mu     sync.Mutex
	idle   []*writerDB // the writers' own connections not in use (see writerDB)
	own    []*writerDB // all of them
	closed bool

	// limits are the SKUs' per-user limits as the writers last read them:
	// a batch's UPDATE checks the one it counted under instead of reading
	// it (arbiter.LimitCache).
	limits *arbiter.LimitCache

	stats CommitStats
}

// CommitStats counts the group commits of reservations: transactions,
// the requests they carried, and the time spent writing them (their sum over
// concurrent commits), so requests/commits is the mean batch and
// nanos/commits the mean commit.
type CommitStats struct {
	Commits, Requests, Nanos atomic.Int64
}

// Request is one reservation to record, and once written the database's
// answer.
type Request struct {
	// Records are written in the batch's transaction before the
	// reservations: an order's row, its Idempotency-Key's. The records of
	// one table in a batch go in one multi-row INSERT, in the batch's
	// order.
	Records []*Record
	// Rows are the reservations; Buyer ("" for none) is whose per-user
	// limit they count against.
	Rows  []arbiter.Reservation
	Buyer string
	// Lean records the rows as the lean sale does (arbiter.Hold.Lean): one
	// row of holds each, their line its index in Rows.
	Lean bool

	fences  map[string]arbiter.Fence
	err     error
	unknown bool // the commit was sent and not answered: the rows may exist
}

// ErrUnknownOutcome is a write whose commit the database did not confirm
// before the deadline: the rows may exist (an order then pays or expires as
// any other; a retry with the same Idempotency-Key or token finds it).
var ErrUnknownOutcome = fmt.Errorf("%w: the database did not confirm the write in time; it may have been recorded (retry with the same Idempotency-Key or token)", inventory.ErrUnavailable)

var (
	errQueueFull = fmt.Errorf("%w: too many reservations are waiting for the database; retry later", inventory.ErrUnavailable)
	errTooLate   = fmt.Errorf("%w: the database did not take the reservation before the deadline; retry later", inventory.ErrUnavailable)
)

// queueConfig is the group commit's queue (internal/batchq): up to writers
// batches of up to maxBatch requests in flight, at most maxQueued waiting.
func queueConfig() batchq.Config {
	return batchq.Config{Flights: writers, MaxBatch: maxBatch, MaxQueued: maxQueued, MaxLeftNeeded: maxMinLeft,
		Full: errQueueFull, Late: errTooLate}
}

// Record is one row written with a batch (see Request.Records).
type Record struct {
	Table   string
	Columns []string
	Values  []any
}

// New is the group commit on db. On MySQL and MariaDB its writers have
// connections of their own (see writerDB); Close closes them.
func New(db *gorm.DB) *Writer {
	b := &Writer{db: db, limits: arbiter.NewLimitCache(limitsKept)}
	b.q = batchq.New(queueConfig(), b.writeBatch)
	if db == nil || db.Dialector == nil || db.Dialector.Name() != "mysql" {
		return b // SQLite (make run): its one connection, as text
	}
	sqlDB, err := db.DB()
	if err != nil {
		return b // no *sql.DB beneath: the pool's transactions, as text
	}
	for range writers {
		c := prepconn.New(sqlDB, prepconn.Config{})
		var pool gorm.ConnPool = c.ConnPool()
		if g, ok := db.Statement.ConnPool.(breaker.GuardedPool); ok {
			pool = g.On(breaker.BeginFunc(func(ctx context.Context, opts *sql.TxOptions) (breaker.Tx, error) {
				tx, err := c.BeginTx(ctx, opts)
				if err != nil {
					return nil, err
				}
				return tx, nil
			}))
		}
		w := &writerDB{conn: c, db: db.Session(&gorm.Session{NewDB: true, Context: context.Background()})}
		w.db.Statement.ConnPool = pool
		b.own = append(b.own, w)
	}
	b.idle = slices.Clone(b.own)
	return b
}

// writerDB is a connection of a writer's own (MySQL and MariaDB): its
// transactions send the sale's statements as server-side prepared
// statements, each prepared once on it and reused by later batches, so the
// server does not parse the same multi-row INSERTs again for every commit
// (internal/prepconn: at most 320 statements and 65,536 placeholders each,
// ~37 MB of the server's memory, least recently used first out). Only the
// writers hold them, so the server holds at most 2 × 320 statements, not a
// copy of each on every connection of the pool. Through the breaker's pool
// (db's, when it is one) its BEGIN, statements and COMMIT are guarded and
// counted as any, and COMMIT goes under the batch's deadline in one round
// trip. The writers' two connections are the pool's: 62 remain for the
// rest of the service.
type writerDB struct {
	conn *prepconn.Conn
	db   *gorm.DB
}

// Close closes the writers' own connections (the statements prepared on
// them); call it after the last request, before closing the database.
// Later batches use the pool; a writer in flight closes its own when it is
// done.
func (b *Writer) Close() error {
	b.mu.Lock()
	b.closed = true
	idle := b.idle
	b.idle = nil
	b.mu.Unlock()
	var errs []error
	for _, w := range idle {
		errs = append(errs, w.conn.Close())
	}
	return errors.Join(errs...)
}

// PreparedStats sums what the group commit's own connections prepared and
// executed (nothing on SQLite).
func (b *Writer) PreparedStats() prepconn.Stats {
	var sum prepconn.Stats
	for _, w := range b.own {
		sum = sum.Add(w.conn.Stats())
	}
	return sum
}

// Stats counts this node's group commits.
func (b *Writer) Stats() *CommitStats { return &b.stats }

// Write records req and returns when that is committed, refused, or can no
// longer be written before ctx's deadline (see batcher). Errors wrapping
// inventory.ErrUnavailable mean nothing was written, except ErrUnknownOutcome.
func (b *Writer) Write(ctx context.Context, req *Request) (map[string]arbiter.Fence, error) {
	if err := b.q.Do(ctx, req); err != nil {
		return nil, err
	}
	if req.unknown {
		return nil, fmt.Errorf("%w (%v)", ErrUnknownOutcome, req.err)
	}
	return req.fences, req.err
}

// writeBatch writes a batch the queue took, under ctx (its earliest
// deadline), on a writer's own connection if one is free (nil: the
// pool's), and reports whether its transaction committed.
func (b *Writer) writeBatch(ctx context.Context, batch []*Request) bool {
	b.mu.Lock()
	var w *writerDB
	if n := len(b.idle); n > 0 {
		w, b.idle = b.idle[n-1], b.idle[:n-1]
	}
	b.mu.Unlock()
	start := time.Now()
	ok := b.flush(ctx, w, batch)
	b.stats.Commits.Add(1)
	b.stats.Requests.Add(int64(len(batch)))
	b.stats.Nanos.Add(int64(time.Since(start)))
	if w != nil {
		b.mu.Lock()
		if b.closed {
			_ = w.conn.Close()
		} else {
			b.idle = append(b.idle, w)
		}
		b.mu.Unlock()
	}
	return ok
}

// limitsKept is how many SKUs' per-user limits the writers keep (the
// SKUs bought most recently; one another's read again costs a statement).
const limitsKept = 100_000

// maxMinLeft caps the time left a request needs to be taken into a batch,
// so a request that arrives with most of its deadline left is always taken
// however slow recent commits were: shedding what cannot be written in
// time never turns into shedding everything.
const maxMinLeft = 100 * time.Millisecond

// flush writes batch in one transaction under ctx, on w's connection (nil:
// the pool's); if the database refused it, each request alone. It reports
// whether the batch's transaction committed.
func (b *Writer) flush(ctx context.Context, w *writerDB, batch []*Request) bool {
	fences, unknown, err := b.commit(ctx, w, batch)
	// Only an answer of the database (a SKU that cannot cover the batch's
	// total, a duplicate, a deadlock) is worth a retry request by request;
	// a database out of reach or out of time would not answer those either.
	if err == nil || unknown || breaker.Unreachable(err) || len(batch) == 1 && !arbiter.Retryable(err) {
		for _, r := range batch {
			r.fences, r.err, r.unknown = fences, err, unknown
		}
		return err == nil
	}
	for _, r := range batch {
		r.fences, r.err = arbiter.RetryDeadlock(ctx, func() (map[string]arbiter.Fence, error) {
			fences, unknown, err := b.commit(ctx, w, []*Request{r})
			r.unknown = unknown
			return fences, err
		})
	}
	return false
}

// commit writes batch in one transaction. unknown reports a commit that
// was sent and not answered.
func (b *Writer) commit(ctx context.Context, w *writerDB, batch []*Request) (fences map[string]arbiter.Fence, unknown bool, err error) {
	wrote := false
	db := b.db
	if w != nil {
		db = w.db
	}
	lost := false
	err = rawtx.Run(ctx, db, func(tx *rawtx.Tx) error {
		var err error
		fences, err = writeTx(tx, batch, b.limits)
		wrote = err == nil
		if wrote && loseCommit() {
			lost = true
			return errLost
		}
		return err
	})
	if lost {
		return fences, false, nil
	}
	return fences, err != nil && wrote, err
}

// writeTx inserts the batch's records (one multi-row INSERT per table),
// then has the arbiter record the reservations (each counting against its
// buyer, under the limits known), every statement sent on tx past GORM.
func writeTx(tx *rawtx.Tx, batch []*Request, known *arbiter.LimitCache) (map[string]arbiter.Fence, error) {
	a := arbiter.OnConn(tx.Context(), tx, tx.Dialect()).WithLimits(known)
	var tables []*Record // per table, the batch's records as one
	var holds []arbiter.Hold
	for _, r := range batch {
		for _, rec := range r.Records {
			i := slices.IndexFunc(tables, func(t *Record) bool { return t.Table == rec.Table })
			if i < 0 {
				i = len(tables)
				tables = append(tables, &Record{Table: rec.Table, Columns: rec.Columns})
			}
			tables[i].Values = append(tables[i].Values, rec.Values...)
		}
		for line, row := range r.Rows {
			holds = append(holds, arbiter.Hold{Row: row, Buyer: r.Buyer, Lean: r.Lean, Line: line})
		}
	}
	for _, t := range tables {
		if err := a.InsertRows(t.Table, t.Columns, t.Values); err != nil {
			return nil, err
		}
	}
	return a.Reserve(holds)
}
