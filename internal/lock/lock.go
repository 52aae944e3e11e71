// Package lock is the fleet's distributed lock: token-owned Redis locks that
// only their holder can release or extend, that expire when the holder
// dies, that a long job renews while it runs, and whose waits are bounded.
// The cold init of a SKU (package stock) and every one-node job
// (internal/job) take theirs here.
package lock

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"
)

var (
	// ErrNotObtained: another holder has the lock and the wait ran out.
	ErrNotObtained = errors.New("lock: not obtained")
	// ErrNotHeld: the lock expired or belongs to someone else now.
	ErrNotHeld = errors.New("lock: not held")
)

// Locker hands out token-owned Redis locks (bsm/redislock): acquired with SET
// NX PX under a random token, released by compare-and-delete and renewed by
// compare-and-expire, so only the holder can release or extend a lock, and a
// dead holder's lock expires on its own.
type Locker struct {
	c *redislock.Client
}

func NewLocker(rdb redis.UniversalClient) *Locker {
	return &Locker{c: redislock.New(rdb)}
}

// jitter waits a random time in [min, max) between attempts, so waiters on
// one lock do not retry in step.
type jitter struct{ min, max time.Duration }

func (j jitter) NextBackoff() time.Duration {
	return j.min + rand.N(j.max-j.min)
}

// Obtain takes key for ttl, retrying with jittered backoff for at most wait
// (0: one attempt). It returns ErrNotObtained when the wait runs out.
func (l *Locker) Obtain(ctx context.Context, key string, ttl, wait time.Duration) (*Lock, error) {
	opt := &redislock.Options{RetryStrategy: redislock.NoRetry()}
	bound := time.Second // a single attempt still gets a deadline
	if wait > 0 {
		opt.RetryStrategy = jitter{min: 5 * time.Millisecond, max: 25 * time.Millisecond}
		bound = wait
	}
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	lk, err := l.c.Obtain(wctx, key, ttl, opt)
	switch {
	case err == nil:
		return &Lock{l: lk}, nil
	case errors.Is(err, redislock.ErrNotObtained),
		ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
		return nil, ErrNotObtained
	default:
		return nil, err
	}
}

// Lock is one held lock.
type Lock struct {
	l *redislock.Lock
}

// Token identifies this holder.
func (k *Lock) Token() string { return k.l.Token() }

// Release deletes the lock if this holder still owns it; ErrNotHeld
// otherwise (it expired, and perhaps someone else holds it now).
func (k *Lock) Release(ctx context.Context) error {
	if err := k.l.Release(ctx); err != nil {
		if errors.Is(err, redislock.ErrLockNotHeld) {
			return ErrNotHeld
		}
		return err
	}
	return nil
}

// Refresh resets the lock's expiry to ttl if this holder still owns it;
// ErrNotHeld otherwise.
func (k *Lock) Refresh(ctx context.Context, ttl time.Duration) error {
	if err := k.l.Refresh(ctx, ttl, nil); err != nil {
		if errors.Is(err, redislock.ErrNotObtained) {
			return ErrNotHeld
		}
		return err
	}
	return nil
}

// KeepAlive renews the lock to ttl every ttl/3 while a long job runs. The
// returned channel is closed when the lock is lost (a renewal found it gone,
// or no renewal succeeded before it would have expired): the job must stop.
// stop ends the renewals and waits for them; it does not release the lock.
func (k *Lock) KeepAlive(ctx context.Context, ttl time.Duration) (lost <-chan struct{}, stop func()) {
	lostCh := make(chan struct{})
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(ttl / 3)
		defer t.Stop()
		lastOK := time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			rctx, rcancel := context.WithTimeout(ctx, ttl/3)
			err := k.Refresh(rctx, ttl)
			rcancel()
			switch {
			case err == nil:
				lastOK = time.Now()
			case errors.Is(err, ErrNotHeld), time.Since(lastOK) >= ttl:
				if ctx.Err() == nil {
					close(lostCh)
				}
				return
			}
		}
	}()
	return lostCh, func() { cancel(); wg.Wait() }
}
