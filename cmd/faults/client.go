package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/acme/inventory/internal/httpapi"
	"github.com/acme/inventory/internal/identity"
)

// Secrets are the credentials every instance of a run is configured with.
type Secrets struct {
	Admin, Client, Payment, BuyerKey string
}

func newSecrets(rng *rand.Rand) Secrets {
	hex := func() string {
		b := make([]byte, 32)
		for i := range b {
			b[i] = byte(rng.UintN(256))
		}
		return fmt.Sprintf("%x", b)
	}
	return Secrets{Admin: hex(), Client: hex(), Payment: hex(), BuyerKey: hex()}
}

func (s Secrets) env() []string {
	return []string{
		"INVENTORY_ADMIN_TOKEN=" + s.Admin, "INVENTORY_CLIENT_TOKENS=" + s.Client,
		"INVENTORY_PAYMENT_SECRET=" + s.Payment, "INVENTORY_BUYER_KEY=" + s.BuyerKey,
	}
}

// Answer is one HTTP exchange as the workload saw it: Status 0 when no
// answer came (connection refused or reset, timeout).
type Answer struct {
	Status int
	Body   map[string]any
	Header http.Header
	Err    error
	// wrote: some attempt wrote the request on a connection. net/http
	// sends a replayable request (a GET, or a POST with an
	// Idempotency-Key) again on a new connection when a kept-alive one
	// fails before the answer, so Err may be the second dial's although
	// the first attempt reached the service.
	wrote bool
}

func (a Answer) str(key string) string { s, _ := a.Body[key].(string); return s }

func (a Answer) num(key string) int64 { f, _ := a.Body[key].(float64); return int64(f) }

// code is an error answer's code ({"error":{"code":...}}).
func (a Answer) code() string {
	e, _ := a.Body["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

// message is an error answer's message.
func (a Answer) message() string {
	e, _ := a.Body["error"].(map[string]any)
	m, _ := e["message"].(string)
	return m
}

// ambiguous: the request may or may not have taken effect.
func (a Answer) ambiguous() bool { return a.Status == 0 || a.Status >= 500 }

// Client calls the instances of a run as the checkout backend, the payment
// provider and the operator would, and counts every answer.
type Client struct {
	secrets Secrets
	urls    []string
	http    *http.Client
	stats   *Stats
	hist    *History   // every stock operation and its answer, for the history check
	follow  *Followers // orders followed past their deadlines (nil: none)
}

// Followers watch every order the run placed from its deadline until it
// is no longer PENDING, reading it through the API: the history then says
// when, at the latest, each hold the timeout released was released.
type Followers struct {
	ctx context.Context // how long orders are followed (the run's late context)
	wg  sync.WaitGroup
}

// followPoll is how often a followed order is read after its deadline.
const followPoll = 150 * time.Millisecond

// followOrder reads order id from just after its deadline until it is no
// longer PENDING (or the run's late context ends).
func (c *Client) followOrder(id string, deadline time.Time) {
	f := c.follow
	if f == nil || id == "" {
		return
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		sleep(f.ctx, time.Until(deadline)+30*time.Millisecond)
		for i := 0; f.ctx.Err() == nil; i++ {
			a := c.doAt(f.ctx, c.urls[i%len(c.urls)], http.MethodGet, "/v1/orders/"+id, nil, c.clientHeader())
			if a.Status == http.StatusNotFound || a.Status == http.StatusOK && a.str("status") != "PENDING" {
				return
			}
			sleep(f.ctx, followPoll)
		}
	}()
}

// Stats counts operations and 5xx answers by status, and keeps when each
// request was sent and answered.
type Stats struct {
	mu       sync.Mutex
	ops      int64
	noAnswer map[string]int64 // requests that got no answer, by route
	byStatus map[int]int64
	samples  []sample
	errors   []failure // the first few 5xx answers but 503, each named whole
}

// failure is a 5xx answer other than 503: what it was, and the request
// id its node logged the cause under.
type failure struct {
	text, requestID string
}

// keptErrors is how many 5xx answers other than 503 a run names.
const keptErrors = 5

// failed keeps a 5xx answer other than 503 whole (the request, its
// answer's body and request id), so a failed run says where it came from.
func (s *Stats) failed(method, path string, status int, requestID string, body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.errors) < keptErrors {
		s.errors = append(s.errors, failure{fmt.Sprintf("%s %s %d (request %s): %.300s", method, path, status, requestID, body), requestID})
	}
}

// failures is what failed kept.
func (s *Stats) failures() []failure {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.errors)
}

// sample is one request: Status 0 when no answer came (the client gave up,
// or the connection failed), cut when the run's end cancelled it.
type sample struct {
	start, end time.Time
	status     int
	method     string
	route      string
	cut        bool
}

func (s sample) latency() time.Duration { return s.end.Sub(s.start) }

// limit is the longest answer that is within the request's deadline:
// answerLimit, or a count's own deadline (an import of 10,000 lines has
// minutes; one that waits out a dark database and then applies is
// answered within it).
func (s sample) limit() time.Duration {
	if s.route == countsRoute {
		return httpapi.CountTimeout
	}
	return answerLimit
}

const countsRoute = "/v1/stock/counts"

// what names the request and its answer ("POST /v1/orders 503").
func (s sample) what() string { return fmt.Sprintf("%s %s %d", s.method, s.route, s.status) }

func (s *Stats) record(status int, method, path string, start time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samples = append(s.samples, sample{start: start, end: time.Now(), status: status, method: method, route: route(path)})
	s.ops++
	if status == 0 {
		if s.noAnswer == nil {
			s.noAnswer = map[string]int64{}
		}
		s.noAnswer[route(path)]++
	}
	if s.byStatus == nil {
		s.byStatus = map[int]int64{}
	}
	s.byStatus[status]++
}

// cut records a request the end of the run cancelled before it was
// answered: not an answer, and not an operation either.
func (s *Stats) cut(method, path string, start time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samples = append(s.samples, sample{start: start, end: time.Now(), method: method, route: route(path), cut: true})
}

// snapshot is every request recorded so far.
func (s *Stats) snapshot() []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.samples)
}

// route names the kind of request a path is, to say where the faults struck.
func route(path string) string {
	for _, r := range []string{"/v1/payments/callback", "/v1/seckill", "/v1/stock/deduct", countsRoute, "/v1/stock", "/v1/skus"} {
		if strings.HasPrefix(path, r) {
			return r
		}
	}
	if strings.HasPrefix(path, "/v1/campaigns/") {
		if strings.HasSuffix(path, "/buy") {
			return "/v1/campaigns/{id}/buy"
		}
		return "/v1/campaigns/{id}"
	}
	if strings.HasPrefix(path, "/v1/orders/") {
		return "/v1/orders/{id}/..."
	}
	return path
}

// unanswered says which requests got no answer (a process died under them).
func (s *Stats) unanswered() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var parts []string
	for r, n := range s.noAnswer {
		parts = append(parts, fmt.Sprintf("%s %d", r, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// fiveXX is the count of 5xx answers by status.
func (s *Stats) fiveXX() map[int]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int]int64{}
	for st, n := range s.byStatus {
		if st >= 500 {
			out[st] = n
		}
	}
	return out
}

// clientTimeout is how long the workload waits for an answer before it
// gives up: far above the 2 s every answer must come within, so a slow
// answer is measured as slow rather than hidden as none.
const clientTimeout = 30 * time.Second

func newClient(secrets Secrets, urls []string, stats *Stats, hist *History, follow *Followers) *Client {
	return &Client{secrets: secrets, urls: urls, stats: stats, hist: hist, follow: follow, http: &http.Client{
		Timeout:   clientTimeout,
		Transport: &http.Transport{MaxIdleConnsPerHost: 64, MaxConnsPerHost: 256, IdleConnTimeout: 30 * time.Second},
	}}
}

// do sends one request to the instance rng picks.
func (c *Client) do(ctx context.Context, rng *rand.Rand, method, path string, body any, header http.Header) Answer {
	return c.doAt(ctx, c.urls[rng.IntN(len(c.urls))], method, path, body, header)
}

func (c *Client) doAt(ctx context.Context, base, method, path string, body any, header http.Header) Answer {
	var raw []byte
	switch b := body.(type) {
	case nil:
	case []byte:
		raw = b
	default:
		raw, _ = json.Marshal(b)
	}
	var wrote atomic.Bool
	trace := &httptrace.ClientTrace{WroteHeaders: func() { wrote.Store(true) }}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), method, base+path, bytes.NewReader(raw))
	if err != nil {
		return Answer{Err: err}
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if raw != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	start := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			c.stats.record(0, method, path, start)
		} else {
			c.stats.cut(method, path, start)
		}
		// Cut or not, the request may have reached the service.
		c.hist.record(method, path, raw, header, start, time.Now(), Answer{Err: err, wrote: wrote.Load()})
		return Answer{Err: err, wrote: wrote.Load()}
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	end := time.Now()
	c.stats.record(resp.StatusCode, method, path, start)
	if resp.StatusCode >= 500 && resp.StatusCode != http.StatusServiceUnavailable {
		c.stats.failed(method, path, resp.StatusCode, resp.Header.Get("X-Request-Id"), data)
	}
	a := Answer{Status: resp.StatusCode, Header: resp.Header}
	_ = json.Unmarshal(data, &a.Body)
	c.hist.record(method, path, raw, header, start, end, a)
	if method == http.MethodPost && a.Status == http.StatusCreated && a.str("status") == "PENDING" {
		if deadline, err := time.Parse(time.RFC3339Nano, a.str("expires_at")); err == nil {
			c.followOrder(a.str("id"), deadline)
		}
	}
	return a
}

func (c *Client) clientHeader() http.Header {
	return http.Header{"Authorization": {"Bearer " + c.secrets.Client}}
}

func (c *Client) adminHeader() http.Header {
	return http.Header{"Authorization": {"Bearer " + c.secrets.Admin}}
}

// buyerHeader carries the client credential and the buyer's token.
func (c *Client) buyerHeader(user string) http.Header {
	tok, err := identity.Issue(c.secrets.BuyerKey, user, time.Hour)
	if err != nil {
		panic(err) // a 64-character HMAC key always signs
	}
	h := c.clientHeader()
	h.Set("X-Buyer-Token", tok)
	return h
}

// callback is a payment callback body with its signature headers at time at.
func (c *Client) callback(secret, orderID, paymentID string, at time.Time) ([]byte, http.Header) {
	body, _ := json.Marshal(map[string]string{"order_id": orderID, "payment_id": paymentID, "status": "SUCCESS"})
	ts := strconv.FormatInt(at.Unix(), 10)
	sig := fmt.Sprintf("%x", httpapi.Sign(secret, ts, body))
	return body, http.Header{"X-Timestamp": {ts}, "X-Signature": {sig}}
}

// retry repeats an idempotent request while its answer is ambiguous, as a
// careful client does, until attempts run out or ctx ends.
func (c *Client) retry(ctx context.Context, rng *rand.Rand, attempts int, send func() Answer) Answer {
	var a Answer
	for i := 0; i < attempts; i++ {
		a = send()
		if !a.ambiguous() || ctx.Err() != nil {
			return a
		}
		sleep(ctx, time.Duration(100+rng.IntN(400))*time.Millisecond)
	}
	return a
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
