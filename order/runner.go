package order

import (
	"context"
	"sync"
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
