// Package delivery delivers the replay feed's stock events to the webhook
// subscriptions (internal/webhooks), at least once, in feed order, so in
// per-SKU seq order, per subscription:
//
//   - every node keeps one goroutine per subscription, and the one that
//     holds the subscription's lock (lock.WebhookKey, renewed while it
//     delivers: job.Lead) delivers it; another node takes over within a
//     few seconds of its death and goes on from the cursor in the
//     database. An event whose delivery the dead node had not recorded is
//     delivered again: receivers deduplicate by X-Event-Id;
//   - a subscription's events go out one at a time, in feed id order, and
//     its cursor (webhooks.delivered_id) moves past each one delivered. The
//     first that fails stops the subscription there (head of line) until
//     its next attempt: a later event never passes an earlier one;
//   - each subscription waits on its own goroutine, deadline and backoff,
//     so a slow or dead receiver delays no other, and nothing here is on
//     a sale's path (the sale writes its events; this reads them);
//   - an attempt is a POST of the event's JSON object as the feed serves
//     it, signed like the payment callback (X-Timestamp, X-Signature =
//     hex HMAC-SHA256(secret, timestamp + "." + body)), with X-Event-Id,
//     under Timeout, following no redirect, reading at most MaxResponse of
//     the answer; 2xx is delivered. Before each attempt the target is
//     checked again (webhooks.CheckTarget: DNS can change), and unless
//     private targets are allowed the dialer connects only to an address
//     it resolved and checked itself (no rebinding between the check and
//     the connection);
//   - a failed attempt is retried after a jittered backoff doubling from
//     MinBackoff to MaxBackoff, for as long as it takes (never given up);
//     a subscription whose oldest undelivered event has failed for
//     FailingAfter is marked failing, keeps its backlog and its retries,
//     and turns active at its next success or when an operator resumes it.
package delivery

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/job"
	"github.com/acme/inventory/internal/lock"
	"github.com/acme/inventory/internal/webhooks"
)

// The delivery's defaults (README lists the variables that set them).
const (
	DefaultTimeout      = 5 * time.Second
	DefaultMinBackoff   = time.Second
	DefaultMaxBackoff   = 10 * time.Minute
	DefaultFailingAfter = 15 * time.Minute
)

// Config tunes a Job. Zero values take the defaults.
type Config struct {
	// Timeout bounds one attempt: connecting, sending, the answer's
	// status and the part of its body read. Default 5s.
	Timeout time.Duration
	// MinBackoff and MaxBackoff bound the wait after a failed attempt: it
	// doubles from MinBackoff with each failure in a row, up to
	// MaxBackoff, and is jittered (job.Jitter). Default 1s and 10m.
	MinBackoff, MaxBackoff time.Duration
	// FailingAfter is how long a subscription's oldest undelivered event
	// may keep failing before the subscription is marked failing.
	// Default 15m.
	FailingAfter time.Duration
	// Interval is how often a subscription with nothing to deliver, or
	// waiting for its next attempt, reads its state again (a resume, a
	// new event). Default 500ms.
	Interval time.Duration
	// Scan is how often the subscriptions are listed (a new one gets its
	// goroutine, a deleted one loses it). Default 1s.
	Scan time.Duration
	// Batch bounds the events read per round. Default 100.
	Batch int
	// LockTTL is each subscription's lock's expiry, renewed while a node
	// delivers it: a dead node's subscriptions move within about 1.5×
	// this. Default 2s.
	LockTTL time.Duration
	// MaxResponse bounds the bytes of an answer read (the rest is not
	// read). Default 64 KiB.
	MaxResponse int64
	Logger      *slog.Logger
	// Now is the clock of the signatures' timestamps and of the backoff
	// and failing state (tests move it). Default time.Now.
	Now func() time.Time
}

func (c *Config) defaults() {
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = DefaultMinBackoff
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	c.MaxBackoff = max(c.MaxBackoff, c.MinBackoff)
	if c.FailingAfter <= 0 {
		c.FailingAfter = DefaultFailingAfter
	}
	if c.Interval <= 0 {
		c.Interval = 500 * time.Millisecond
	}
	if c.Scan <= 0 {
		c.Scan = time.Second
	}
	if c.Batch <= 0 {
		c.Batch = 100
	}
	if c.LockTTL <= 0 {
		c.LockTTL = 2 * time.Second
	}
	if c.MaxResponse <= 0 {
		c.MaxResponse = 64 << 10
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Result is how an attempt ended (the label of
// inventory_webhook_deliveries_total).
type Result string

const (
	Delivered Result = "delivered" // the receiver answered 2xx
	Failed    Result = "failed"    // no answer in time, no connection, or an answer not 2xx
	Refused   Result = "refused"   // the target is not allowed now (webhooks.CheckTarget, the dialer's check)
)

// Results are every Result, in the order metrics list them.
var Results = []Result{Delivered, Failed, Refused}

// Stats counts this node's attempts by result.
type Stats struct {
	Delivered, Failed, Refused atomic.Int64
}

// Of is the counter of r.
func (s *Stats) Of(r Result) *atomic.Int64 {
	switch r {
	case Delivered:
		return &s.Delivered
	case Refused:
		return &s.Refused
	}
	return &s.Failed
}

// Job delivers every subscription's events.
type Job struct {
	subs   *webhooks.Service
	locker *lock.Locker
	cfg    Config
	policy webhooks.Policy
	client *http.Client
	run    job.Runner
	wake   chan struct{}

	// Stats counts this node's attempts.
	Stats Stats

	mu      sync.Mutex
	leading map[string]bool // the subscriptions this node delivers now
}

// New is the delivery of subs's subscriptions, each led under its own
// lock from locker, checking targets against subs's policy.
func New(subs *webhooks.Service, locker *lock.Locker, cfg Config) *Job {
	cfg.defaults()
	j := &Job{subs: subs, locker: locker, cfg: cfg, policy: subs.Policy(), wake: make(chan struct{}, 1), leading: map[string]bool{}}
	j.client = &http.Client{
		Transport: &http.Transport{
			Proxy:               nil, // a proxy would be what the dialer checks, not the target
			DialContext:         j.dial,
			ForceAttemptHTTP2:   true,
			MaxIdleConns:        64,
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     90 * time.Second,
			// The attempt's context bounds the handshake and the wait for the answer.
		},
		// A redirect is an answer, not 2xx: it is not followed (its target
		// was never checked).
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return j
}

// Start runs the job until Stop; a second Start is a no-op.
func (j *Job) Start(ctx context.Context) { j.run.Start(ctx, j.loop) }

// Stop ends the job and waits for it (an attempt in flight is cut short
// and not recorded: the event goes out again); safe before Start and
// twice.
func (j *Job) Stop() {
	j.run.Stop()
	j.client.CloseIdleConnections()
}

// Wake makes the job list the subscriptions now (after a put).
func (j *Job) Wake() {
	select {
	case j.wake <- struct{}{}:
	default:
	}
}

// Leading says whether this node delivers subscription id now.
func (j *Job) Leading(id string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.leading[id]
}

// worker is one subscription's goroutine on this node.
type worker struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// loop keeps one worker per subscription: it starts one for each new
// subscription and stops the workers of deleted ones.
func (j *Job) loop(ctx context.Context) {
	workers := map[string]*worker{}
	defer func() {
		for _, w := range workers {
			w.cancel()
		}
		for _, w := range workers {
			<-w.done
		}
	}()
	for ctx.Err() == nil {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ids, err := j.subs.IDs(lctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				j.cfg.Logger.Warn("webhooks: listing subscriptions failed", "err", err)
			}
		} else {
			live := map[string]bool{}
			for _, id := range ids {
				live[id] = true
				if workers[id] == nil {
					wctx, cancel := context.WithCancel(ctx)
					w := &worker{cancel: cancel, done: make(chan struct{})}
					workers[id] = w
					go func() {
						defer close(w.done)
						job.Lead(wctx, job.Lock{Locker: j.locker, Key: lock.WebhookKey(id), TTL: j.cfg.LockTTL, Log: j.cfg.Logger},
							func(ctx context.Context) { j.lead(ctx, id) })
					}()
				}
			}
			for id, w := range workers {
				if !live[id] {
					w.cancel()
					<-w.done
					delete(workers, id)
				}
			}
		}
		job.Sleep(ctx, j.cfg.Scan, j.wake)
	}
}

// lead delivers subscription id while this node holds its lock (ctx ends
// when the lock is lost).
func (j *Job) lead(ctx context.Context, id string) {
	j.setLeading(id, true)
	defer j.setLeading(id, false)
	trouble := job.Backoff{Min: j.cfg.Interval, Max: 5 * time.Second} // the database's, not the receiver's
	for ctx.Err() == nil {
		wait, err := j.round(ctx, id)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, inventory.ErrNotFound):
			return // deleted: the loop stops this worker
		case err != nil:
			j.cfg.Logger.Warn("webhooks: delivery round failed", "webhook", id, "err", err)
			wait = trouble.Next()
		default:
			trouble.Reset()
		}
		job.Sleep(ctx, wait, nil)
	}
}

func (j *Job) setLeading(id string, on bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if on {
		j.leading[id] = true
	} else {
		delete(j.leading, id)
	}
}

// round reads subscription id and delivers what is due of its backlog, in
// feed order, up to its first failure; it returns how long to wait before
// the next round.
func (j *Job) round(ctx context.Context, id string) (time.Duration, error) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	t, err := j.subs.Target(rctx, id)
	cancel()
	if err != nil {
		return 0, err
	}
	if now := j.cfg.Now(); t.NextAttemptAt != nil && now.Before(*t.NextAttemptAt) {
		return min(t.NextAttemptAt.Sub(now), j.cfg.Interval), nil // read again: a resume makes it due now
	}
	rctx, cancel = context.WithTimeout(ctx, 5*time.Second)
	events, head, err := j.subs.Pending(rctx, t, j.cfg.Batch)
	cancel()
	if err != nil {
		return 0, err
	}
	for _, e := range events {
		res, aerr := j.attempt(ctx, t, e)
		if ctx.Err() != nil {
			return 0, nil // stopped, or the lock was lost: nothing recorded, the event goes out again
		}
		j.Stats.Of(res).Add(1)
		if res == Delivered {
			if err := j.record(ctx, func(ctx context.Context) error {
				return j.subs.Delivered(ctx, id, *e.ID, j.cfg.Now())
			}); err != nil {
				return 0, err
			}
			t.DeliveredID, t.Attempts, t.FailingSince, t.NextAttemptAt = *e.ID, 0, nil, nil
			continue
		}
		return 0, j.failed(ctx, t, e, res, aerr)
	}
	if len(events) < j.cfg.Batch {
		if head > t.DeliveredID {
			// Every event up to head it subscribed to was among these.
			if err := j.record(ctx, func(ctx context.Context) error { return j.subs.Skip(ctx, id, head) }); err != nil {
				return 0, err
			}
		}
		return j.cfg.Interval, nil
	}
	return 0, nil // a full batch: more may wait
}

// record writes a delivery's outcome: not cut short by ctx ending (the
// attempt was made), bounded all the same.
func (j *Job) record(ctx context.Context, write func(context.Context) error) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return write(wctx)
}

// failed records a failed or refused attempt at e: the backoff, and the
// failing state once the oldest undelivered event has failed for
// FailingAfter.
func (j *Job) failed(ctx context.Context, t *webhooks.Target, e arbiter.Event, res Result, cause error) error {
	now := j.cfg.Now()
	f := webhooks.Failure{At: now, Attempts: t.Attempts + 1, Since: now, Error: fmt.Sprintf("%s: event %d: %v", res, *e.ID, cause)}
	if t.FailingSince != nil {
		f.Since = *t.FailingSince
	}
	f.Failing = now.Sub(f.Since) >= j.cfg.FailingAfter
	f.Next = now.Add(Backoff(j.cfg.MinBackoff, j.cfg.MaxBackoff, f.Attempts))
	j.cfg.Logger.Warn("webhooks: delivery failed; retried later", "webhook", t.ID, "event", *e.ID, "result", string(res),
		"attempts", f.Attempts, "failing", f.Failing, "next_attempt_at", f.Next, "err", cause)
	return j.record(ctx, func(ctx context.Context) error { return j.subs.Failed(ctx, t.ID, t.DeliveredID, f) })
}

// Backoff is the wait before the next attempt after attempts failed ones
// in a row: lo doubled per failure after the first, capped at hi, and
// jittered into [d/2, d] (job.Jitter).
func Backoff(lo, hi time.Duration, attempts int) time.Duration {
	d := lo
	for i := 1; i < attempts && d < hi; i++ {
		d *= 2
	}
	return job.Jitter(min(d, hi))
}

// Body is the body of e's delivery: webhooks.Body, whose JSON object is
// the one the replay feed serves for e (no HTML escaping, no trailing
// newline).
func Body(e arbiter.Event) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(webhooks.BodyOf(e)); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// attempt makes one delivery of e to t.
func (j *Job) attempt(ctx context.Context, t *webhooks.Target, e arbiter.Event) (Result, error) {
	if err := webhooks.CheckTarget(ctx, t.URL, j.policy); err != nil {
		return Refused, err
	}
	body, err := Body(e)
	if err != nil {
		return Failed, err
	}
	actx, cancel := context.WithTimeout(ctx, j.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, t.URL, bytes.NewReader(body))
	if err != nil {
		return Failed, err
	}
	ts := strconv.FormatInt(j.cfg.Now().Unix(), 10)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "inventoryd-webhooks")
	req.Header.Set("X-Event-Id", strconv.FormatInt(*e.ID, 10))
	req.Header.Set("X-Timestamp", ts)
	req.Header.Set("X-Signature", fmt.Sprintf("%x", inventory.Sign(t.Secret, ts, body)))
	resp, err := j.client.Do(req)
	if err != nil {
		if errors.Is(err, errRefused) {
			return Refused, err
		}
		return Failed, err
	}
	defer resp.Body.Close()
	// Read a bounded part, so a well-behaved receiver's connection is
	// reused; a longer answer is cut off, unread.
	_, rerr := io.Copy(io.Discard, io.LimitReader(resp.Body, j.cfg.MaxResponse))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return Failed, fmt.Errorf("the receiver answered %s", resp.Status)
	}
	if rerr != nil && actx.Err() != nil {
		return Failed, fmt.Errorf("the receiver answered %s but its body did not end within the deadline", resp.Status)
	}
	return Delivered, nil
}

// errRefused is a connection the dialer would not make.
var errRefused = errors.New("refused")

// dial connects to an address of addr's host the policy allows: unless
// private targets are allowed, it resolves the host itself, refuses if
// any address is not public (as CheckTarget does), and connects to the
// addresses it checked, so a name that resolves to a public address for
// the check and a private one a moment later is never connected to.
func (j *Job) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: j.cfg.Timeout, KeepAlive: 30 * time.Second}
	if j.policy.AllowPrivate {
		return d.DialContext(ctx, network, addr)
	}
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("port %q: %w", portText, err)
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		var r interface {
			LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
		} = net.DefaultResolver
		if j.policy.Resolver != nil {
			r = j.policy.Resolver
		}
		if addrs, err = r.LookupNetIP(ctx, "ip", host); err != nil {
			return nil, err
		}
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%s has no address", host)
	}
	for _, a := range addrs {
		if !webhooks.Public(a) {
			return nil, fmt.Errorf("%w: %s resolves to %s, a loopback, private, link-local or metadata address", errRefused, host, a)
		}
	}
	var errs []error
	for _, a := range addrs {
		conn, err := d.DialContext(ctx, network, netip.AddrPortFrom(a.Unmap(), uint16(port)).String())
		if err == nil {
			return conn, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}
