package stocksync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/lock"
	"github.com/acme/inventory/mq"
	"github.com/acme/inventory/testkit/testenv"
)

// stores are the real database and Redis (for the relay's lock) a test
// relays on.
type stores struct {
	db     *gorm.DB
	locker *lock.Locker
}

func newStores(t *testing.T) stores {
	return stores{db: testenv.MySQL(t), locker: lock.NewLocker(testenv.Redis(t))}
}

var errBrokerQueueDown = errors.New("injected: the broker refuses this SKU's queue")

// flakyProducer wraps a producer: fail, if set, decides per request whether
// it fails (nothing of it is sent then); pause, if set, is slept before each
// request. It counts requests per key and the most in flight at once.
type flakyProducer struct {
	mq.Producer
	fail  func(msgs []mq.Message) error
	pause func() time.Duration

	mu          sync.Mutex
	requests    map[string]int
	inFlight    int
	maxInFlight int
}

func (p *flakyProducer) Send(ctx context.Context, msgs ...mq.Message) error {
	p.mu.Lock()
	if p.requests == nil {
		p.requests = map[string]int{}
	}
	p.requests[msgs[0].Key]++
	p.inFlight++
	p.maxInFlight = max(p.maxInFlight, p.inFlight)
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.inFlight--
		p.mu.Unlock()
	}()
	if p.pause != nil {
		time.Sleep(p.pause())
	}
	if p.fail != nil {
		if err := p.fail(msgs); err != nil {
			return err
		}
	}
	return p.Producer.Send(ctx, msgs...)
}

func (p *flakyProducer) stats(key string) (requests, maxInFlight int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.requests[key], p.maxInFlight
}

// receiver records, per SKU, the tokens of the messages a consumer of the
// topic received, in the order received.
type receiver struct {
	mu    sync.Mutex
	bySKU map[string][]string
	total int
}

func receive(t *testing.T, m *mq.Memory) *receiver {
	rc := &receiver{bySKU: map[string][]string{}}
	c := m.Consumer(func(_ context.Context, msgs []mq.Message) error {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		for _, msg := range msgs {
			var sm arbiter.StockMessage
			if err := json.Unmarshal(msg.Body, &sm); err != nil {
				return err
			}
			if sm.SKU != msg.Key {
				t.Errorf("message of %s under key %s", sm.SKU, msg.Key)
			}
			rc.bySKU[sm.SKU] = append(rc.bySKU[sm.SKU], sm.Token)
			rc.total++
		}
		return nil
	}, 32, 10*time.Millisecond)
	require.NoError(t, c.Start())
	t.Cleanup(func() { _ = c.Close() })
	return rc
}

func (rc *receiver) of(sku string) []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]string(nil), rc.bySKU[sku]...)
}

func (rc *receiver) waitTotal(t *testing.T, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		return rc.total >= n
	}, 30*time.Second, 5*time.Millisecond, "%d messages received", n)
	time.Sleep(20 * time.Millisecond) // and no more than that
	rc.mu.Lock()
	defer rc.mu.Unlock()
	require.Equal(t, n, rc.total)
}

// outboxRow is an unsent DEDUCT of one unit of sku under token.
func outboxRow(sku, token string) arbiter.OutboxRow {
	return arbiter.OutboxRow{Token: token, SKU: sku, Op: arbiter.OpDeduct, Qty: 1}
}

// tokens lists sku's outbox tokens in id order; sent picks the sent rows
// (true), the unsent ones (false), or all (nil).
func tokens(t *testing.T, db *gorm.DB, sku string, sent *bool) []string {
	t.Helper()
	q := db.Model(&arbiter.OutboxRow{}).Where("sku = ?", sku)
	if sent != nil && *sent {
		q = q.Where("sent_at IS NOT NULL")
	} else if sent != nil {
		q = q.Where("sent_at IS NULL")
	}
	var out []string
	require.NoError(t, q.Order("id").Pluck("token", &out).Error)
	return out
}

var (
	isSent   = new(true)
	isUnsent = new(false)
)

// One SKU's queue refuses its messages: in the same round the other SKUs'
// rows are sent and marked, the failing SKU goes no further than its failed
// run (its later rows do not pass it), and it is held back on its own while
// the other SKUs keep going. Once its queue is back, its rows go out, in
// order, once each.
func TestRelayIsolatesAFailingSKU(t *testing.T) {
	r := newStores(t)
	ctx := context.Background()
	m := mq.NewMemory(4)
	got := receive(t, m)
	var down atomic.Bool
	down.Store(true)
	p := &flakyProducer{Producer: m.Producer(), fail: func(msgs []mq.Message) error {
		var first arbiter.StockMessage
		_ = json.Unmarshal(msgs[0].Body, &first)
		// BAD's first run (rows 0-127) goes out, the second (from 128) fails.
		if down.Load() && first.SKU == "BAD" && first.Token >= "BAD-128" {
			return errBrokerQueueDown
		}
		return nil
	}}
	var rows []arbiter.OutboxRow
	for i := range 200 {
		rows = append(rows, outboxRow("BAD", fmt.Sprintf("BAD-%03d", i)))
		if i%20 == 0 {
			rows = append(rows, outboxRow("A", fmt.Sprintf("A-%03d", i)), outboxRow("C", fmt.Sprintf("C-%03d", i)))
		}
	}
	require.NoError(t, r.db.Create(&rows).Error)
	// A failed SKU waits half to all of Interval before its first retry,
	// by a clock the test moves (however slow the machine, "at once" is at once).
	clock := testenv.NewClock()
	relay := NewRelay(r.db, p, r.locker, RelayConfig{Interval: time.Second, Batch: 500, Now: clock.Now})

	n, err := relay.RelayOnce(ctx)
	require.Equal(t, 128+10+10, n, "A, C and BAD's first run went out")
	require.ErrorIs(t, err, errBrokerQueueDown)
	var serr *SendError
	require.ErrorAs(t, err, &serr)
	require.Equal(t, []string{"BAD"}, serr.SKUs)
	require.Contains(t, err.Error(), "BAD")
	requests, _ := p.stats("BAD")
	require.Equal(t, 2, requests, "BAD's first run, then its failed second one; nothing after it")
	for _, sku := range []string{"A", "C"} {
		require.Empty(t, tokens(t, r.db, sku, isUnsent), sku)
	}
	all := tokens(t, r.db, "BAD", nil)
	require.Equal(t, all[:128], tokens(t, r.db, "BAD", isSent))
	require.Equal(t, all[128:], tokens(t, r.db, "BAD", isUnsent), "the failed run and after stay unsent, in order")

	// BAD is held back: a round that comes at once leaves it alone, and a
	// new row of A goes out without waiting for it.
	require.NoError(t, r.db.Create(new(outboxRow("A", "A-late"))).Error)
	n, err = relay.RelayOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	requests, _ = p.stats("BAD")
	require.Equal(t, 2, requests, "BAD was not tried again at once")
	got.waitTotal(t, 149)
	for _, sku := range []string{"A", "C"} {
		require.Equal(t, tokens(t, r.db, sku, nil), got.of(sku), sku)
	}
	require.Equal(t, all[:128], got.of("BAD"))

	// Its backoff over, BAD is tried again and still fails.
	clock.Advance(time.Second)
	_, err = relay.RelayOnce(ctx)
	require.ErrorIs(t, err, errBrokerQueueDown)
	requests, _ = p.stats("BAD")
	require.Equal(t, 3, requests)
	require.Equal(t, all[128:], tokens(t, r.db, "BAD", isUnsent))

	down.Store(false)
	clock.Advance(2 * time.Second) // its doubled backoff
	n, err = relay.RelayOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 72, n, "BAD's queue is back: the rest of its rows go out")
	require.Empty(t, tokens(t, r.db, "BAD", isUnsent))
	got.waitTotal(t, 221)
	require.Equal(t, all, got.of("BAD"), "BAD's rows arrived in order, once each")
	require.EqualValues(t, 221, relay.Sent.Load())
}

// A SKU that keeps failing with more unsent rows than a batch holds does not
// starve the others: once held back, its rows are left out of the read.
func TestRelayFailingSKUDoesNotStarveOthers(t *testing.T) {
	r := newStores(t)
	ctx := context.Background()
	m := mq.NewMemory(4)
	got := receive(t, m)
	p := &flakyProducer{Producer: m.Producer(), fail: func(msgs []mq.Message) error {
		if msgs[0].Key == "BAD" {
			return errBrokerQueueDown
		}
		return nil
	}}
	var rows []arbiter.OutboxRow
	for i := range 50 {
		rows = append(rows, outboxRow("BAD", fmt.Sprintf("BAD-%03d", i)))
	}
	for i := range 5 {
		rows = append(rows, outboxRow("A", fmt.Sprintf("A-%03d", i)))
	}
	require.NoError(t, r.db.Create(&rows).Error)
	relay := NewRelay(r.db, p, r.locker, RelayConfig{Interval: time.Minute, Batch: 20})

	n, err := relay.RelayOnce(ctx)
	require.ErrorIs(t, err, errBrokerQueueDown)
	require.Zero(t, n, "the batch held only BAD's rows")
	n, err = relay.RelayOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 5, n, "BAD is held back: A's rows are read and sent")
	got.waitTotal(t, 5)
	require.Equal(t, tokens(t, r.db, "A", nil), got.of("A"))
	require.Len(t, tokens(t, r.db, "BAD", isUnsent), 50)
}

// Many SKUs' rows are written while the relay runs, sending up to eight SKUs
// at once through a producer that is slow and sometimes fails: every SKU's
// messages reach the consumer in id order, once each, and sends of different
// SKUs did overlap (never more than eight).
func TestRelayConcurrentSKUsKeepTheirOrder(t *testing.T) {
	r := newStores(t)
	m := mq.NewMemory(8)
	got := receive(t, m)
	var failures atomic.Int64
	p := &flakyProducer{
		Producer: m.Producer(),
		pause:    func() time.Duration { return time.Duration(rand.N(1500)) * time.Microsecond },
		fail: func([]mq.Message) error {
			if rand.N(20) == 0 {
				failures.Add(1)
				return errBrokerQueueDown
			}
			return nil
		},
	}
	relay := NewRelay(r.db, p, r.locker, RelayConfig{Interval: 5 * time.Millisecond, Batch: 60, Parallel: 8,
		Logger: slog.New(slog.DiscardHandler)}) // the injected failures are logged
	relay.Start(context.Background())
	t.Cleanup(relay.Stop)

	const skus, perSKU = 40, 30
	var wg sync.WaitGroup
	for s := range skus {
		wg.Go(func() { // one writer per SKU: its ids follow its commit order
			sku := fmt.Sprintf("S%02d", s)
			for i := 0; i < perSKU; {
				k := min(1+rand.N(4), perSKU-i)
				rows := make([]arbiter.OutboxRow, k)
				for j := range rows {
					rows[j] = outboxRow(sku, fmt.Sprintf("%s-%02d", sku, i+j))
				}
				if err := r.db.Create(&rows).Error; err != nil {
					t.Error(err)
					return
				}
				relay.Wake()
				i += k
				time.Sleep(time.Duration(rand.N(3)) * time.Millisecond)
			}
		})
	}
	wg.Wait()
	got.waitTotal(t, skus*perSKU)
	// A message can arrive before its round marks the row sent: wait for
	// the marks (Sent moves after they commit), not only the messages.
	require.Eventually(t, func() bool { return relay.Sent.Load() >= skus*perSKU }, time.Minute, 10*time.Millisecond)
	relay.Stop()

	var unsent int64
	require.NoError(t, r.db.Raw(`SELECT COUNT(*) FROM stock_outbox WHERE sent_at IS NULL`).Scan(&unsent).Error)
	require.Zero(t, unsent)
	for s := range skus {
		sku := fmt.Sprintf("S%02d", s)
		want := tokens(t, r.db, sku, nil)
		require.Len(t, want, perSKU)
		require.Equal(t, want, got.of(sku), "%s arrived in id order, once each", sku)
	}
	_, maxInFlight := p.stats("")
	t.Logf("%d failed sends; at most %d in flight", failures.Load(), maxInFlight)
	require.Greater(t, maxInFlight, 1, "SKUs were sent concurrently")
	require.LessOrEqual(t, maxInFlight, 8, "bounded by Parallel")
	require.Positive(t, failures.Load(), "the failure path ran")
}

// A node that died leading the relay (SIGKILL: its lock is neither released
// nor renewed) holds every SKU's messages back until its lock lapses; then
// another node leads and sends them, and never before the lapse (two
// leaders at once would send the same rows concurrently).
func TestRelayTakesOverFromADeadLeader(t *testing.T) {
	r := newStores(t)
	m := mq.NewMemory(4)
	got := receive(t, m)
	renewed := time.Now() // its last renewal: the lock lapses no earlier than DefaultRelayLockTTL after
	_, err := r.locker.Obtain(context.Background(), lock.RelayKey, DefaultRelayLockTTL, 0)
	require.NoError(t, err) // never renewed, never released

	relay := NewRelay(r.db, m.Producer(), r.locker, RelayConfig{Interval: 10 * time.Millisecond})
	relay.Start(context.Background())
	t.Cleanup(relay.Stop)
	require.NoError(t, r.db.Create(&[]arbiter.OutboxRow{outboxRow("A", "a-1"), outboxRow("B", "b-1")}).Error)
	relay.Wake()

	var ledAt time.Time
	require.Eventually(t, func() bool {
		if relay.Leading.Load() && ledAt.IsZero() {
			ledAt = time.Now()
		}
		return !ledAt.IsZero()
	}, 30*time.Second, time.Millisecond, "the relay never took the dead leader's lock")
	require.GreaterOrEqual(t, ledAt.Sub(renewed), DefaultRelayLockTTL, "led while the dead leader's lock was live")
	got.waitTotal(t, 2)
	require.Equal(t, []string{"a-1"}, got.of("A"))
	require.Equal(t, []string{"b-1"}, got.of("B"))

	relay.Stop()
	require.False(t, relay.Leading.Load(), "a stopped relay does not lead")
}
