package order

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/acme/inventory/stock"
)

// runner is the lifecycle the background services share: start runs the
// loops once (a second start is a no-op), stop cancels them and waits, and
// tolerates a stop before start and a second stop.
type runner struct {
	mu     sync.Mutex
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (r *runner) start(ctx context.Context, loops ...func(context.Context)) {
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

func (r *runner) stop() {
	r.mu.Lock()
	cancel := r.cancel
	r.mu.Unlock()
	if cancel != nil {
		cancel()
		r.wg.Wait()
	}
}

// onOneNode calls round about every interval (jittered), on one node at a
// time across all nodes: the lock key is taken for one interval and not
// released, so one round per interval happens whatever the number of nodes.
// The round's context ends with the interval.
func onOneNode(ctx context.Context, locker *stock.Locker, key string, interval time.Duration, log *slog.Logger, round func(ctx context.Context)) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval/2 + rand.N(interval/2+1)):
		}
		if _, err := locker.Obtain(ctx, key, interval, 0); err != nil {
			if !errors.Is(err, stock.ErrLockNotObtained) && ctx.Err() == nil {
				log.Warn("lock for a periodic job", "key", key, "err", err)
			}
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, interval)
		round(rctx)
		cancel()
	}
}
