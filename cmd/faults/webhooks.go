package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/acme/inventory/client"
	"github.com/acme/inventory/internal/arbiter"
)

// The webhooks scenario (issue 32): two subscriptions, each with its own
// receiver in this process on a loopback port. "steady" asks for every
// event of every SKU and always answers 204. "flaky" asks for the SKU
// events of three SKUs, and its receiver is down (its listener closed:
// connection refused), then slow past the delivery's deadline (it stores
// the event and answers 1.5 s later, after the 1 s deadline), then answers
// 500, then is healthy again, answering each delivery 25 ms after it came,
// so its backlog (about 200 events) takes seconds to drain; while it
// drains, the node that delivers it is SIGKILLed and restarted. The hot SKU and one
// cart SKU have a low-stock threshold; the workload sells every SKU out and
// gives units back (cancels, expiries, refunds, restocks).
//
// Afterwards (waiting up to hookWait for the receivers to catch up) the
// judge reads the replay feed whole (GET /v1/events) and the movement
// history (stock_movements), and fails the run on:
//
//   - an event of the feed a subscription asked for, not delivered to it
//     (duplicates are allowed, counted);
//   - a first delivery of a SKU's event after a later one of the same SKU
//     (seq order), or of any event after one with a higher feed id (the
//     delivery's promise is feed order);
//   - a delivery that is not the feed's event, one the subscription did not
//     ask for, or a signature client.VerifyWebhook refuses;
//   - a SKU whose threshold events (sku.low_stock, sku.sold_out,
//     sku.back_in_stock, in seq order) are not the crossings its movement
//     history makes, replayed as the arbiter decides them (expectedCrossings);
//   - an answer slower than answerLimit (docs/SPEC.md section 7) to a
//     request sent while the flaky receiver was down, slow or failing: no
//     sale waits for a delivery.
const (
	hookTimeout    = time.Second
	hookMaxBackoff = time.Second             // the least allowed: jittered into 0.5-1 s
	hookSlow       = 1500 * time.Millisecond // the slow receiver's answer: past hookTimeout
	hookCatchUp    = 25 * time.Millisecond   // the flaky receiver's answers once healthy again
	hookWait       = 30 * time.Second        // how long the receivers may take to catch up after the run settled
)

// hookEnv is the fleet's delivery configuration: short deadline and
// backoff, so the flaky receiver's backlog drains within the run, and the
// loopback receivers allowed.
var hookEnv = []string{
	"INVENTORY_WEBHOOK_TIMEOUT=" + hookTimeout.String(),
	"INVENTORY_WEBHOOK_MAX_BACKOFF=" + hookMaxBackoff.String(),
	"INVENTORY_WEBHOOK_ALLOW_HTTP=true",
	"INVENTORY_WEBHOOK_ALLOW_PRIVATE=true",
}

// lowStock are the thresholds put before the workload (PUT /v1/skus/{sku}).
var lowStock = map[string]int64{hotSKU: 25, "CART-1": 15}

// skuEvents are the SKUs' event types, thresholdEvents those the
// movements decide.
var (
	skuEvents       = []string{arbiter.EventBackInStock, arbiter.EventLevelChanged, arbiter.EventLowStock, arbiter.EventSoldOut}
	thresholdEvents = []string{arbiter.EventBackInStock, arbiter.EventLowStock, arbiter.EventSoldOut}
)

// hookRun is a run's subscriptions and what was done to them.
type hookRun struct {
	subs []*hookSub
	// the node killed while the flaky receiver's backlog drained
	killed   string
	killedAt time.Time
}

// hookSub is one subscription and its receiver.
type hookSub struct {
	ID     string
	Events []string
	SKUs   []string
	From   int64 // delivered_id when it was put: it is delivered the events above it
	rc     *receiver
}

func (h *hookRun) sub(id string) *hookSub {
	for _, s := range h.subs {
		if s.ID == id {
			return s
		}
	}
	return nil
}

// receiverMode is how the receiver answers a delivery that verified.
type receiverMode int

const (
	modeHealthy receiverMode = iota // stores it, answers 204 (after delay)
	modeSlow                        // stores it, answers 204 after hookSlow
	modeFail                        // answers 500, stores nothing
)

// arrival is a delivery a receiver stored, in arrival order.
type arrival struct {
	ID   int64
	Type string
	SKU  string
	Seq  int64
	At   time.Time
}

// receiver is a webhook receiver on a loopback port: it verifies each
// delivery with client.VerifyWebhook and stores it before it answers, as
// docs/api.md asks of one.
type receiver struct {
	secret []byte
	addr   string

	mu       sync.Mutex
	srv      *http.Server
	mode     receiverMode
	delay    time.Duration
	log      []arrival
	refused  []string       // deliveries VerifyWebhook refused, why
	answered map[string]int // attempts by what the receiver did
	overdue  int            // slow answers the sender still waited for past its deadline
}

func newReceiver(secret string) (*receiver, error) {
	rc := &receiver{secret: []byte(secret), answered: map[string]int{}}
	return rc, rc.up("127.0.0.1:0")
}

// up listens on addr (its own address again after down) and serves.
func (rc *receiver) up(addr string) error {
	var ln net.Listener
	var err error
	for i := 0; i < 50; i++ { // the port was just released: retry a moment if it is not free yet
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: rc, ReadHeaderTimeout: 10 * time.Second}
	rc.mu.Lock()
	rc.srv, rc.addr = srv, ln.Addr().String()
	rc.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
	return nil
}

// down closes the listener and every connection: deliveries are refused.
func (rc *receiver) down() {
	rc.mu.Lock()
	srv := rc.srv
	rc.srv = nil
	rc.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

func (rc *receiver) set(mode receiverMode, delay time.Duration) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.mode, rc.delay = mode, delay
}

func (rc *receiver) url() string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return "http://" + rc.addr + "/hooks/inventory"
}

// arrivals is a copy of what the receiver stored so far.
func (rc *receiver) arrivals() []arrival {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.log)
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, 64<<10))
	if err != nil {
		http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
		return
	}
	ev, err := client.VerifyWebhook(rc.secret, req.Header, body, time.Now(), 0)
	rc.mu.Lock()
	if err != nil {
		rc.refused = append(rc.refused, fmt.Sprintf("X-Event-Id %s: %v", req.Header.Get("X-Event-Id"), err))
		rc.mu.Unlock()
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	mode, delay := rc.mode, rc.delay
	if mode == modeFail {
		rc.answered["500"]++
		rc.mu.Unlock()
		http.Error(w, "failing on purpose", http.StatusInternalServerError)
		return
	}
	rc.log = append(rc.log, arrival{ID: ev.Id, Type: string(ev.Type), SKU: string(ev.Sku), Seq: ev.Seq, At: time.Now()})
	if mode == modeSlow {
		rc.answered["slow"]++
		delay = hookSlow
	} else {
		rc.answered["204"]++
	}
	rc.mu.Unlock()
	select {
	case <-time.After(delay):
	case <-req.Context().Done(): // the sender gave up (its deadline, or its node died)
		return
	}
	if mode == modeSlow {
		rc.mu.Lock()
		rc.overdue++ // the sender still waited, past its deadline
		rc.mu.Unlock()
	}
	w.WriteHeader(http.StatusNoContent)
}

// hooksBefore puts the thresholds and the subscriptions before the
// workload starts.
func hooksBefore(ctx context.Context, r *Run) error {
	c, base := r.client, r.fleet[0].URL()
	for _, sku := range slices.Sorted(maps.Keys(lowStock)) {
		limit := 0
		if sku == hotSKU {
			limit = hotLimit
		}
		a := c.doAt(ctx, base, http.MethodPut, "/v1/skus/"+sku, map[string]any{"stock": initialStock[sku], "per_user_limit": limit,
			"low_stock_threshold": lowStock[sku]}, c.adminHeader())
		if a.Status != http.StatusOK {
			return fmt.Errorf("PUT /v1/skus/%s with a threshold: %d %v %v", sku, a.Status, a.Body, a.Err)
		}
	}
	rng := rand.New(rand.NewPCG(r.seed, 32))
	h := &hookRun{}
	for _, s := range []*hookSub{
		{ID: "steady", Events: slices.Clone(arbiter.EventTypes), SKUs: []string{}},
		{ID: "flaky", Events: slices.Clone(skuEvents), SKUs: []string{hotSKU, "CART-1", "CART-2"}},
	} {
		secret := fmt.Sprintf("%016x%016x%016x", rng.Uint64(), rng.Uint64(), rng.Uint64())
		rc, err := newReceiver(secret)
		if err != nil {
			return err
		}
		r.closers = append(r.closers, rc.down)
		s.rc = rc
		a := c.doAt(ctx, base, http.MethodPut, "/v1/webhooks/"+s.ID, map[string]any{"url": rc.url(), "secret": secret,
			"events": s.Events, "skus": s.SKUs}, c.adminHeader())
		if a.Status/100 != 2 {
			return fmt.Errorf("PUT /v1/webhooks/%s: %d %v %v", s.ID, a.Status, a.Body, a.Err)
		}
		s.From = a.num("delivered_id")
		h.subs = append(h.subs, s)
	}
	r.hooks = h
	return nil
}

// hooksFault takes the flaky receiver through its phases, then kills the
// node that delivers it while its backlog drains.
func hooksFault(ctx context.Context, r *Run) error {
	h := r.hooks
	r.note("subscriptions steady (every event) and flaky (%v of %v) put at feed id %d and %d; thresholds %v",
		h.subs[1].Events, h.subs[1].SKUs, h.subs[0].From, h.subs[1].From, lowStock)
	rc := h.sub("flaky").rc
	phase := func(what string, from, to float64, on func() error) error {
		r.at(ctx, from)
		if err := on(); err != nil {
			return err
		}
		start := time.Now()
		r.note("flaky receiver %s", what)
		r.at(ctx, to)
		r.mu.Lock()
		r.phases = append(r.phases, Phase{What: "flaky receiver " + what, From: start, To: time.Now()})
		r.mu.Unlock()
		return nil
	}
	addr := strings.TrimSuffix(strings.TrimPrefix(rc.url(), "http://"), "/hooks/inventory")
	if err := phase("down (listener closed)", 0.1, 0.3, func() error { rc.down(); return nil }); err != nil {
		return err
	}
	if err := phase(fmt.Sprintf("slow (stores, answers after %s; deadline %s)", hookSlow, hookTimeout), 0.3, 0.45, func() error {
		rc.set(modeSlow, 0)
		return rc.up(addr)
	}); err != nil {
		return err
	}
	if err := phase("answering 500", 0.45, 0.6, func() error { rc.set(modeFail, 0); return nil }); err != nil {
		return err
	}
	before := len(rc.arrivals())
	rc.set(modeHealthy, hookCatchUp)
	backlog := r.hookBacklog(ctx, "flaky")
	r.note("flaky receiver healthy again (answers after %s); its backlog: %d events", hookCatchUp, backlog)

	// While the backlog drains: the node whose delivered count grows
	// fastest is the one delivering it (steady's trickle is the other
	// part); kill it.
	for end := time.Now().Add(5 * time.Second); len(rc.arrivals()) == before && time.Now().Before(end); {
		sleep(ctx, 20*time.Millisecond)
	}
	counts := func() []float64 {
		out := make([]float64, len(r.fleet))
		for i, in := range r.fleet {
			out[i] = delivered(ctx, in.URL())
		}
		return out
	}
	c0 := counts()
	sleep(ctx, 500*time.Millisecond)
	c1 := counts()
	victim := 0
	for i := range r.fleet {
		if c1[i]-c0[i] > c1[victim]-c0[victim] {
			victim = i
		}
	}
	in := r.fleet[victim]
	got := len(rc.arrivals())
	in.Kill()
	h.killed, h.killedAt = in.Name, time.Now()
	r.note("%s SIGKILLed while the flaky backlog drained (%d of it delivered so far; delivered in the last 500 ms by node: %v → %v)",
		in.Name, got-before, c0, c1)
	sleep(ctx, time.Second)
	return in.Start(ctx)
}

// hookBacklog is subscription id's backlog as the service counts it (-1:
// no answer).
func (r *Run) hookBacklog(ctx context.Context, id string) int64 {
	for _, in := range r.fleet {
		a := r.client.doAt(ctx, in.URL(), http.MethodGet, "/v1/webhooks/"+id, nil, r.client.adminHeader())
		if a.Status == http.StatusOK {
			return a.num("backlog")
		}
	}
	return -1
}

// delivered reads a node's inventory_webhook_deliveries_total{result="delivered"}
// (-1: no answer).
func delivered(ctx context.Context, base string) float64 {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return -1
	}
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), `inventory_webhook_deliveries_total{result="delivered"} `); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return -1
}

// feedEvent is an event of the replay feed as the judge reads it.
type feedEvent struct {
	ID        int64  `json:"id"`
	Type      string `json:"type"`
	SKU       string `json:"sku"`
	Seq       int64  `json:"seq"`
	OnHand    int64  `json:"on_hand"`
	Reserved  int64  `json:"reserved"`
	Available int64  `json:"available"`
}

// readFeed pages GET /v1/events from the start to its head.
func readFeed(ctx context.Context, base string, token string) ([]feedEvent, error) {
	var out []feedEvent
	var after int64
	hc := &http.Client{Timeout: 10 * time.Second}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/v1/events?after=%d&limit=500", base, after), nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		var page struct {
			Items []feedEvent `json:"items"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || err != nil {
			return nil, fmt.Errorf("GET /v1/events?after=%d: %d %v", after, resp.StatusCode, err)
		}
		out = append(out, page.Items...)
		if len(page.Items) < 500 {
			return out, nil
		}
		after = page.Items[len(page.Items)-1].ID
	}
}

// subLog is one subscription as the judge sees it: what it asked for,
// from where, and what its receiver stored and refused.
type subLog struct {
	ID       string
	Events   []string
	SKUs     []string
	From     int64
	Arrivals []arrival
	Refused  []string
	Overdue  int
}

func (s subLog) wants(e feedEvent) bool {
	return e.ID > s.From && slices.Contains(s.Events, e.Type) && (len(s.SKUs) == 0 || slices.Contains(s.SKUs, e.SKU))
}

// SubCheck is one subscription's deliveries, judged.
type SubCheck struct {
	ID         string
	Expected   int // events of the feed it asked for
	Delivered  int // of them, delivered at least once
	Arrivals   int // deliveries stored, redeliveries counted
	Duplicates int // redeliveries of an event already stored
	Missing    int
	OutOfOrder int // first deliveries after a later event of the same SKU, or after a higher feed id
	Foreign    int // deliveries not the feed's, or not asked for
	Refused    int // signatures VerifyWebhook refused
}

// HookCheck is a webhook run's verdict beyond the zeros.
type HookCheck struct {
	Subs      []SubCheck
	SKUs      int // SKUs whose threshold events were held to their movements
	Crossings int // threshold events the movements call for, over those SKUs
	Events    int // the feed's events
	Waited    time.Duration
	Phases    int // requests sent while the flaky receiver was down, slow or failing
	Slowest   time.Duration
	Slow      int // of them, slower than answerLimit (or unanswered past it)
	Problems  []string
}

func (hc *HookCheck) problem(format string, args ...any) {
	hc.Problems = append(hc.Problems, fmt.Sprintf(format, args...))
}

func (hc *HookCheck) line() string {
	var parts []string
	for _, s := range hc.Subs {
		parts = append(parts, fmt.Sprintf("%s %d/%d delivered (%d arrivals, %d duplicates), %d missing, %d out of order, %d foreign, %d bad signatures",
			s.ID, s.Delivered, s.Expected, s.Arrivals, s.Duplicates, s.Missing, s.OutOfOrder, s.Foreign, s.Refused))
	}
	result := "PASS"
	if len(hc.Problems) > 0 {
		result = "FAIL"
	}
	return fmt.Sprintf("webhooks: %s; threshold events vs movements: %d crossings over %d SKUs; %d answers while the receiver was down/slow/failing, slowest %s, %d over %s; caught up in %s: %s",
		strings.Join(parts, "; "), hc.Crossings, hc.SKUs, hc.Phases, round(hc.Slowest), hc.Slow, answerLimit, round(hc.Waited), result)
}

// judgeDeliveries holds one subscription's stored deliveries to the feed:
// every event it asked for stored at least once; each first delivery
// after every earlier-numbered one (feed id, and per SKU seq); nothing
// stored that is not the feed's event or not asked for; no signature
// refused.
func judgeDeliveries(feed []feedEvent, s subLog, hc *HookCheck) SubCheck {
	sc := SubCheck{ID: s.ID, Arrivals: len(s.Arrivals), Refused: len(s.Refused)}
	for _, why := range s.Refused {
		hc.problem("%s: a delivery's signature was refused: %s", s.ID, why)
	}
	if s.Overdue > 0 {
		hc.problem("%s: %d slow answers were still awaited past the %s deadline", s.ID, s.Overdue, hookTimeout)
	}
	byID := make(map[int64]feedEvent, len(feed))
	for _, e := range feed {
		byID[e.ID] = e
	}
	seen := map[int64]bool{}
	lastSeq := map[string]int64{}
	var lastID int64
	for _, a := range s.Arrivals {
		e, ok := byID[a.ID]
		if !ok || e.Type != a.Type || e.SKU != a.SKU || e.Seq != a.Seq {
			sc.Foreign++
			hc.problem("%s: delivered event %d (%s %s seq %d) is not the feed's (%+v)", s.ID, a.ID, a.Type, a.SKU, a.Seq, e)
			continue
		}
		if !s.wants(e) {
			sc.Foreign++
			hc.problem("%s: delivered event %d (%s %s) it did not ask for", s.ID, e.ID, e.Type, e.SKU)
			continue
		}
		if seen[a.ID] {
			sc.Duplicates++
			continue
		}
		seen[a.ID] = true
		var wrong string
		switch {
		case a.Seq <= lastSeq[a.SKU]:
			wrong = fmt.Sprintf("%s: %s seq %d (event %d) first delivered after seq %d", s.ID, a.SKU, a.Seq, a.ID, lastSeq[a.SKU])
		case a.ID < lastID:
			wrong = fmt.Sprintf("%s: event %d first delivered after event %d", s.ID, a.ID, lastID)
		}
		if wrong != "" {
			if sc.OutOfOrder++; sc.OutOfOrder <= maxListed {
				hc.problem("%s", wrong)
			}
		}
		lastSeq[a.SKU] = max(lastSeq[a.SKU], a.Seq)
		lastID = max(lastID, a.ID)
	}
	if sc.OutOfOrder > maxListed {
		hc.problem("%s: %d more first deliveries out of order", s.ID, sc.OutOfOrder-maxListed)
	}
	var missing []int64
	for _, e := range feed {
		if s.wants(e) {
			sc.Expected++
			if seen[e.ID] {
				sc.Delivered++
			} else {
				missing = append(missing, e.ID)
			}
		}
	}
	sc.Missing = len(missing)
	if len(missing) > 0 {
		hc.problem("%s: %d events of the feed never delivered (ids %v)", s.ID, len(missing), head(missing, 10))
	}
	return sc
}

// maxListed bounds the deliveries out of order a subscription's problems
// name one by one.
const maxListed = 5

func head[T any](s []T, n int) []T { return s[:min(n, len(s))] }

// movement is one row of stock_movements.
type movement struct {
	ID                 int64
	SKU, Kind          string
	OnHandD, ReservedD int64
}

// expectedCrossings replays a SKU's movements in id order by the
// arbiter's rule (arbiter.Crossed): the first (its creation) sets what is
// announced without an event, as the arbiter's Set does; each later one
// announces what it crosses. The
// threshold is the SKU's last (hooksBefore puts it before any sale, above
// what is available then, so it crosses nothing when put).
func expectedCrossings(moves []movement, threshold int64) []string {
	var onHand, reserved, flags int64
	out := []string{}
	for i, m := range moves {
		onHand += m.OnHandD
		reserved += m.ReservedD
		now, events := arbiter.Crossed(flags, onHand, reserved, threshold)
		if i > 0 {
			out = append(out, events...)
		}
		flags = now
	}
	return out
}

// judgeCrossings holds each SKU's threshold events in the feed (seq
// order) to the crossings its movements make, and checks the feed's seqs
// run 1, 2, 3, ... per SKU with no gap.
func judgeCrossings(feed []feedEvent, moves map[string][]movement, thresholds map[string]int64, hc *HookCheck) {
	bySKU := map[string][]feedEvent{}
	for _, e := range feed {
		bySKU[e.SKU] = append(bySKU[e.SKU], e)
	}
	for _, sku := range slices.Sorted(maps.Keys(moves)) {
		evs := bySKU[sku]
		sort.Slice(evs, func(i, j int) bool { return evs[i].Seq < evs[j].Seq })
		got := []string{}
		for i, e := range evs {
			if e.Seq != int64(i+1) {
				hc.problem("%s: the feed's %d-th event has seq %d (a gap, or events missing from the feed)", sku, i+1, e.Seq)
				break
			}
		}
		for _, e := range evs {
			if slices.Contains(thresholdEvents, e.Type) {
				got = append(got, e.Type)
			}
		}
		want := expectedCrossings(moves[sku], thresholds[sku])
		hc.SKUs++
		hc.Crossings += len(want)
		if !slices.Equal(got, want) {
			i := 0
			for i < len(got) && i < len(want) && got[i] == want[i] {
				i++
			}
			hc.problem("%s: threshold events %s, its %d movements cross %s (first difference at #%d: feed %s, movements %s)",
				sku, summary(got), len(moves[sku]), summary(want), i+1, at(got, i), at(want, i))
		}
	}
	for sku := range bySKU {
		if _, ok := moves[sku]; !ok {
			hc.problem("%s: events in the feed, no movements", sku)
		}
	}
}

// summary counts event types: "3 sku.sold_out, 2 sku.back_in_stock".
func summary(types []string) string {
	n := map[string]int{}
	for _, t := range types {
		n[t]++
	}
	var parts []string
	for _, t := range slices.Sorted(maps.Keys(n)) {
		parts = append(parts, fmt.Sprintf("%d %s", n[t], t))
	}
	if len(parts) == 0 {
		return "none"
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func at(s []string, i int) string {
	if i < len(s) {
		return s[i]
	}
	return "(end)"
}

// hooksInspect waits for the receivers to catch up, then judges.
func hooksInspect(ctx context.Context, r *Run, v *Verdict) {
	hc := &HookCheck{}
	v.Webhooks = hc
	defer func() {
		for _, p := range hc.Problems {
			v.problem("webhooks: %s", p)
		}
	}()
	h := r.hooks
	logs := func() []subLog {
		var out []subLog
		for _, s := range h.subs {
			s.rc.mu.Lock()
			out = append(out, subLog{ID: s.ID, Events: s.Events, SKUs: s.SKUs, From: s.From, Arrivals: slices.Clone(s.rc.log),
				Refused: slices.Clone(s.rc.refused), Overdue: s.rc.overdue})
			s.rc.mu.Unlock()
		}
		return out
	}
	// Caught up: every event written and published (no SKU waits for its
	// level_changed), and every one a subscription asked for stored.
	began := time.Now()
	var feed []feedEvent
	for {
		var err error
		if feed, err = readFeed(ctx, r.fleet[0].URL(), r.client.secrets.Client); err != nil {
			hc.problem("reading the feed: %v", err)
			return
		}
		var dirty, unpublished int64
		if err := r.db.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM skus WHERE level_dirty = 1),
			(SELECT COUNT(*) FROM stock_events WHERE id IS NULL)`).Scan(&dirty, &unpublished); err != nil {
			hc.problem("reading the events' state: %v", err)
			return
		}
		waiting := 0
		for _, s := range logs() {
			sc := judgeDeliveries(feed, s, &HookCheck{})
			waiting += sc.Missing
		}
		if dirty+unpublished == 0 && waiting == 0 {
			break
		}
		if time.Since(began) > hookWait {
			r.note("after %s: %d SKUs await their level event, %d events their feed id, %d deliveries missing", hookWait, dirty, unpublished, waiting)
			break
		}
		sleep(ctx, 500*time.Millisecond)
	}
	hc.Waited, hc.Events = time.Since(began), len(feed)
	for _, s := range logs() {
		hc.Subs = append(hc.Subs, judgeDeliveries(feed, s, hc))
	}
	moves, thresholds, err := readMovements(ctx, r.db)
	if err != nil {
		hc.problem("reading the movements: %v", err)
		return
	}
	judgeCrossings(feed, moves, thresholds, hc)

	// No request waited on the receiver: every answer to one sent while
	// it was down, slow or failing came within answerLimit.
	r.mu.Lock()
	phases := slices.Clone(r.phases)
	r.mu.Unlock()
	for _, s := range r.stats.snapshot() {
		for _, p := range phases {
			if s.cut || s.start.Before(p.From) || !s.start.Before(p.To) {
				continue
			}
			hc.Phases++
			if s.latency() > hc.Slowest {
				hc.Slowest = s.latency()
			}
			if s.latency() > answerLimit {
				hc.Slow++
				v.timingProblem("%s, while the %s: %s > %s", s.what(), p.What, round(s.latency()), answerLimit)
			}
		}
	}
	if hc.Phases == 0 {
		hc.problem("no request was sent while the flaky receiver was down, slow or failing: nothing to measure")
	}

	// What the kill did to the flaky subscription: how long its
	// deliveries paused, and what came again.
	if fl := h.sub("flaky"); fl != nil && !h.killedAt.IsZero() {
		var next time.Time
		again := 0 // redeliveries after the kill
		seen := map[int64]bool{}
		for _, a := range fl.rc.arrivals() {
			if a.At.After(h.killedAt) {
				if next.IsZero() {
					next = a.At
				}
				if seen[a.ID] {
					again++
				}
			}
			seen[a.ID] = true
		}
		if next.IsZero() {
			r.note("after %s's kill the flaky receiver got nothing more", h.killed)
		} else {
			r.note("after %s's kill the flaky receiver's next delivery came %s later; %d events delivered again after it",
				h.killed, round(next.Sub(h.killedAt)), again)
		}
	}
	for _, s := range h.subs {
		s.rc.mu.Lock()
		r.note("%s receiver answered: %v", s.ID, s.rc.answered)
		s.rc.mu.Unlock()
	}
	r.note("%s", hc.line())
}

// readMovements reads every SKU's movement history in position order (the
// order its changes committed in), and the SKUs' thresholds.
func readMovements(ctx context.Context, db *sql.DB) (map[string][]movement, map[string]int64, error) {
	moves := map[string][]movement{}
	if err := scan(ctx, db, `SELECT id, sku, kind, on_hand_delta, reserved_delta FROM stock_movements ORDER BY sku, position`, func(rows *sql.Rows) error {
		var m movement
		err := rows.Scan(&m.ID, &m.SKU, &m.Kind, &m.OnHandD, &m.ReservedD)
		moves[m.SKU] = append(moves[m.SKU], m)
		return err
	}); err != nil {
		return nil, nil, err
	}
	thresholds := map[string]int64{}
	err := scan(ctx, db, `SELECT sku, low_stock_threshold FROM skus`, func(rows *sql.Rows) error {
		var sku string
		var t int64
		err := rows.Scan(&sku, &t)
		thresholds[sku] = t
		return err
	})
	return moves, thresholds, err
}
