package stock

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/acme/inventory/testkit/testenv"
	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// gate holds every pipeline the client sends while it is shut: a Redis that
// has not answered yet, so the test knows which admissions are in flight and
// which are queued.
type gate struct {
	shut    atomic.Bool
	entered chan struct{}
	open    chan struct{}
}

func newGate(rdb redis.UniversalClient) *gate {
	g := &gate{entered: make(chan struct{}, 64), open: make(chan struct{})}
	rdb.AddHook(g)
	return g
}

func (g *gate) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if g.shut.Load() {
			g.entered <- struct{}{}
			<-g.open
		}
		return next(ctx, cmds)
	}
}

// holdFlights shuts g and has maxFlights callers admit one unit of sku each,
// so every flight is taken by a pipeline Redis does not answer until
// release; it returns the channel their answers come on.
func holdFlights(t *testing.T, g *gate, s *Store, sku string) <-chan Result {
	t.Helper()
	g.shut.Store(true)
	answers := make(chan Result, maxFlights)
	for range maxFlights {
		go func() {
			a, err := s.Admit(context.Background(), sku, 1, "")
			answers <- Result{a, err}
		}()
	}
	for range maxFlights {
		select {
		case <-g.entered:
		case <-time.After(10 * time.Second):
			t.Fatal("the flights' pipelines never reached Redis")
		}
	}
	return answers
}

// heldFlights is a fresh Redis with one SKU, HOT, of units, whose every
// flight holds an admission Redis has not answered (holdFlights).
func heldFlights(t *testing.T, b backend, rdb redis.UniversalClient, units int64) (*Store, *gate, <-chan Result) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, b.Flush(ctx, rdb))
	s := newStore(t, rdb, newFakeDB(map[string]int64{"HOT": units}))
	require.NoError(t, s.EnsureInit(ctx, "HOT"))
	g := newGate(rdb)
	return s, g, holdFlights(t, g, s, "HOT")
}

func (g *gate) release() {
	g.shut.Store(false)
	close(g.open)
}

func queued(s *Store) int { return s.admits.queued() }

func TestAdmissionsQueuedMeanwhileGoInOnePipeline(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		s, g, flights := heldFlights(t, b, rdb, 1000)

		// With both flights waiting on Redis, 100 more callers queue.
		const n = 100
		remaining := make([]int64, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var a Admission
				a, errs[i] = s.Admit(ctx, "HOT", 1, "")
				remaining[i] = a.Remaining
			}()
		}
		require.Eventually(t, func() bool { return queued(s) == n }, 10*time.Second, time.Millisecond)
		g.release()
		wg.Wait()
		for range maxFlights {
			r := <-flights
			require.NoError(t, r.Err)
			remaining = append(remaining, r.Remaining)
		}

		for _, err := range errs {
			require.NoError(t, err)
		}
		// Each admission ran the script on its own: every answer is a
		// different level, and together they are the levels after each of
		// the 102 units taken (the flights' pipelines, released at once,
		// may reach Redis before or after the queued callers' one).
		slices.Sort(remaining)
		want := make([]int64, 0, n+maxFlights)
		for left := int64(1000 - maxFlights - n); left < 1000; left++ {
			want = append(want, left)
		}
		require.Equal(t, want, remaining)
		require.EqualValues(t, 1000-maxFlights-n, levels(t, s, "HOT").Available)
		require.EqualValues(t, maxFlights+1, s.Stats().Pipelines.Load(), "the flights' two, then one for the 100 queued")
		require.EqualValues(t, maxFlights+n, s.Stats().Pipelined.Load())
	})
}

func TestAdmissionLeavesTheQueueAtItsDeadline(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, rdb redis.UniversalClient) {
		ctx := context.Background()
		s, g, flights := heldFlights(t, b, rdb, 10)

		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err := s.Admit(short, "HOT", 3, "")
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Zero(t, queued(s), "it left the queue")

		g.release()
		for range maxFlights {
			require.NoError(t, (<-flights).Err)
		}
		require.EqualValues(t, 10-maxFlights, levels(t, s, "HOT").Available, "the admission that left took nothing")
		require.EqualValues(t, maxFlights, s.Stats().Pipelined.Load(), "and was never sent")
	})
}

// A Redis that lost its script cache (a restart, SCRIPT FLUSH) answers a
// pipeline's EVALSHA with NOSCRIPT; each such admission is sent again with
// the script and answers as usual. On a private server: flushing the
// scripts of the shared one would disturb the other packages' tests.
func TestPipelineAfterTheScriptCacheIsFlushed(t *testing.T) {
	m := miniredis.NewMiniRedis()
	require.NoError(t, m.StartAddr("127.0.0.1:0"))
	t.Cleanup(m.Close)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), PoolSize: 64})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	s := newStore(t, rdb, newFakeDB(map[string]int64{"HOT": 100}))
	require.NoError(t, s.EnsureInit(ctx, "HOT"))
	_, err := s.Admit(ctx, "HOT", 1, "")
	require.NoError(t, err)
	require.NoError(t, rdb.ScriptFlush(ctx).Err())

	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Admit(ctx, "HOT", 2, "")
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, 100-1-40, levels(t, s, "HOT").Available)
}

// keyGate holds, while shut, every pipeline that carries a command on key:
// one cluster master that has stopped answering, the others answering.
type keyGate struct {
	gate
	key string
}

func (g *keyGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if g.shut.Load() && slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return slices.Contains(c.Args(), any(g.key)) }) {
			g.entered <- struct{}{}
			<-g.open
		}
		return next(ctx, cmds)
	}
}

// On a Redis Cluster admissions queue per master: with every flight of one
// master's queue held (its node stopped answering), an admission of a SKU
// on another master is sent and answered while they are held, not queued
// behind them.
func TestAdmissionsQueuePerClusterMaster(t *testing.T) {
	rdb := testenv.RedisCluster(t)
	ctx := context.Background()
	master := func(sku string) string {
		m, err := rdb.MasterForKey(ctx, stockKey(sku))
		require.NoError(t, err)
		return m.Options().Addr
	}
	other := "OTHER-0"
	for i := 1; master(other) == master("HOT"); i++ {
		other = fmt.Sprintf("OTHER-%d", i)
	}
	s := newStore(t, rdb, newFakeDB(map[string]int64{"HOT": 100, other: 100}))
	require.NoError(t, s.EnsureInit(ctx, "HOT"))
	require.NoError(t, s.EnsureInit(ctx, other))
	g := &keyGate{gate: gate{entered: make(chan struct{}, 64), open: make(chan struct{})}, key: stockKey("HOT")}
	rdb.AddHook(g)
	held := holdFlights(t, &g.gate, s, "HOT")

	answered := make(chan Result, 1)
	go func() {
		a, err := s.Admit(ctx, other, 1, "")
		answered <- Result{a, err}
	}()
	select {
	case r := <-answered:
		require.NoError(t, r.Err)
		require.Equal(t, int64(99), r.Remaining)
	case <-time.After(30 * time.Second):
		t.Fatalf("the admission of %s (master %s) waited behind the held flights of HOT's master %s", other, master(other), master("HOT"))
	}
	g.release()
	for range maxFlights {
		r := <-held
		require.NoError(t, r.Err)
	}
	require.Equal(t, 0, queued(s))
}
