package batchq

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// item is a caller's request; the test's Send answers it with the batch it
// was sent in.
type item struct {
	id    int
	batch int // which batch answered it (1-based); 0: none
}

// gatedSend sends batches that wait for release while gated: a server that
// has not answered yet.
type gatedSend struct {
	mu      sync.Mutex
	batches [][]int
	gated   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func newGatedSend() *gatedSend {
	return &gatedSend{entered: make(chan struct{}, 64), release: make(chan struct{})}
}

func (g *gatedSend) send(_ context.Context, batch []*item) bool {
	if g.gated.Load() {
		g.entered <- struct{}{}
		<-g.release
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	ids := make([]int, len(batch))
	for i, it := range batch {
		ids[i] = it.id
	}
	g.batches = append(g.batches, ids)
	for _, it := range batch {
		it.batch = len(g.batches)
	}
	return true
}

var errFull, errLate = errors.New("full"), errors.New("late")

func config() Config {
	return Config{Flights: 2, MaxBatch: 8, MaxQueued: 16, MaxLeftNeeded: 50 * time.Millisecond, Full: errFull, Late: errLate}
}

// holdFlights gates g and has Flights callers take every flight.
func holdFlights(t *testing.T, q *Queue[*item], g *gatedSend) *sync.WaitGroup {
	t.Helper()
	g.gated.Store(true)
	var wg sync.WaitGroup
	for i := range q.cfg.Flights {
		wg.Add(1)
		go func() {
			defer wg.Done()
			require.NoError(t, q.Do(context.Background(), &item{id: 1000 + i}))
		}()
		<-g.entered
	}
	return &wg
}

func TestAloneSendsAtOnce(t *testing.T) {
	g := newGatedSend()
	q := New(config(), g.send)
	for i := range 3 {
		it := &item{id: i}
		require.NoError(t, q.Do(context.Background(), it))
		require.Equal(t, i+1, it.batch, "a batch of its own")
	}
	require.Equal(t, [][]int{{0}, {1}, {2}}, g.batches)
}

// While every flight is out, callers queue; the next batches take them
// oldest first, at most MaxBatch each, and each caller is answered once.
func TestQueuedCallersGoInBatchesOldestFirst(t *testing.T) {
	g := newGatedSend()
	q := New(config(), g.send)
	flights := holdFlights(t, q, g)

	const n = 12
	items := make([]*item, n)
	var wg sync.WaitGroup
	for i := range n {
		items[i] = &item{id: i}
		wg.Add(1)
		go func() {
			defer wg.Done()
			require.NoError(t, q.Do(context.Background(), items[i]))
		}()
		require.Eventually(t, func() bool { _, queued := q.Load(); return queued == i+1 }, 10*time.Second, time.Millisecond)
	}
	g.gated.Store(false)
	close(g.release)
	wg.Wait()
	flights.Wait()

	var queuedBatches [][]int // the two after the flights, in either order (they may run at once)
	for _, b := range g.batches {
		if b[0] < 1000 {
			queuedBatches = append(queuedBatches, b)
		}
	}
	slices.SortFunc(queuedBatches, func(a, b []int) int { return a[0] - b[0] })
	require.Equal(t, [][]int{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11}}, queuedBatches,
		"every queued caller sent once, oldest first, at most MaxBatch at a time")
	require.Len(t, g.batches, 4, "the two flights, then 8 and 4")
	for _, it := range items {
		require.NotZero(t, it.batch)
	}
	flying, queued := q.Load()
	require.Zero(t, flying)
	require.Zero(t, queued)
}

func TestFullQueueRefusesAtOnce(t *testing.T) {
	g := newGatedSend()
	q := New(config(), g.send)
	flights := holdFlights(t, q, g)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			require.NoError(t, q.Do(context.Background(), &item{id: i}))
		}()
	}
	require.Eventually(t, func() bool { _, queued := q.Load(); return queued == 16 }, 10*time.Second, time.Millisecond)
	extra := &item{id: 99}
	require.ErrorIs(t, q.Do(context.Background(), extra), errFull)
	require.Zero(t, extra.batch, "never sent")
	g.gated.Store(false)
	close(g.release)
	wg.Wait()
	flights.Wait()
}

// A caller whose context ends while it is queued leaves: Late, never sent.
// Without Config.Late it gets its context's own error.
func TestCallerLeavesTheQueueAtItsDeadline(t *testing.T) {
	for _, late := range []error{errLate, nil} {
		g := newGatedSend()
		cfg := config()
		cfg.Late = late
		q := New(cfg, g.send)
		flights := holdFlights(t, q, g)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		it := &item{id: 7}
		err := q.Do(ctx, it)
		cancel()
		if late != nil {
			require.ErrorIs(t, err, errLate)
		} else {
			require.ErrorIs(t, err, context.DeadlineExceeded)
		}
		_, queued := q.Load()
		require.Zero(t, queued)
		g.gated.Store(false)
		close(g.release)
		flights.Wait()
		require.Zero(t, it.batch, "never sent")
		require.Len(t, g.batches, 2, "only the flights")
	}
}

// Send gets the batch's earliest deadline; an item with less time left
// than a recent batch took is answered Late unsent; however slow recent
// batches were, an item with more than MaxLeftNeeded left is taken.
func TestDeadlinesOfABatch(t *testing.T) {
	q := New(config(), func(context.Context, []*item) bool { return true })
	now := time.Now()
	w := func(id int, d time.Duration) *waiter[*item] {
		wt := &waiter[*item]{item: &item{id: id}, wake: make(chan struct{}, 1)}
		if d != 0 {
			wt.deadline = now.Add(d)
		}
		return wt
	}
	q.SetAverage(10 * time.Millisecond)
	none, soon, later, latest := w(0, 0), w(1, time.Millisecond), w(2, time.Hour), w(3, 2*time.Hour)
	q.queue = []*waiter[*item]{none, soon, later, latest}
	batch, deadline := q.take()
	require.Equal(t, []*waiter[*item]{none, later, latest}, batch)
	require.Equal(t, later.deadline, deadline, "the earliest deadline of what was taken")
	require.True(t, soon.done)
	require.ErrorIs(t, soon.err, errLate)
	require.Empty(t, q.queue)

	q.SetAverage(time.Minute)
	roomy := w(4, 2*q.cfg.MaxLeftNeeded)
	q.queue = []*waiter[*item]{roomy}
	batch, _ = q.take()
	require.Equal(t, []*waiter[*item]{roomy}, batch, "MaxLeftNeeded caps the time needed")

	_, deadline = (&Queue[*item]{cfg: config(), queue: []*waiter[*item]{w(5, 0)}}).take()
	require.True(t, deadline.IsZero(), "no deadline in the batch: none")
}

// Only batches the server answered move the average.
func TestFailedBatchesDoNotMoveTheAverage(t *testing.T) {
	ok := false
	q := New(config(), func(context.Context, []*item) bool { time.Sleep(5 * time.Millisecond); return ok })
	q.SetAverage(time.Hour)
	require.NoError(t, q.Do(context.Background(), &item{}))
	require.Equal(t, time.Hour, q.Average())
	ok = true
	require.NoError(t, q.Do(context.Background(), &item{}))
	require.Less(t, q.Average(), time.Hour)
}

// Many callers at once: each is answered exactly once, by one batch, and
// no batch is larger than MaxBatch or more than Flights run at once.
func TestManyCallers(t *testing.T) {
	var inFlight, most atomic.Int32
	var mu sync.Mutex
	seen := map[int]int{}
	q := New(Config{Flights: 2, MaxBatch: 8, MaxLeftNeeded: time.Millisecond}, func(_ context.Context, batch []*item) bool {
		n := inFlight.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		defer inFlight.Add(-1)
		if len(batch) > 8 {
			panic("batch larger than MaxBatch")
		}
		time.Sleep(100 * time.Microsecond)
		mu.Lock()
		defer mu.Unlock()
		for _, it := range batch {
			seen[it.id]++
			it.batch = 1
		}
		return true
	})
	const callers, each = 64, 50
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				it := &item{id: c*each + i}
				require.NoError(t, q.Do(context.Background(), it))
				require.Equal(t, 1, it.batch)
			}
		}()
	}
	wg.Wait()
	require.Len(t, seen, callers*each)
	counts := slices.Collect(func(yield func(int) bool) {
		for _, n := range seen {
			if !yield(n) {
				return
			}
		}
	})
	require.Equal(t, 1, slices.Max(counts), "each answered exactly once")
	require.LessOrEqual(t, most.Load(), int32(2))
}

// Send's context ends at the batch's deadline, and has none when no item
// has one.
func TestSendRunsUnderTheBatchsDeadline(t *testing.T) {
	var got time.Time
	var has bool
	q := New(config(), func(ctx context.Context, _ []*item) bool { got, has = ctx.Deadline(); return true })
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	want, _ := ctx.Deadline()
	require.NoError(t, q.Do(ctx, &item{}))
	require.True(t, has)
	require.Equal(t, want, got)
	require.NoError(t, q.Do(context.Background(), &item{}))
	require.False(t, has)
}
