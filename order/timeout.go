package order

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/acme/inventory/stock"
)

// The delay queue lives under one hash tag so its scripts run on Redis Cluster.
const (
	dueKey       = "inv:{timeouts}:due"     // zset order id -> deadline (unix ms)
	claimedKey   = "inv:{timeouts}:claimed" // zset order id -> lease end (unix ms)
	sweepLockKey = "inv:{timeouts}:sweeplock"
)

// claimScript hands due orders to one poller.
//
//	KEYS[1] due  KEYS[2] claimed
//	ARGV[1] now (unix ms)  ARGV[2] limit  ARGV[3] lease (ms)
//
// Moves up to limit entries whose deadline passed, plus claims whose lease
// ran out (their poller died), into claimed with a new lease, atomically, so
// two pollers never claim the same entry. Returns {next, id...}: next is the
// earliest score left in either set as a decimal string ("-1" when both are
// empty).
var claimScript = redis.NewScript(`
local now, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)
if #out < limit then
  local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, limit - #out)
  for _, id in ipairs(due) do
    redis.call('ZREM', KEYS[1], id)
    out[#out + 1] = id
  end
end
local lease = now + tonumber(ARGV[3])
for _, id in ipairs(out) do redis.call('ZADD', KEYS[2], lease, id) end
local next = -1
for _, k in ipairs(KEYS) do
  local head = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
  if head[2] and (next == -1 or tonumber(head[2]) < next) then next = tonumber(head[2]) end
end
table.insert(out, 1, string.format('%d', next))
return out
`)

// TimeoutConfig tunes the timeout release. Zero values take the defaults.
type TimeoutConfig struct {
	// MaxPollWait bounds the poller's sleep when nothing is due soon (and so
	// sets how often an idle poller calls Redis). Default 1s.
	MaxPollWait time.Duration
	// ClaimBatch bounds the orders one claim takes. Default 100.
	ClaimBatch int
	// Lease is how long a claimed order is left to its poller before another
	// may take it. Default 30s.
	Lease time.Duration
	// SweepInterval is the period of the database sweep. Default 30s.
	SweepInterval time.Duration
	// SweepBatch bounds the rows one sweep query reads. Default 500.
	SweepBatch int
	// SweepLockTTL is the sweep lock's expiry (renewed while a sweep runs). Default 15s.
	SweepLockTTL time.Duration
	// RunTimeout bounds one poll or sweep round. Default 1m.
	RunTimeout time.Duration
	Now        func() time.Time
	Logger     *slog.Logger
}

func (c *TimeoutConfig) validate() error {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.MaxPollWait, time.Second)
	def(&c.Lease, 30*time.Second)
	def(&c.SweepInterval, 30*time.Second)
	def(&c.SweepLockTTL, 15*time.Second)
	def(&c.RunTimeout, time.Minute)
	if c.ClaimBatch == 0 {
		c.ClaimBatch = 100
	}
	if c.SweepBatch == 0 {
		c.SweepBatch = 500
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MaxPollWait < time.Millisecond || c.Lease < time.Second || c.SweepInterval < 10*time.Millisecond ||
		c.SweepLockTTL < 300*time.Millisecond || c.RunTimeout <= 0 || c.ClaimBatch < 1 || c.SweepBatch < 1 {
		return fmt.Errorf("order: invalid timeout config %+v", *c)
	}
	return nil
}

// Timeouts releases unpaid orders at their deadline: a Redis delay queue fires
// each order, and a database sweep, run by one node at a time under the
// distributed lock, catches whatever the queue missed (Redis lost it, a poller
// died) and releases expired token-API reservations.
type Timeouts struct {
	svc *Service
	rdb redis.UniversalClient
	cfg TimeoutConfig

	// Expired counts the orders this node expired; Reaped the token-API
	// reservations it released; Polls the claim calls it made to Redis.
	Expired atomic.Int64
	Reaped  atomic.Int64
	Polls   atomic.Int64

	run  runner
	wake chan struct{}
}

func NewTimeouts(svc *Service, rdb redis.UniversalClient, cfg TimeoutConfig) (*Timeouts, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Timeouts{svc: svc, rdb: rdb, cfg: cfg, wake: make(chan struct{}, 1)}, nil
}

// Schedule puts o on the delay queue at its deadline (Service.OnCreated).
// Losing this write is safe: the sweep finds the order in the database.
func (t *Timeouts) Schedule(ctx context.Context, o *Order) {
	if err := t.rdb.ZAdd(ctx, dueKey, dueAt(o)).Err(); err != nil {
		t.cfg.Logger.Warn("timeout: scheduling failed; the sweep will release the order", "order", o.ID, "err", err)
		return
	}
	select { // the poller may be sleeping past this deadline
	case t.wake <- struct{}{}:
	default:
	}
}

// dueAt is o's queue entry: its deadline rounded up to the millisecond, so
// it is never claimed before the database agrees it is due.
func dueAt(o *Order) redis.Z {
	return redis.Z{Score: float64((o.ExpiresAt.UnixMicro() + 999) / 1000), Member: o.ID}
}

// PollOnce claims the due orders and expires them. It returns how many it
// expired and when the next entry is due (zero if none).
func (t *Timeouts) PollOnce(ctx context.Context) (int, time.Time, error) {
	t.Polls.Add(1)
	now := t.cfg.Now()
	res, err := claimScript.Run(ctx, t.rdb, []string{dueKey, claimedKey},
		now.UnixMilli(), t.cfg.ClaimBatch, t.cfg.Lease.Milliseconds()).StringSlice()
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("timeout: claim: %w", err)
	}
	var next time.Time
	if ms, _ := strconv.ParseInt(res[0], 10, 64); ms >= 0 {
		next = time.UnixMilli(ms)
	}
	expired := 0
	var errs []error
	for _, id := range res[1:] {
		ok, err := t.svc.Expire(ctx, id)
		if err == nil && !ok {
			err = t.requeueIfEarly(ctx, id)
		}
		if err != nil { // keep the claim: its lease brings it back
			errs = append(errs, err)
			continue
		}
		if ok {
			expired++
		}
		if err := t.rdb.ZRem(ctx, claimedKey, id).Err(); err != nil {
			errs = append(errs, err)
		}
	}
	t.Expired.Add(int64(expired))
	return expired, next, errors.Join(errs...)
}

// requeueIfEarly puts back an order that was claimed before this node's
// clock says it is due (clocks differ between nodes); an order that is no
// longer PENDING needs nothing.
func (t *Timeouts) requeueIfEarly(ctx context.Context, id string) error {
	o, err := t.svc.Get(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil || o.Status != Pending {
		return err
	}
	return t.rdb.ZAdd(ctx, dueKey, dueAt(o)).Err()
}

// SweepOnce expires every PENDING order past its deadline and releases every
// token-API reservation past its deadline. The caller holds the sweep lock
// (Start does that).
func (t *Timeouts) SweepOnce(ctx context.Context) (int, error) {
	expired := 0
	for {
		var ids []string
		err := t.svc.db.WithContext(ctx).Model(&Order{}).
			Where("status = ? AND expires_at <= ?", Pending, t.svc.now()).
			Order("expires_at").Limit(t.cfg.SweepBatch).Pluck("id", &ids).Error
		if err != nil {
			return expired, fmt.Errorf("timeout: sweep: %w", err)
		}
		progress := 0
		for _, id := range ids {
			ok, err := t.svc.Expire(ctx, id)
			if err != nil {
				return expired, err
			}
			if ok {
				t.Expired.Add(1)
				expired++
				progress++
			}
		}
		if len(ids) < t.cfg.SweepBatch || progress == 0 {
			break
		}
	}
	for {
		n, err := t.svc.ReleaseExpiredTokens(ctx, t.cfg.SweepBatch)
		t.Reaped.Add(int64(n))
		if err != nil || n < t.cfg.SweepBatch {
			return expired, err
		}
	}
}

// Start runs the poller and the sweeper until Stop; a second Start is a no-op.
func (t *Timeouts) Start(ctx context.Context) { t.run.start(ctx, t.pollLoop, t.sweepLoop) }

// Stop ends both loops and waits for them; safe before Start and twice.
func (t *Timeouts) Stop() { t.run.stop() }

func (t *Timeouts) pollLoop(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, t.cfg.RunTimeout)
		_, next, err := t.PollOnce(rctx)
		cancel()
		wait := t.cfg.MaxPollWait
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			t.cfg.Logger.Warn("timeout: poll failed", "err", err)
			wait = backoff/2 + rand.N(backoff/2+1)
			backoff = min(2*backoff, 10*time.Second)
		default:
			backoff = 100 * time.Millisecond
			if !next.IsZero() {
				wait = min(wait, max(next.Sub(t.cfg.Now()), time.Millisecond))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.wake:
		case <-time.After(wait):
		}
	}
}

func (t *Timeouts) sweepLoop(ctx context.Context) {
	for {
		// Jitter spreads the nodes' attempts; the lock picks one of them.
		select {
		case <-ctx.Done():
			return
		case <-time.After(t.cfg.SweepInterval/2 + rand.N(t.cfg.SweepInterval/2+1)):
		}
		lock, err := t.svc.stock.Locker().Obtain(ctx, sweepLockKey, t.cfg.SweepLockTTL, 0)
		if err != nil {
			if !errors.Is(err, stock.ErrLockNotObtained) && ctx.Err() == nil {
				t.cfg.Logger.Warn("timeout: sweep lock", "err", err)
			}
			continue
		}
		t.sweepHolding(ctx, lock)
	}
}

// sweepHolding runs one sweep under lock, stopping if the lock is lost.
func (t *Timeouts) sweepHolding(ctx context.Context, lock *stock.Lock) {
	rctx, cancel := context.WithTimeout(ctx, t.cfg.RunTimeout)
	defer cancel()
	lost, stop := lock.KeepAlive(rctx, t.cfg.SweepLockTTL)
	go func() {
		select {
		case <-lost:
			cancel()
		case <-rctx.Done():
		}
	}()
	n, err := t.SweepOnce(rctx)
	stop()
	_ = lock.Release(context.WithoutCancel(ctx))
	switch {
	case err != nil && !errors.Is(err, context.Canceled):
		t.cfg.Logger.Warn("timeout: sweep failed", "err", err)
	case n > 0:
		t.cfg.Logger.Info("timeout: sweep expired orders the queue missed", "orders", n)
	}
}
