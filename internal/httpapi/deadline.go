package httpapi

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
)

// deadline gives every request a deadline of d. Its context tells the
// deadline at once (Deadline), but the timer that closes Done is made only
// when something asks for Done or Err, as every call to Redis or the
// database does: a request answered from memory (a sold-out flag, a buy
// before a campaign's opening, a countdown) never does, and a timer per
// request was the largest part of such an answer's cost in the server
// (context.WithTimeout and its cancel: 3 µs of 51 in make bench's
// openings).
func deadline(d time.Duration) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			ctx := newLazyDeadline(c.Request().Context(), time.Now().Add(d))
			defer ctx.stop()
			c.SetRequest(c.Request().WithContext(ctx))
			return next(c)
		}
	}
}

// lazyDeadline is a context with a deadline whose timer is made on first
// need (see deadline). Until then it is its parent with a deadline; after,
// it is the timed context, so a context derived from it registers with
// that context as with any context.WithDeadline (no goroutine per child).
type lazyDeadline struct {
	context.Context           // the parent
	at              time.Time // the deadline (no later than the parent's)
	timed           atomic.Pointer[timed]
}

type timed struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// stopped stands for the timed context of a request that ended before
// anything needed one: canceled, as a context.WithTimeout's is after its
// cancel.
var stopped = func() *timed {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return &timed{ctx: ctx, cancel: cancel}
}()

func newLazyDeadline(parent context.Context, at time.Time) *lazyDeadline {
	if d, ok := parent.Deadline(); ok && d.Before(at) {
		at = d
	}
	return &lazyDeadline{Context: parent, at: at}
}

func (l *lazyDeadline) Deadline() (time.Time, bool) { return l.at, true }

// materialized is the timed context, made now if it is not yet.
func (l *lazyDeadline) materialized() *timed {
	if t := l.timed.Load(); t != nil {
		return t
	}
	ctx, cancel := context.WithDeadline(l.Context, l.at)
	t := &timed{ctx: ctx, cancel: cancel}
	if !l.timed.CompareAndSwap(nil, t) {
		cancel() // another goroutine made it first (or the request ended)
		return l.timed.Load()
	}
	return t
}

func (l *lazyDeadline) Done() <-chan struct{} { return l.materialized().ctx.Done() }

func (l *lazyDeadline) Err() error { return l.materialized().ctx.Err() }

// Value is the timed context's once it is made (so context.WithCancel
// finds it as its parent cancelCtx), the parent's otherwise: they hold the
// same values.
func (l *lazyDeadline) Value(key any) any {
	if t := l.timed.Load(); t != nil && t != stopped {
		return t.ctx.Value(key)
	}
	return l.Context.Value(key)
}

// stop ends the request's context: the timed context is canceled if it
// was made, and one asked for later is canceled already.
func (l *lazyDeadline) stop() {
	if !l.timed.CompareAndSwap(nil, stopped) {
		l.timed.Load().cancel()
	}
}
