package job_test

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/job"
	"github.com/acme/inventory/internal/lock"
	"github.com/acme/inventory/testkit/testenv"
)

func TestBackoffDoublesWithinJitter(t *testing.T) {
	b := job.Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	ms := time.Millisecond
	for i, top := range []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, time.Second, time.Second} {
		d := b.Next()
		require.GreaterOrEqual(t, d, top/2, "failure %d", i+1)
		require.LessOrEqual(t, d, top, "failure %d", i+1)
	}
	b.Reset()
	d := b.Next()
	require.GreaterOrEqual(t, d, 50*time.Millisecond)
	require.LessOrEqual(t, d, 100*time.Millisecond, "a success starts again at Min")
	require.Zero(t, job.Jitter(0))
}

func TestRunnerStopBeforeStartAndTwice(t *testing.T) {
	var r job.Runner
	r.Stop() // before Start
	var runs atomic.Int32
	loop := func(ctx context.Context) { runs.Add(1); <-ctx.Done() }
	r.Start(context.Background(), loop)
	r.Start(context.Background(), loop) // no second set
	r.Stop()
	r.Stop()
	require.EqualValues(t, 1, runs.Load())
}

// Three nodes run one periodic job: no two rounds start within one interval
// of each other, whichever node runs them.
func TestPeriodicRunsOneRoundPerInterval(t *testing.T) {
	locker := lock.NewLocker(testenv.Redis(t))
	const interval = 150 * time.Millisecond
	var mu sync.Mutex
	var starts []time.Time // when each round's lock was taken
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := job.Lock{Locker: locker, Key: "job-test:periodic", TTL: time.Second, Log: slog.Default()}
			job.Periodic(ctx, l, interval, 0, func(rctx context.Context) {
				mu.Lock()
				starts = append(starts, job.Taken(rctx))
				enough := len(starts) >= 6
				mu.Unlock()
				if enough {
					cancel()
				}
			})
		}()
	}
	wg.Wait()
	require.GreaterOrEqual(t, len(starts), 6)
	for i := 1; i < len(starts); i++ {
		// Redis keeps expiries in whole milliseconds: 1 ms of slack.
		require.GreaterOrEqual(t, starts[i].Sub(starts[i-1]), interval-time.Millisecond,
			"rounds %d and %d took the lock within one interval", i, i+1)
	}
}

// Three nodes lead in turn: never two leaders at once, and when the leader
// stops, another takes over.
func TestLeadOneLeaderAndTakeover(t *testing.T) {
	locker := lock.NewLocker(testenv.Redis(t))
	var active, maxActive, leaderships atomic.Int32
	// A TTL no stall of a loaded machine outlasts: the takeover is signalled
	// by the leader's release, not by expiry.
	l := job.Lock{Locker: locker, Key: "job-test:lead", TTL: 5 * time.Second, Log: slog.Default()}
	took := make(chan int, 16)
	stops := make([]context.CancelFunc, 3)
	var wg sync.WaitGroup
	for i := range stops {
		ctx, cancel := context.WithCancel(context.Background())
		stops[i] = cancel
		wg.Add(1)
		go func() {
			defer wg.Done()
			job.Lead(ctx, l, func(lctx context.Context) {
				n := active.Add(1)
				for m := maxActive.Load(); n > m && !maxActive.CompareAndSwap(m, n); m = maxActive.Load() {
				}
				leaderships.Add(1)
				took <- i
				<-lctx.Done() // lead until this node stops (or loses the lock)
				active.Add(-1)
			})
		}()
	}
	next := func() int {
		t.Helper()
		select {
		case i := <-took:
			return i
		case <-time.After(time.Minute):
			t.Fatal("no node took the lead")
			return -1
		}
	}
	first := next()
	stops[first]()
	second := next()
	require.NotEqual(t, first, second, "another node takes over")
	for _, stop := range stops {
		stop()
	}
	wg.Wait()
	require.EqualValues(t, 1, maxActive.Load(), "never two leaders at once")
}
