// Package job is the one shape of every background loop of the service:
//
//   - Runner starts loops and stops them: a second Start is a no-op, Stop
//     cancels and waits, and tolerates a Stop before Start and a second Stop;
//   - Jitter and Backoff are the one waiting formula: a wait of d is drawn
//     from [d/2, d], and a Backoff doubles d after each failure up to a cap;
//   - two ways to run on one node at a time under a token-owned lock:
//     Periodic (one round per interval, whatever the number of nodes: the
//     timeout sweep, the realign, retention) and Lead (leadership for as
//     long as the lock is renewed: the outbox relay).
//
// While a round or a leadership runs, its lock is renewed; its context ends
// when the lock is lost, so two nodes never run the same job at once for
// longer than a renewal takes to fail.
package job

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/acme/inventory/internal/lock"
)

// Runner runs a component's loops until Stop.
type Runner struct {
	mu     sync.Mutex
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Start runs each loop in its own goroutine with a context Stop cancels;
// a second Start does nothing.
func (r *Runner) Start(ctx context.Context, loops ...func(context.Context)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancel != nil {
		return
	}
	ctx, r.cancel = context.WithCancel(ctx)
	for _, loop := range loops {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			loop(ctx)
		}()
	}
}

// Stop cancels the loops and waits for them; safe before Start and twice.
func (r *Runner) Stop() {
	r.mu.Lock()
	cancel := r.cancel
	r.mu.Unlock()
	if cancel != nil {
		cancel()
		r.wg.Wait()
	}
}

// Jitter is a wait drawn from [d/2, d]: nodes started together spread out.
func Jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d/2 + rand.N(d/2+1)
}

// Backoff is the wait after failures in a row: Jitter of Min, then of twice
// the last, up to Max. The zero value after Reset starts again at Min.
type Backoff struct {
	Min, Max time.Duration
	last     time.Duration
}

// Next is the wait after one more failure.
func (b *Backoff) Next() time.Duration {
	if b.last == 0 {
		b.last = b.Min
	} else {
		b.last = min(2*b.last, b.Max)
	}
	return Jitter(b.last)
}

// Reset forgets the failures (after a success).
func (b *Backoff) Reset() { b.last = 0 }

// Sleep waits d, or less if ctx ends or wake fires (nil: never).
func Sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-wake:
	case <-t.C:
	}
}

// Lock names a one-node lock and how long it lives between renewals.
type Lock struct {
	Locker *lock.Locker
	Key    string
	TTL    time.Duration
	Log    *slog.Logger
}

// obtain takes the lock, or returns nil (another node holds it, or Redis
// failed: logged unless ctx ended).
func (l Lock) obtain(ctx context.Context) *lock.Lock {
	held, err := l.Locker.Obtain(ctx, l.Key, l.TTL, 0)
	if err != nil {
		if !errors.Is(err, lock.ErrNotObtained) && ctx.Err() == nil {
			l.Log.Warn("job: lock", "key", l.Key, "err", err)
		}
		return nil
	}
	return held
}

// hold runs fn under lock, renewed every TTL/3 or so; fn's context ends when
// the lock is lost (or timeout passes, if positive).
func (l Lock) hold(ctx context.Context, held *lock.Lock, timeout time.Duration, fn func(context.Context)) {
	rctx, cancel := context.WithCancel(ctx)
	if timeout > 0 {
		rctx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()
	lost, stop := held.KeepAlive(rctx, l.TTL)
	defer stop()
	go func() {
		select {
		case <-lost:
			if ctx.Err() == nil {
				l.Log.Warn("job: lost the lock; another node takes over", "key", l.Key)
			}
			cancel()
		case <-rctx.Done():
		}
	}()
	fn(rctx)
}

// Periodic calls round about every interval (jittered), at most once per
// interval across all nodes: the node that takes the lock runs one round,
// with the lock renewed while it runs, and then keeps the lock until the
// interval since it took it has passed. The round's context ends after
// timeout (the interval when zero) or when the lock is lost.
func Periodic(ctx context.Context, l Lock, interval, timeout time.Duration, round func(context.Context)) {
	if timeout <= 0 {
		timeout = interval
	}
	for {
		Sleep(ctx, Jitter(interval), nil)
		if ctx.Err() != nil {
			return
		}
		lock := l.obtain(ctx)
		if lock == nil {
			continue
		}
		taken := time.Now()
		l.hold(context.WithValue(ctx, takenKey{}, taken), lock, timeout, round)
		bg := context.WithoutCancel(ctx)
		if rest := interval - time.Since(taken); rest >= time.Millisecond {
			_ = lock.Refresh(bg, rest)
		} else {
			_ = lock.Release(bg)
		}
	}
}

type takenKey struct{}

// Taken is when the lock of the Periodic round running with ctx was taken
// (zero outside a round). The next round, anywhere, takes it no sooner than
// Taken + interval.
func Taken(ctx context.Context) time.Time {
	t, _ := ctx.Value(takenKey{}).(time.Time)
	return t
}

// Lead runs lead on one node at a time for as long as that node keeps the
// lock: the others try again every Jitter(TTL/2). lead's context ends when
// the lock is lost or ctx ends; the lock is released when lead returns.
func Lead(ctx context.Context, l Lock, lead func(context.Context)) {
	for ctx.Err() == nil {
		lock := l.obtain(ctx)
		if lock == nil {
			Sleep(ctx, Jitter(l.TTL/2), nil)
			continue
		}
		l.hold(ctx, lock, 0, lead)
		_ = lock.Release(context.WithoutCancel(ctx))
	}
}
