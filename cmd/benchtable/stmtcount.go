package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/acme/inventory/internal/rawtx"
)

// The statements a phase's requests cause, counted exactly inside the
// service: the campaign group serves the service's handler on a listener
// of its own whose requests carry requestTag in their context (every
// statement the service sends for a request runs under that context or one
// derived from it), and a GORM callback after every statement counts those
// that carry it while a window is open. Statements of the background jobs
// (the outbox relay's polls, the sweeps) carry no tag and are counted
// apart. The group commit sends its statements past GORM
// (internal/rawtx): they are counted through rawtx.Observe, the same way
// (a batch runs under a context of its own, untagged, so among the
// background's); its commits are groupcommit.Writer's stats.

type requestTag struct{}

// tagged reports whether ctx is a counted request's.
func tagged(ctx context.Context) bool { return ctx != nil && ctx.Value(requestTag{}) != nil }

// serveTagged serves h on a new loopback listener, as the service's own
// server does, with every request's context tagged; it returns the base
// URL and what stops it.
func serveTagged(h http.Handler) (string, func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(err)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return context.WithValue(context.Background(), requestTag{}, true) }}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }
}

// stmtCounter counts the statements GORM sends while a window is open.
type stmtCounter struct {
	on       atomic.Bool
	tagged   atomic.Int64 // statements of counted requests
	untagged atomic.Int64 // of anything else (background jobs)
	mu       sync.Mutex
	shapes   map[string]int64 // counted requests' statements by their start
	txs      map[any]struct{} // the distinct transactions they ran in
}

// countStatements registers c's callback on db (after each kind of statement).
func countStatements(db *gorm.DB) *stmtCounter {
	c := &stmtCounter{shapes: map[string]int64{}, txs: map[any]struct{}{}}
	cb := db.Callback()
	const name = "benchtable:count"
	must(cb.Query().After("gorm:query").Register(name, c.observe))
	// Before a default transaction's commit, while the statement still
	// names the transaction it ran in.
	const commit = "gorm:commit_or_rollback_transaction"
	must(cb.Create().After("gorm:create").Before(commit).Register(name, c.observe))
	must(cb.Update().After("gorm:update").Before(commit).Register(name, c.observe))
	must(cb.Delete().After("gorm:delete").Before(commit).Register(name, c.observe))
	must(cb.Raw().After("gorm:raw").Register(name, c.observe))
	must(cb.Row().After("gorm:row").Register(name, c.observe))
	rawtx.Observe(db, func(s rawtx.Statement) { c.count(s.Context, s.SQL, s.Tx) }) // for the process's life, as the callbacks
	return c
}

func (c *stmtCounter) observe(db *gorm.DB) {
	if !c.on.Load() || db.Statement == nil || db.Statement.SQL.Len() == 0 {
		return // nothing was sent (an error before the statement)
	}
	var tx any // the transaction it ran in, if any
	if _, inTx := db.Statement.ConnPool.(gorm.TxCommitter); inTx {
		tx = db.Statement.ConnPool
	}
	c.count(db.Statement.Context, db.Statement.SQL.String(), tx)
}

// count counts a statement sent under ctx, in transaction tx (nil: none).
func (c *stmtCounter) count(ctx context.Context, sql string, tx any) {
	if !c.on.Load() {
		return
	}
	if !tagged(ctx) {
		c.untagged.Add(1)
		return
	}
	c.tagged.Add(1)
	shape := statementShape(sql)
	c.mu.Lock()
	c.shapes[shape]++
	if tx != nil {
		c.txs[tx] = struct{}{}
	}
	c.mu.Unlock()
}

// stmtCount is what a window counted.
type stmtCount struct {
	tagged, untagged int64
	txs              int              // distinct transactions the tagged statements ran in
	shapes           map[string]int64 // tagged statements by shape
}

// window opens a counting window; the function it returns closes it and
// says what it counted.
func (c *stmtCounter) window() func() stmtCount {
	c.mu.Lock()
	c.shapes, c.txs = map[string]int64{}, map[any]struct{}{}
	c.mu.Unlock()
	t0, u0 := c.tagged.Load(), c.untagged.Load()
	c.on.Store(true)
	return func() stmtCount {
		c.on.Store(false)
		c.mu.Lock()
		defer c.mu.Unlock()
		return stmtCount{tagged: c.tagged.Load() - t0, untagged: c.untagged.Load() - u0, txs: len(c.txs), shapes: c.shapes}
	}
}

// statementShape is a statement's verb and table, e.g. "UPDATE `orders`":
// what the table names a statement by.
func statementShape(sql string) string {
	f := strings.Fields(sql)
	if len(f) == 0 {
		return "?"
	}
	verb := strings.ToUpper(f[0])
	for i, w := range f {
		if i+1 < len(f) && (strings.EqualFold(w, "FROM") || strings.EqualFold(w, "UPDATE") || strings.EqualFold(w, "INTO")) {
			return verb + " " + strings.TrimSuffix(f[i+1], ",")
		}
	}
	return verb
}

// describe is the shapes as "2 SELECT `campaigns`, 1 UPDATE `orders`", the
// most frequent first.
func (s stmtCount) describe() string {
	type kv struct {
		k string
		n int64
	}
	var all []kv
	for k, n := range s.shapes {
		all = append(all, kv{k, n})
	}
	slices.SortFunc(all, func(a, b kv) int {
		if a.n != b.n {
			return int(b.n - a.n)
		}
		return strings.Compare(a.k, b.k)
	})
	parts := make([]string, len(all))
	for i, e := range all {
		parts[i] = fmt.Sprintf("%d %s", e.n, e.k)
	}
	return strings.Join(parts, ", ")
}
