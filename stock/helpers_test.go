package stock

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/testenv"
)

// backend is one real Redis deployment the contract suite runs on.
type backend struct {
	name  string
	open  func(t *testing.T) redis.UniversalClient
	flush func(ctx context.Context, rdb redis.UniversalClient) error // "Redis loses every key"
}

// stockRedisDB is this package's database on the shared single-node Redis.
const stockRedisDB = 1

var backends = []backend{
	{
		name: "redis",
		open: func(t *testing.T) redis.UniversalClient { return testenv.Redis(t, stockRedisDB) },
		flush: func(ctx context.Context, rdb redis.UniversalClient) error {
			return rdb.FlushDB(ctx).Err()
		},
	},
	{
		// The embedded default's stand-in runs the same suite.
		name: "miniredis",
		open: func(t *testing.T) redis.UniversalClient {
			m := miniredis.NewMiniRedis()
			m.ClockTTL(true)
			require.NoError(t, m.StartAddr("127.0.0.1:0"))
			t.Cleanup(m.Close)
			c := redis.NewClient(&redis.Options{Addr: m.Addr(), PoolSize: 128})
			t.Cleanup(func() { _ = c.Close() })
			return c
		},
		flush: func(ctx context.Context, rdb redis.UniversalClient) error {
			return rdb.FlushAll(ctx).Err()
		},
	},
	{
		name: "cluster",
		open: func(t *testing.T) redis.UniversalClient { return testenv.RedisCluster(t) },
		flush: func(ctx context.Context, rdb redis.UniversalClient) error {
			return rdb.(*redis.ClusterClient).ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
				return n.FlushAll(ctx).Err()
			})
		},
	},
}

// forEachBackend runs fn once per real Redis deployment.
func forEachBackend(t *testing.T, fn func(t *testing.T, b backend, rdb redis.UniversalClient)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { fn(t, b, b.open(t)) })
	}
}

// fakeDB plays the database behind the init callback: durable stock, the
// unpaid reservations whose order rows are written, and paid-unapplied units.
type fakeDB struct {
	mu      sync.Mutex
	stock   map[string]int64
	rows    map[string]map[string]int64 // sku -> token -> qty
	pending map[string]int64
	calls   atomic.Int64
	delay   time.Duration
}

func newFakeDB(stock map[string]int64) *fakeDB {
	return &fakeDB{stock: stock, rows: map[string]map[string]int64{}, pending: map[string]int64{}}
}

func (f *fakeDB) init(ctx context.Context, sku string) (Snapshot, error) {
	f.calls.Add(1)
	if f.delay > 0 {
		time.Sleep(f.delay)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.stock[sku]
	if !ok {
		return Snapshot{}, ErrUnknownSKU
	}
	snap := Snapshot{Stock: st, Pending: f.pending[sku]}
	for token, q := range f.rows[sku] {
		snap.Holds = append(snap.Holds, Hold{Token: token, Qty: q, Deadline: time.Now().Add(time.Hour)})
	}
	return snap, nil
}

func (f *fakeDB) writeRow(sku, token string, qty int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rows[sku] == nil {
		f.rows[sku] = map[string]int64{}
	}
	f.rows[sku][token] = qty
}

func (f *fakeDB) deleteRow(sku, token string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.rows[sku], token)
}

func (f *fakeDB) rowsOf(sku string) map[string]int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int64{}
	for k, v := range f.rows[sku] {
		out[k] = v
	}
	return out
}

func newStore(t *testing.T, rdb redis.UniversalClient, db *fakeDB) *Store {
	t.Helper()
	s, err := NewStore(rdb, Config{Init: db.init, LockTTL: 2 * time.Second, InitWait: 5 * time.Second})
	require.NoError(t, err)
	return s
}

// levels reads sku's Redis state, initialising it first if Redis lost it.
func levels(t *testing.T, s *Store, sku string) Levels {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, s.ensureInit(ctx, sku))
	lv, err := s.Levels(ctx, sku)
	require.NoError(t, err)
	require.True(t, lv.Initialised)
	return lv
}

func sum(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}
