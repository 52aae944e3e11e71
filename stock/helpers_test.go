package stock

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/testkit/testenv"
)

// backend is one Redis deployment the contract suite runs on.
type backend = testenv.RedisBackend

// forEachBackend runs fn once per Redis deployment (testenv.RedisBackends).
var forEachBackend = testenv.ForEachRedis

// fakeDB plays the database behind the init callback and the arbitration:
// per SKU on_hand, reserved, the change counter seq and the Redis epoch. mu
// is the row lock: the init holds it while Redis is written, as the real one
// holds the SKU's row lock.
type fakeDB struct {
	mu       sync.Mutex
	onHand   map[string]int64
	reserved map[string]int64
	seq      map[string]int64
	epoch    map[string]int64
	// limit is a SKU's per-user limit (absent: none), quotas what each
	// buyer holds against it (buyer_quotas).
	limit  map[string]int64
	quotas map[string]map[string]int64
	calls  atomic.Int64
	delay  time.Duration
	// beforeWrite, if set, runs under the row lock between the read and the
	// Redis write.
	beforeWrite func()
}

func newFakeDB(onHand map[string]int64) *fakeDB {
	return &fakeDB{onHand: onHand, reserved: map[string]int64{}, seq: map[string]int64{}, epoch: map[string]int64{},
		limit: map[string]int64{}, quotas: map[string]map[string]int64{}}
}

func (f *fakeDB) init(ctx context.Context, sku string, write func(inventory.Baseline) error) error {
	f.calls.Add(1)
	if f.delay > 0 {
		time.Sleep(f.delay)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	oh, ok := f.onHand[sku]
	if !ok {
		return inventory.ErrUnknownSKU
	}
	f.epoch[sku] = 1 + rand.Int64N(1<<52)
	lv := inventory.Baseline{Available: oh - f.reserved[sku], Epoch: f.epoch[sku], Seq: f.seq[sku]}
	if oh == inventory.Unlimited {
		lv.Available = inventory.Unlimited
	}
	if f.limit[sku] > 0 {
		lv.Buyers = map[string]int64{}
		for u, q := range f.quotas[sku] {
			if q > 0 {
				lv.Buyers[u] = q
			}
		}
	}
	if f.beforeWrite != nil {
		f.beforeWrite()
	}
	return write(lv)
}

// reserve is the conditional increment of reserved: false when on_hand -
// reserved cannot cover qty. It returns the new seq and the epoch it saw.
func (f *fakeDB) reserve(sku string, qty int64) (seq, epoch int64, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.onHand[sku] != inventory.Unlimited && f.onHand[sku]-f.reserved[sku] < qty {
		return 0, 0, false
	}
	f.reserved[sku] += qty
	f.seq[sku]++
	return f.seq[sku], f.epoch[sku], true
}

// reserveFor is reserve counting qty against user's per-user limit too,
// conditionally on both, as the arbiter's transaction does.
func (f *fakeDB) reserveFor(sku, user string, qty int64) (seq, epoch int64, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.onHand[sku] != inventory.Unlimited && f.onHand[sku]-f.reserved[sku] < qty || f.quotas[sku][user]+qty > f.limit[sku] {
		return 0, 0, false
	}
	if f.quotas[sku] == nil {
		f.quotas[sku] = map[string]int64{}
	}
	f.quotas[sku][user] += qty
	f.reserved[sku] += qty
	f.seq[sku]++
	return f.seq[sku], f.epoch[sku], true
}

// releaseFor gives qty of user's back: reserved and the buyer's count go
// down together; it returns the new seq.
func (f *fakeDB) releaseFor(sku, user string, qty int64) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.quotas[sku][user] -= qty
	f.reserved[sku] -= qty
	f.seq[sku]++
	return f.seq[sku]
}

// counts is what the database counts per buyer of sku (those above zero).
func (f *fakeDB) counts(sku string) map[string]int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int64{}
	for u, q := range f.quotas[sku] {
		if q > 0 {
			out[u] = q
		}
	}
	return out
}

// release gives qty back (reserved goes down) and returns the new seq.
func (f *fakeDB) release(sku string, qty int64) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reserved[sku] -= qty
	f.seq[sku]++
	return f.seq[sku]
}

func (f *fakeDB) available(sku string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.onHand[sku] - f.reserved[sku]
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
	require.NoError(t, s.ensureInit(ctx, sku, modeCold))
	lv, err := s.Levels(ctx, sku)
	require.NoError(t, err)
	require.True(t, lv.Initialised)
	return lv
}

// buy runs the reservation protocol as package order does: Redis admits, the
// database arbitrates; a refusal undoes (and, with realign, realigns); a
// reservation that committed after a re-init is brought into the new value.
func buy(ctx context.Context, s *Store, db *fakeDB, sku string, qty int64, realign bool) (bool, error) {
	adm, err := s.Admit(ctx, sku, qty, "")
	if errors.Is(err, inventory.ErrInsufficientStock) || errors.Is(err, inventory.ErrUnavailable) {
		// Not bought; nothing was taken. Unavailable is what a caller gets
		// when the key keeps vanishing under it (the storm tests): a 503 to
		// retry, not a broken promise.
		return false, nil
	}
	if err != nil {
		return false, err
	}
	latency()
	seq, epoch, ok := db.reserve(sku, qty)
	latency()
	if !ok {
		if err := s.Undo(ctx, sku, qty, adm, ""); err != nil || !realign {
			return false, err
		}
		return false, s.Realign(ctx, sku)
	}
	if epoch != adm.Epoch && adm.Remaining != inventory.Unlimited {
		return true, s.Apply(ctx, inventory.Change{SKU: sku, Delta: -qty, Seq: seq, Epoch: adm.Epoch})
	}
	return true, nil
}

// latency stands for a network round trip between the steps of the protocol,
// so re-inits land in every window between them.
func latency() { time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond) }

// giveBack releases qty in the database, then in Redis.
func giveBack(ctx context.Context, s *Store, db *fakeDB, sku string, qty int64) error {
	seq := db.release(sku, qty)
	latency()
	return s.Apply(ctx, inventory.Change{SKU: sku, Delta: qty, Seq: seq})
}
