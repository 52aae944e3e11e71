package delivery_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/events"
	"github.com/acme/inventory/internal/lock"
	"github.com/acme/inventory/internal/maintenance"
	"github.com/acme/inventory/internal/webhooks"
	"github.com/acme/inventory/internal/webhooks/delivery"
	"github.com/acme/inventory/testkit/testenv"
	"github.com/acme/inventory/testkit/testrig"
)

// secret signs the tests' deliveries; it must never show in a log line or
// an answer.
const secret = "whsec-0123456789abcdefghijklmnopqrstuvwxyz"

// soldOutAndBack are the events the simple tests subscribe to: a SKU of 1
// unit reserved and released writes exactly these, one each.
var soldOutAndBack = []string{arbiter.EventSoldOut, arbiter.EventBackInStock}

// receiver is a storefront's webhook endpoint: it checks each delivery's
// headers and signature, answers as answer says (nil: 200), and records
// the events it acknowledged with a 2xx, in the order it got them.
type receiver struct {
	t      testing.TB
	srv    *httptest.Server
	answer atomic.Pointer[func(e arbiter.Event, w http.ResponseWriter, r *http.Request) int]

	requests atomic.Int64
	mu       sync.Mutex
	acked    []arbiter.Event
	bodies   [][]byte
}

func newReceiver(t testing.TB) *receiver {
	rc := &receiver{t: t}
	rc.srv = httptest.NewServer(http.HandlerFunc(rc.serve))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) serve(w http.ResponseWriter, r *http.Request) {
	rc.requests.Add(1)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	ts, sig, id := r.Header.Get("X-Timestamp"), r.Header.Get("X-Signature"), r.Header.Get("X-Event-Id")
	got, _ := hex.DecodeString(sig)
	var e arbiter.Event
	switch {
	case r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json":
		rc.t.Errorf("a delivery is a JSON POST, got %s %q", r.Method, r.Header.Get("Content-Type"))
	case !bytes.Equal(got, inventory.Sign(secret, ts, body)):
		rc.t.Errorf("X-Signature %q does not verify with the secret over %q.%q", sig, ts, body)
	case json.Unmarshal(body, &e) != nil || e.ID == nil || strconv.FormatInt(*e.ID, 10) != id:
		rc.t.Errorf("X-Event-Id %q is not the id of the event in %s", id, body)
	}
	if sec, err := strconv.ParseInt(ts, 10, 64); err != nil || time.Since(time.Unix(sec, 0)).Abs() > time.Hour {
		rc.t.Errorf("X-Timestamp %q is not unix seconds of about now", ts)
	}
	status := http.StatusOK
	if a := rc.answer.Load(); a != nil {
		status = (*a)(e, w, r)
	}
	if status == 0 {
		return // the answer was written (or the connection dropped)
	}
	w.WriteHeader(status)
	if status/100 == 2 {
		rc.mu.Lock()
		rc.acked = append(rc.acked, e)
		rc.bodies = append(rc.bodies, body)
		rc.mu.Unlock()
	}
}

// answerWith sets how the receiver answers from now on.
func (rc *receiver) answerWith(f func(e arbiter.Event, w http.ResponseWriter, r *http.Request) int) {
	rc.answer.Store(&f)
}

// status answers every delivery with code.
func (rc *receiver) status(code int) {
	rc.answerWith(func(arbiter.Event, http.ResponseWriter, *http.Request) int { return code })
}

func (rc *receiver) events() []arbiter.Event {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.acked)
}

// ids are the acknowledged events' feed ids, in the order they came.
func (rc *receiver) ids() []int64 {
	var out []int64
	for _, e := range rc.events() {
		out = append(out, *e.ID)
	}
	return out
}

// world is one node's stores, its events job numbering the events for
// the feed, the subscriptions and their log.
type world struct {
	*testrig.Rig
	subs *webhooks.Service
	log  *testenv.Logs
	ctx  context.Context
}

func newWorld(t *testing.T, policy webhooks.Policy) *world {
	r := testrig.New(t, testrig.MemoryTransport(t))
	w := &world{Rig: r, log: &testenv.Logs{}, ctx: context.Background()}
	logger := slog.New(slog.NewTextHandler(w.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	w.subs = webhooks.New(r.DB, policy, logger)
	ev := events.New(r.DB, r.Stock.Locker(), events.Config{Interval: 20 * time.Millisecond, LevelInterval: 50 * time.Millisecond})
	ev.Start(w.ctx)
	t.Cleanup(ev.Stop)
	t.Cleanup(func() {
		require.NotContains(t, w.log.String(), secret, "the secret is never logged")
	})
	return w
}

// fast is a delivery config whose waits suit a test.
func (w *world) fast(cfg delivery.Config) delivery.Config {
	cfg.Interval = 20 * time.Millisecond
	cfg.Scan = 50 * time.Millisecond
	cfg.LockTTL = cmpOr(cfg.LockTTL, time.Second)
	cfg.MinBackoff = cmpOr(cfg.MinBackoff, 20*time.Millisecond)
	cfg.MaxBackoff = cmpOr(cfg.MaxBackoff, 100*time.Millisecond)
	cfg.Timeout = cmpOr(cfg.Timeout, 10*time.Second)
	cfg.Logger = slog.New(slog.NewTextHandler(w.log, nil))
	return cfg
}

func cmpOr(d, def time.Duration) time.Duration {
	if d != 0 {
		return d
	}
	return def
}

// start runs a delivery job until the test ends.
func (w *world) start(t *testing.T, cfg delivery.Config) *delivery.Job {
	j := delivery.New(w.subs, w.Stock.Locker(), w.fast(cfg))
	j.Start(w.ctx)
	t.Cleanup(j.Stop)
	return j
}

// subscribe puts subscription id for events of every SKU to rc.
func (w *world) subscribe(t *testing.T, id, target string, events ...string) {
	t.Helper()
	_, err := w.subs.Put(w.ctx, id, webhooks.Spec{URL: target, Secret: secret, Events: events})
	require.NoError(t, err)
}

// soldOutAndBack sells a 1-unit SKU's unit and gives it back n times:
// n sku.sold_out and n sku.back_in_stock, alternating.
func (w *world) soldOutAndBack(t *testing.T, sku string, n int) {
	t.Helper()
	for range n {
		tok := testenv.Unique("t")
		_, err := w.Tokens.Reserve(w.ctx, sku, 1, tok)
		require.NoError(t, err)
		_, err = w.Tokens.Release(w.ctx, sku, tok)
		require.NoError(t, err)
	}
}

// feed is every published event of types, in feed order, once the events
// job numbered every event written.
func (w *world) feed(t *testing.T, types ...string) []arbiter.Event {
	t.Helper()
	ev := arbiter.EventsOf(w.DB)
	require.Eventually(t, func() bool {
		n, err := ev.Unpublished()
		require.NoError(t, err)
		return n == 0
	}, 30*time.Second, 10*time.Millisecond, "the events job numbers every event")
	out, err := ev.Page(arbiter.EventFilter{Types: types, Limit: 100000})
	require.NoError(t, err)
	return out
}

func idsOf(evs []arbiter.Event) []int64 {
	out := make([]int64, len(evs))
	for i, e := range evs {
		out[i] = *e.ID
	}
	return out
}

// waitDelivered waits until rc has acknowledged every one of want (each at
// least once), and checks the order: feed order, in which an event seen
// again may only be a duplicate of one acknowledged before.
func waitDelivered(t *testing.T, rc *receiver, want []arbiter.Event) {
	t.Helper()
	require.Eventually(t, func() bool {
		got := map[int64]bool{}
		for _, id := range rc.ids() {
			got[id] = true
		}
		for _, e := range want {
			if !got[*e.ID] {
				return false
			}
		}
		return true
	}, 60*time.Second, 10*time.Millisecond, "every event delivered")
	requireFeedOrder(t, rc.ids())
}

// requireFeedOrder: ids grow, except that an id seen before may come again
// (at least once); no id passes one not yet delivered.
func requireFeedOrder(t *testing.T, ids []int64) {
	t.Helper()
	seen := map[int64]bool{}
	var top int64
	for i, id := range ids {
		if id <= top {
			require.True(t, seen[id], "delivery %d: event %d came after %d without having come before: %v", i, id, top, ids)
			continue
		}
		seen[id], top = true, id
	}
}

func (w *world) view(t *testing.T, id string) *webhooks.View {
	t.Helper()
	v, err := w.subs.Get(w.ctx, id)
	require.NoError(t, err)
	return v
}

// Every event a subscription asked for is delivered once, in feed order,
// as a JSON POST of the feed's object, signed with its secret (the
// receiver checks X-Signature, X-Timestamp and X-Event-Id); the events it
// did not ask for are not, and its cursor passes them. Its state shows
// the last success, and no answer or log line has the secret.
func TestDeliversEverySubscribedEventSignedInFeedOrder(t *testing.T) {
	w := newWorld(t, webhooks.Policy{AllowHTTP: true, AllowPrivate: true})
	shop, single := newReceiver(t), newReceiver(t)
	w.subscribe(t, "shop", shop.srv.URL+"/hooks", soldOutAndBack...)
	a, b := w.PutSKU("DA", 1, 0), w.PutSKU("DB", 1, 0)
	_, err := w.subs.Put(w.ctx, "only-a", webhooks.Spec{URL: single.srv.URL, Secret: secret, Events: []string{arbiter.EventSoldOut}, SKUs: []string{a}})
	require.NoError(t, err)
	j := w.start(t, delivery.Config{})
	w.soldOutAndBack(t, a, 3)
	w.soldOutAndBack(t, b, 2)
	want := w.feed(t, soldOutAndBack...)
	require.Len(t, want, 10)
	onlyA := slices.DeleteFunc(slices.Clone(want), func(e arbiter.Event) bool { return e.SKU != a || e.Type != arbiter.EventSoldOut })
	require.Len(t, onlyA, 3)
	waitDelivered(t, shop, want)
	waitDelivered(t, single, onlyA)
	require.Equal(t, idsOf(want), shop.ids(), "each event once, in feed order")
	require.Equal(t, idsOf(onlyA), single.ids(), "its SKU's sold_out only")
	for i, e := range shop.events() {
		body, err := delivery.Body(e)
		require.NoError(t, err)
		require.Equal(t, string(body), string(shop.bodies[i]), "the body is the feed's object")
	}
	all := w.feed(t)
	head := *all[len(all)-1].ID
	require.Eventually(t, func() bool {
		return w.view(t, "shop").DeliveredID == head && w.view(t, "only-a").DeliveredID == head
	}, 30*time.Second, 10*time.Millisecond, "both cursors pass the events they did not subscribe to")
	v := w.view(t, "shop")
	require.Equal(t, webhooks.Active, v.State)
	require.NotNil(t, v.LastSuccessAt)
	require.Zero(t, v.Backlog)
	require.Zero(t, v.Attempts)
	answer, err := json.Marshal(v)
	require.NoError(t, err)
	require.NotContains(t, string(answer), secret)
	require.EqualValues(t, 13, j.Stats.Delivered.Load())
	require.Zero(t, j.Stats.Failed.Load()+j.Stats.Refused.Load())
}

// A receiver that is down, answers 500, is slower than the deadline or
// redirects gets nothing acknowledged and its events wait, counted failed
// and retried with backoff; once it is well it gets every one, in feed
// order, those written meanwhile too. A redirect is not followed.
func TestFailingReceiverGetsTheBacklogInOrderOnceWell(t *testing.T) {
	elsewhere := newReceiver(t)
	for name, c := range map[string]struct {
		fail func(e arbiter.Event, w http.ResponseWriter, r *http.Request) int
		says string
	}{
		"down": {func(_ arbiter.Event, w http.ResponseWriter, _ *http.Request) int {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return 0
		}, "EOF"},
		"500": {func(arbiter.Event, http.ResponseWriter, *http.Request) int { return 500 }, "the receiver answered 500 Internal Server Error"},
		"slow past the deadline": {func(_ arbiter.Event, _ http.ResponseWriter, r *http.Request) int {
			<-r.Context().Done() // the attempt's deadline (300 ms) ends it
			return 0
		}, "context deadline exceeded"},
		"redirect": {func(_ arbiter.Event, w http.ResponseWriter, _ *http.Request) int {
			w.Header().Set("Location", elsewhere.srv.URL)
			return http.StatusFound
		}, "the receiver answered 302 Found"},
	} {
		t.Run(name, func(t *testing.T) {
			w := newWorld(t, webhooks.Policy{AllowHTTP: true, AllowPrivate: true})
			rc := newReceiver(t)
			rc.answerWith(c.fail)
			w.subscribe(t, "shop", rc.srv.URL, soldOutAndBack...)
			sku := w.PutSKU("DF", 1, 0)
			j := w.start(t, delivery.Config{Timeout: 300 * time.Millisecond})
			w.soldOutAndBack(t, sku, 2)
			require.Len(t, w.feed(t, soldOutAndBack...), 4)
			require.Eventually(t, func() bool { return j.Stats.Failed.Load() >= 3 }, 60*time.Second, 10*time.Millisecond)
			v := w.view(t, "shop")
			require.Empty(t, rc.ids(), "nothing acknowledged")
			require.EqualValues(t, 4, v.Backlog, "the events wait")
			require.Positive(t, v.Attempts)
			require.NotNil(t, v.LastError)
			require.Contains(t, *v.LastError, c.says)
			require.Contains(t, *v.LastError, "failed: event ")
			require.Equal(t, webhooks.Active, v.State, "not failing for long yet")

			rc.status(200)
			w.soldOutAndBack(t, sku, 1)
			want := w.feed(t, soldOutAndBack...)
			require.Len(t, want, 6)
			waitDelivered(t, rc, want)
			require.Eventually(t, func() bool { return w.view(t, "shop").Backlog == 0 }, 30*time.Second, 10*time.Millisecond)
			v = w.view(t, "shop")
			require.Equal(t, webhooks.Active, v.State)
			require.Zero(t, v.Attempts)
			require.Nil(t, v.NextAttemptAt)
			require.Zero(t, elsewhere.requests.Load(), "a redirect is not followed")
		})
	}
}

// One receiver that never answers (each attempt waits out a long
// deadline) delays no other subscription: the other's events are all
// delivered while the first attempt at the dead one still hangs.
func TestDeadReceiverDelaysNoOther(t *testing.T) {
	w := newWorld(t, webhooks.Policy{AllowHTTP: true, AllowPrivate: true})
	dead, well := newReceiver(t), newReceiver(t)
	hung := make(chan struct{})
	t.Cleanup(func() { close(hung) }) // before the servers close (cleanups run last first)
	dead.answerWith(func(arbiter.Event, http.ResponseWriter, *http.Request) int {
		<-hung
		return 0
	})
	w.subscribe(t, "dead", dead.srv.URL, soldOutAndBack...)
	w.subscribe(t, "well", well.srv.URL, soldOutAndBack...)
	j := w.start(t, delivery.Config{Timeout: 10 * time.Minute})
	sku := w.PutSKU("DD", 1, 0)
	w.soldOutAndBack(t, sku, 5)
	want := w.feed(t, soldOutAndBack...)
	waitDelivered(t, well, want)
	require.Equal(t, idsOf(want), well.ids())
	require.EqualValues(t, 1, dead.requests.Load(), "the dead receiver's first attempt still hangs")
	require.Zero(t, j.Stats.Failed.Load())
}

// Many goroutines sell and give back units of several SKUs at once (the
// arbiter writes their threshold events; the events job their level
// events and their feed ids) while the receiver fails a third of the
// deliveries: it still gets every SKU's events in seq order with no gap
// (a repeat of one it had is allowed: at least once).
func TestPerSKUOrderUnderConcurrentSales(t *testing.T) {
	w := newWorld(t, webhooks.Policy{AllowHTTP: true, AllowPrivate: true})
	rc := newReceiver(t)
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(7, 11))
	rc.answerWith(func(arbiter.Event, http.ResponseWriter, *http.Request) int {
		mu.Lock()
		defer mu.Unlock()
		if rng.IntN(3) == 0 {
			return http.StatusServiceUnavailable
		}
		return http.StatusNoContent
	})
	w.subscribe(t, "shop", rc.srv.URL, arbiter.EventTypes...)
	w.start(t, delivery.Config{MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	var skus []string
	for i := range 4 {
		sku := w.PutSKU(fmt.Sprintf("DC%d", i), 3, 0)
		_, err := w.Catalog.PutSettings(w.ctx, sku, arbiter.Settings{OnHand: 3, LowStockThreshold: 1})
		require.NoError(t, err)
		skus = append(skus, sku)
	}
	testrig.Race(16, func(i int) {
		for n := range 12 {
			sku := skus[(i+n)%len(skus)]
			tok := testenv.Unique(fmt.Sprintf("c%d", i))
			if _, err := w.Tokens.Reserve(w.ctx, sku, 1, tok); err != nil {
				require.ErrorIs(t, err, inventory.ErrInsufficientStock)
				continue
			}
			_, err := w.Tokens.Release(w.ctx, sku, tok)
			require.NoError(t, err)
		}
	})
	// The last levels are announced within a second of the last change.
	time.Sleep(1200 * time.Millisecond)
	want := w.feed(t, arbiter.EventTypes...)
	waitDelivered(t, rc, want)
	per := map[string][]int64{}
	for _, e := range rc.events() {
		per[e.SKU] = append(per[e.SKU], e.Seq)
	}
	for _, sku := range skus {
		all, err := arbiter.EventsOf(w.DB).OfSKU(sku)
		require.NoError(t, err)
		var top int64
		for i, seq := range per[sku] {
			switch {
			case seq == top+1:
				top = seq
			case seq <= top: // a repeat of one delivered before
			default:
				t.Fatalf("%s: delivery %d has seq %d after %d: a gap or a passing (%v)", sku, i, seq, top, per[sku])
			}
		}
		require.EqualValues(t, len(all), top, "%s: every event of the SKU", sku)
	}
}

// A node dies while a delivery is in flight (its Redis connection gone,
// so its lock is not released, and its attempt cut off): the other node
// takes the subscription over once the lock lapses and goes on from the
// cursor in the database; the event in flight is delivered again, and
// none is missing or out of order.
func TestNodeKilledMidDeliveryIsTakenOver(t *testing.T) {
	w := newWorld(t, webhooks.Policy{AllowHTTP: true, AllowPrivate: true})
	rc := newReceiver(t)
	inFlight, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	rc.answerWith(func(_ arbiter.Event, w http.ResponseWriter, _ *http.Request) int {
		first := false
		once.Do(func() { first = true })
		if !first {
			return 200
		}
		close(inFlight) // the node dies during this attempt: no answer ever comes
		<-release
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			_ = conn.Close()
		}
		return 0
	})
	w.subscribe(t, "shop", rc.srv.URL, soldOutAndBack...)
	sku := w.PutSKU("DK", 1, 0)
	w.soldOutAndBack(t, sku, 1)

	// The first node has its own Redis connections: killing it loses them.
	opt := *w.RDB.Options()
	own := redis.NewClient(&opt)
	first := delivery.New(w.subs, lock.NewLocker(own), w.fast(delivery.Config{LockTTL: time.Second}))
	first.Start(w.ctx)
	require.Eventually(t, func() bool { return first.Leading("shop") }, 30*time.Second, 10*time.Millisecond)
	second := w.start(t, delivery.Config{LockTTL: time.Second})
	w.soldOutAndBack(t, sku, 2)
	select {
	case <-inFlight:
	case <-time.After(60 * time.Second):
		t.Fatal("no delivery in flight")
	}
	require.True(t, first.Leading("shop"), "the first node delivers")
	require.NoError(t, own.Close()) // dead: no renewal, no release
	first.Stop()
	close(release)
	require.Eventually(t, func() bool { return second.Leading("shop") }, 30*time.Second, 10*time.Millisecond, "the second node takes over")
	want := w.feed(t, soldOutAndBack...)
	require.Len(t, want, 6)
	waitDelivered(t, rc, want)
	require.Equal(t, idsOf(want), rc.ids(), "each once (the attempt in flight was never answered), in order")
}

// flipResolver answers the test's hostname with addresses the test sets;
// private, when set, is answered to every second lookup (a rebinding
// attacker's DNS: public for the check, private for the connection).
type flipResolver struct {
	mu      sync.Mutex
	public  netip.Addr
	private netip.Addr
	alt     bool
	n       int
}

func (r *flipResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	if r.private.IsValid() && (!r.alt || r.n%2 == 0) {
		return []netip.Addr{r.private}, nil
	}
	return []netip.Addr{r.public}, nil
}

func (r *flipResolver) set(f func(r *flipResolver)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(r)
}

// A name that resolved to a public address when subscribed and resolves to
// a loopback one later is refused at delivery: counted refused, nothing
// sent, the events kept. So is a name that answers public for the check
// and loopback a moment later for the connection (DNS rebinding): the
// dialer connects only to addresses it checked itself.
func TestPrivateTargetRefusedAtDelivery(t *testing.T) {
	res := &flipResolver{public: netip.MustParseAddr("203.0.113.7")}
	w := newWorld(t, webhooks.Policy{AllowHTTP: true, Resolver: res})
	rc := newReceiver(t) // on 127.0.0.1
	u, err := url.Parse(rc.srv.URL)
	require.NoError(t, err)
	w.subscribe(t, "shop", "http://hooks.shop.example:"+u.Port()+"/in", soldOutAndBack...)
	for name, flip := range map[string]func(r *flipResolver){
		"the name moved":    func(r *flipResolver) { r.private, r.alt = netip.MustParseAddr("127.0.0.1"), false },
		"rebinding at dial": func(r *flipResolver) { r.private, r.alt, r.n = netip.MustParseAddr("127.0.0.1"), true, 0 },
	} {
		t.Run(name, func(t *testing.T) {
			res.set(flip)
			j := w.start(t, delivery.Config{})
			sku := w.PutSKU("DS", 1, 0)
			w.soldOutAndBack(t, sku, 1)
			w.feed(t)
			require.Eventually(t, func() bool { return j.Stats.Refused.Load() >= 3 }, 60*time.Second, 10*time.Millisecond)
			j.Stop()
			require.Zero(t, rc.requests.Load(), "nothing reached the private address")
			require.Zero(t, j.Stats.Delivered.Load()+j.Stats.Failed.Load())
			v := w.view(t, "shop")
			require.NotNil(t, v.LastError)
			require.Contains(t, *v.LastError, "refused: event ")
			require.Contains(t, *v.LastError, "loopback, private, link-local or metadata")
			require.Positive(t, v.Backlog, "the events are kept")
		})
	}
}

// A receiver that keeps failing for longer than FailingAfter (on a clock
// the test moves) marks the subscription failing: its backlog is kept,
// retention does not prune it however old, and its next attempt waits out
// the backoff even once the receiver is well. A resume makes it due now:
// everything is delivered and it is active again.
func TestFailingKeepsTheBacklogUntilResumed(t *testing.T) {
	w := newWorld(t, webhooks.Policy{AllowHTTP: true, AllowPrivate: true})
	rc := newReceiver(t)
	rc.status(500)
	clock := testenv.NewClock()
	w.subscribe(t, "shop", rc.srv.URL, soldOutAndBack...)
	j := w.start(t, delivery.Config{Now: clock.Now, MinBackoff: time.Minute, MaxBackoff: 10 * time.Minute, FailingAfter: 15 * time.Minute})
	sku := w.PutSKU("DR", 1, 0)
	w.soldOutAndBack(t, sku, 2)
	want := w.feed(t, soldOutAndBack...)
	require.Eventually(t, func() bool { return w.view(t, "shop").Attempts == 1 }, 60*time.Second, 10*time.Millisecond)
	v := w.view(t, "shop")
	require.Equal(t, webhooks.Active, v.State)
	require.NotNil(t, v.NextAttemptAt)
	require.WithinRange(t, *v.NextAttemptAt, clock.Now().Add(29*time.Second), clock.Now().Add(61*time.Second), "a jittered minute")

	clock.Advance(16 * time.Minute)
	require.Eventually(t, func() bool { return w.view(t, "shop").Attempts == 2 }, 60*time.Second, 10*time.Millisecond)
	v = w.view(t, "shop")
	require.Equal(t, webhooks.Failing, v.State, "failing for over 15 minutes")
	require.EqualValues(t, 4, v.Backlog, "the backlog is kept")
	require.EqualValues(t, 2, j.Stats.Failed.Load())

	// Retention a year on keeps every event not delivered yet.
	ret := maintenance.NewRetention(w.DB, w.Stock.Locker(), maintenance.RetentionConfig{Now: func() time.Time { return time.Now().AddDate(1, 0, 0) }})
	_, err := ret.PruneOnce(w.ctx)
	require.NoError(t, err)
	require.Equal(t, idsOf(want), idsOf(w.feed(t, soldOutAndBack...)), "retention kept the backlog")

	rc.status(200)
	time.Sleep(200 * time.Millisecond) // ten rounds: the next attempt is not due on the test's clock
	require.Empty(t, rc.ids())
	v, err = w.subs.Resume(w.ctx, "shop")
	require.NoError(t, err)
	require.Equal(t, webhooks.Active, v.State)
	waitDelivered(t, rc, want)
	require.Eventually(t, func() bool { return w.view(t, "shop").Backlog == 0 }, 30*time.Second, 10*time.Millisecond)
	v = w.view(t, "shop")
	require.Equal(t, webhooks.Active, v.State)
	require.Zero(t, v.Attempts)
	require.Nil(t, v.FailingSince)
	_, err = w.subs.Resume(w.ctx, "nope")
	require.ErrorIs(t, err, inventory.ErrNotFound)
}

// The backoff doubles from its least wait to its cap, jittered into
// [d/2, d]; it never grows past the cap however many attempts failed.
func TestBackoff(t *testing.T) {
	for attempts, d := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 10: 512 * time.Second,
		11: 10 * time.Minute, 1000: 10 * time.Minute} {
		for range 50 {
			got := delivery.Backoff(time.Second, 10*time.Minute, attempts)
			require.GreaterOrEqual(t, got, d/2, "attempt %d", attempts)
			require.LessOrEqual(t, got, d, "attempt %d", attempts)
		}
	}
}

// The job stops before it starts and twice, and a deleted subscription's
// worker ends.
func TestStopAndDelete(t *testing.T) {
	w := newWorld(t, webhooks.Policy{AllowHTTP: true, AllowPrivate: true})
	j := delivery.New(w.subs, w.Stock.Locker(), w.fast(delivery.Config{}))
	j.Stop()
	rc := newReceiver(t)
	w.subscribe(t, "shop", rc.srv.URL, soldOutAndBack...)
	j.Start(w.ctx)
	j.Start(w.ctx) // a no-op
	require.Eventually(t, func() bool { return j.Leading("shop") }, 30*time.Second, 10*time.Millisecond)
	_, err := w.subs.Delete(w.ctx, "shop")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return !j.Leading("shop") }, 30*time.Second, 10*time.Millisecond)
	j.Stop()
	j.Stop()
}

// TestEmbeddedContract runs the delivery again on the embedded default's
// stand-ins (SQLite, miniredis).
func TestEmbeddedContract(t *testing.T) {
	testrig.RunEmbedded(t, TestDeliversEverySubscribedEventSignedInFeedOrder, TestFailingKeepsTheBacklogUntilResumed,
		TestNodeKilledMidDeliveryIsTakenOver)
}
