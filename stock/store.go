package stock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"
)

// Config tunes a Store. Only Init is required.
type Config struct {
	// Init reads a cold SKU from the database.
	Init InitFunc
	// HoldTTL is how long an unpaid hold lives before the timeout release may
	// give it back (the order TTL plus a grace period). Default 16m.
	HoldTTL time.Duration
	// TombstoneTTL is how long a finished token (released or sold) is
	// remembered, so late replays take nothing and a refund can give back a
	// sale. Default 7 days.
	TombstoneTTL time.Duration
	// MaxQty bounds one line's quantity. Default DefaultMaxQty.
	MaxQty int64
	// InitWait bounds how long a caller waits for another caller's cold init
	// before giving up with ErrUnavailable. Default 3s.
	InitWait time.Duration
	// LockTTL is the cold-init lock's expiry. Default 5s.
	LockTTL time.Duration
	// Now is the clock for hold deadlines. Default time.Now.
	Now func() time.Time
	// Logger reports anomalies (a cold init that had to clamp at zero).
	Logger *slog.Logger
	// OnStockBack is told when units of a SKU may have come back (a release,
	// a positive adjustment, a reset), so sold-out flags on every node can clear.
	OnStockBack func(sku string)
}

func (c *Config) setDefaults() error {
	if c.Init == nil {
		return errors.New("stock: Config.Init is required")
	}
	if c.HoldTTL == 0 {
		c.HoldTTL = 16 * time.Minute
	}
	if c.TombstoneTTL == 0 {
		c.TombstoneTTL = 7 * 24 * time.Hour
	}
	if c.MaxQty == 0 {
		c.MaxQty = DefaultMaxQty
	}
	if c.InitWait == 0 {
		c.InitWait = 3 * time.Second
	}
	if c.LockTTL == 0 {
		c.LockTTL = 5 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.OnStockBack == nil {
		c.OnStockBack = func(string) {}
	}
	if c.HoldTTL < time.Second || c.TombstoneTTL < c.HoldTTL || c.MaxQty < 1 || c.InitWait <= 0 || c.LockTTL < 100*time.Millisecond {
		return fmt.Errorf("stock: invalid config (HoldTTL %s, TombstoneTTL %s, MaxQty %d, InitWait %s, LockTTL %s)",
			c.HoldTTL, c.TombstoneTTL, c.MaxQty, c.InitWait, c.LockTTL)
	}
	return nil
}

// Store is the Redis side of the stock: works on a single Redis and on Redis
// Cluster alike.
type Store struct {
	rdb    redis.UniversalClient
	cfg    Config
	locker *Locker
	inits  singleflight.Group
	stats  Stats
}

// Stats counts what a Store did, for metrics.
type Stats struct {
	Deducted     atomic.Int64 // deductions that took units (replays included)
	Unlimited    atomic.Int64 // deductions of unlimited SKUs
	Insufficient atomic.Int64 // deductions refused for lack of stock
	ColdInits    atomic.Int64 // cold inits this process performed
	InitWaits    atomic.Int64 // times this process waited for another's cold init
	Released     atomic.Int64 // units given back
}

// Stats returns the Store's counters.
func (s *Store) Stats() *Stats { return &s.stats }

func NewStore(rdb redis.UniversalClient, cfg Config) (*Store, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &Store{rdb: rdb, cfg: cfg, locker: NewLocker(rdb)}, nil
}

// Deduct takes qty units of sku for token. It returns the units left (n >= 0)
// or Unlimited. Replaying a token that holds or sold its units takes nothing
// and returns the first call's result. Errors: ErrInvalidArgument,
// ErrInsufficientStock, ErrTokenReleased, ErrUnknownSKU, ErrUnavailable.
func (s *Store) Deduct(ctx context.Context, sku string, qty int64, token string) (int64, error) {
	if err := s.validate(sku, token, qty); err != nil {
		return 0, err
	}
	keys := tokenKeys(sku, token)
	deadline := s.cfg.Now().Add(s.cfg.HoldTTL).UnixMilli()
	// A key can be lost again right after it was initialised (FLUSHALL in a
	// loop); three rounds bound the work.
	for round := 0; round < 3; round++ {
		r, err := deductScript.Run(ctx, s.rdb, keys, token, qty, deadline).Int64()
		if err != nil {
			return 0, fmt.Errorf("stock: deduct %s: %w", sku, err)
		}
		if r == resNotInitialised {
			if err := s.ensureInit(ctx, sku); err != nil {
				return 0, err
			}
			continue
		}
		return s.deductResult(r)
	}
	return 0, fmt.Errorf("%w: %s keeps losing its key", ErrUnavailable, sku)
}

// Request is one deduction of a batch.
type Request struct {
	SKU   string
	Qty   int64
	Token string
}

// Result is what Deduct would have returned for one Request.
type Result struct {
	Remaining int64
	Err       error
}

// DeductMany runs many deductions in one round trip (a pipeline of EVALSHA),
// for callers that batch requests. Each result is what Deduct returns for its
// request; a SKU that is not initialised is initialised and retried alone.
func (s *Store) DeductMany(ctx context.Context, reqs []Request) []Result {
	out := make([]Result, len(reqs))
	deadline := s.cfg.Now().Add(s.cfg.HoldTTL).UnixMilli()
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(reqs))
	for i, r := range reqs {
		if err := s.validate(r.SKU, r.Token, r.Qty); err != nil {
			out[i].Err = err
			continue
		}
		cmds[i] = deductScript.EvalSha(ctx, pipe, tokenKeys(r.SKU, r.Token), r.Token, r.Qty, deadline)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command below
	for i, cmd := range cmds {
		if cmd == nil {
			continue
		}
		n, err := cmd.Int64()
		if err != nil || n == resNotInitialised {
			// NOSCRIPT (first use on this server) or a cold SKU: the one-off path.
			out[i].Remaining, out[i].Err = s.Deduct(ctx, reqs[i].SKU, reqs[i].Qty, reqs[i].Token)
			continue
		}
		out[i].Remaining, out[i].Err = s.deductResult(n)
	}
	return out
}

// deductResult turns a deduct script result (other than -3) into Deduct's
// answer, and counts it.
func (s *Store) deductResult(r int64) (int64, error) {
	switch r {
	case resInsufficient:
		s.stats.Insufficient.Add(1)
		return 0, ErrInsufficientStock
	case resReleased:
		return 0, ErrTokenReleased
	case resUnlimited:
		s.stats.Unlimited.Add(1)
		return r, nil
	}
	s.stats.Deducted.Add(1)
	return r, nil
}

// Release gives back what token holds of sku (an unpaid hold, or a sale on
// refund) and returns that quantity; a second release returns 0. The token can
// take nothing afterwards.
func (s *Store) Release(ctx context.Context, sku, token string) (int64, error) {
	return s.release(ctx, sku, token, "release")
}

// Undo gives back token's unpaid hold of sku without closing the token, so
// the same token may reserve again: for rolling back a reservation whose
// order was never written.
func (s *Store) Undo(ctx context.Context, sku, token string) (int64, error) {
	return s.release(ctx, sku, token, "undo")
}

func (s *Store) release(ctx context.Context, sku, token, mode string) (int64, error) {
	if err := s.validate(sku, token, 1); err != nil {
		return 0, err
	}
	q, err := releaseScript.Run(ctx, s.rdb, tokenKeys(sku, token), token, s.cfg.TombstoneTTL.Milliseconds(), mode).Int64()
	if err != nil {
		return 0, fmt.Errorf("stock: release %s: %w", sku, err)
	}
	if q > 0 {
		s.stats.Released.Add(q)
		s.cfg.OnStockBack(sku)
	}
	return q, nil
}

// Confirm turns token's unpaid hold of sku into a sale (the order was paid)
// and returns its quantity; a replay returns it again. An unlimited SKU
// confirms 0. Errors: ErrTokenReleased, ErrNotHeld (Redis lost the hold, or
// there never was one: re-reserve with Deduct).
func (s *Store) Confirm(ctx context.Context, sku, token string) (int64, error) {
	if err := s.validate(sku, token, 1); err != nil {
		return 0, err
	}
	q, err := confirmScript.Run(ctx, s.rdb, tokenKeys(sku, token), token, s.cfg.TombstoneTTL.Milliseconds()).Int64()
	if err != nil {
		return 0, fmt.Errorf("stock: confirm %s: %w", sku, err)
	}
	switch q {
	case resReleased:
		return 0, ErrTokenReleased
	case resNotHeld:
		return 0, ErrNotHeld
	}
	return q, nil
}

// DeductCart reserves every line for token, or none. Lines are taken in SKU
// order and, if one fails, the lines already taken are undone (without a
// tombstone, so the same token may try again). This holds on Redis Cluster,
// where a cart's SKUs live in different slots and no single script can see
// them all. The result maps each SKU to what Deduct returned for it. If the
// process dies half way, the taken lines are holds like any other and the
// timeout release gives them back.
func (s *Store) DeductCart(ctx context.Context, token string, lines []Line) (map[string]int64, error) {
	if err := ValidateToken(token); err != nil {
		return nil, err
	}
	cart, err := s.NormaliseCart(lines)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(cart))
	for i, l := range cart {
		r, err := s.Deduct(ctx, l.SKU, l.Qty, token)
		if err != nil {
			if uerr := s.undo(context.WithoutCancel(ctx), token, cart[:i]); uerr != nil {
				return nil, fmt.Errorf("%w (and undoing the cart failed: %v)", err, uerr)
			}
			return nil, fmt.Errorf("%s: %w", l.SKU, err)
		}
		out[l.SKU] = r
	}
	return out, nil
}

func (s *Store) undo(ctx context.Context, token string, taken []Line) error {
	var errs []error
	for _, l := range taken {
		if _, err := s.release(ctx, l.SKU, token, "undo"); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// NormaliseCart validates every line (before anything is touched), merges
// repeated SKUs and sorts by SKU: the form DeductCart reserves, and the form
// an order stores its lines in.
func (s *Store) NormaliseCart(lines []Line) ([]Line, error) {
	if len(lines) == 0 || len(lines) > 100 {
		return nil, invalid("a cart has 1 to 100 lines, got %d", len(lines))
	}
	merged := map[string]int64{}
	for _, l := range lines {
		if err := ValidateSKU(l.SKU); err != nil {
			return nil, err
		}
		if err := validateQty(l.Qty, s.cfg.MaxQty); err != nil {
			return nil, err
		}
		merged[l.SKU] += l.Qty
		if err := validateQty(merged[l.SKU], s.cfg.MaxQty); err != nil {
			return nil, err
		}
	}
	cart := make([]Line, 0, len(merged))
	for sku, q := range merged {
		cart = append(cart, Line{SKU: sku, Qty: q})
	}
	slices.SortFunc(cart, func(a, b Line) int { return strings.Compare(a.SKU, b.SKU) })
	return cart, nil
}

// Adjust adds delta to sku's available units in Redis after the database
// changed by delta (restock, correction). A SKU not initialised is left alone:
// its next cold init reads the new database value. Returns the new available
// value, or Unlimited; ErrInsufficientStock if a negative delta exceeds what
// is available.
func (s *Store) Adjust(ctx context.Context, sku string, delta int64) (int64, error) {
	if err := ValidateSKU(sku); err != nil {
		return 0, err
	}
	r, err := adjustScript.Run(ctx, s.rdb, []string{stockKey(sku)}, delta).Int64()
	if err != nil {
		return 0, fmt.Errorf("stock: adjust %s: %w", sku, err)
	}
	switch r {
	case resNotInitialised:
		return 0, nil
	case resInsufficient:
		return 0, ErrInsufficientStock
	}
	if delta > 0 {
		s.cfg.OnStockBack(sku)
	}
	return r, nil
}

// Forget drops sku's stock value (not its holds), so the next use
// re-initialises it from the database. Used when the database value is set
// outright or repaired.
func (s *Store) Forget(ctx context.Context, sku string) error {
	if err := ValidateSKU(sku); err != nil {
		return err
	}
	if err := s.rdb.Del(ctx, stockKey(sku)).Err(); err != nil {
		return fmt.Errorf("stock: forget %s: %w", sku, err)
	}
	s.cfg.OnStockBack(sku)
	return nil
}

// EnsureInit initialises sku from the database if Redis does not have it.
func (s *Store) EnsureInit(ctx context.Context, sku string) error {
	if err := ValidateSKU(sku); err != nil {
		return err
	}
	return s.ensureInit(ctx, sku)
}

// TakeQuota counts qty units against user's purchase limit of sku, atomically;
// false (nothing counted) if that would exceed limit.
func (s *Store) TakeQuota(ctx context.Context, sku, user string, qty, limit int64) (bool, error) {
	if err := s.validate(sku, user, qty); err != nil {
		return false, err
	}
	ok, err := quotaScript.Run(ctx, s.rdb, []string{buyersKey(sku)}, user, qty, limit).Int64()
	if err != nil {
		return false, fmt.Errorf("stock: quota %s: %w", sku, err)
	}
	return ok == 1, nil
}

// ReturnQuota gives qty units of user's limit back (the purchase failed).
func (s *Store) ReturnQuota(ctx context.Context, sku, user string, qty int64) error {
	if err := s.validate(sku, user, qty); err != nil {
		return err
	}
	return quotaScript.Run(ctx, s.rdb, []string{buyersKey(sku)}, user, -qty, 0).Err()
}

// Levels is what Redis holds for one SKU.
type Levels struct {
	Initialised bool
	Unlimited   bool
	Available   int64 // units that can be taken now
	Held        int64 // units held by unpaid reservations
}

func (s *Store) Levels(ctx context.Context, sku string) (Levels, error) {
	if err := ValidateSKU(sku); err != nil {
		return Levels{}, err
	}
	vals, err := s.rdb.MGet(ctx, stockKey(sku), heldKey(sku)).Result()
	if err != nil {
		return Levels{}, fmt.Errorf("stock: levels %s: %w", sku, err)
	}
	var lv Levels
	if v, ok := vals[0].(string); ok {
		lv.Initialised = true
		lv.Available, _ = strconv.ParseInt(v, 10, 64)
		lv.Unlimited = lv.Available == Unlimited
	}
	if v, ok := vals[1].(string); ok {
		lv.Held, _ = strconv.ParseInt(v, 10, 64)
	}
	return lv, nil
}

// Holds lists the unpaid holds Redis has for sku (for reconcile and tests).
func (s *Store) Holds(ctx context.Context, sku string) (map[string]int64, error) {
	if err := ValidateSKU(sku); err != nil {
		return nil, err
	}
	raw, err := s.rdb.HGetAll(ctx, holdsKey(sku)).Result()
	if err != nil {
		return nil, fmt.Errorf("stock: holds %s: %w", sku, err)
	}
	out := make(map[string]int64, len(raw))
	for token, v := range raw {
		var q, r int64
		if _, err := fmt.Sscanf(v, "%d:%d", &q, &r); err != nil {
			return nil, fmt.Errorf("stock: hold %s/%s is malformed: %q", sku, token, v)
		}
		out[token] = q
	}
	return out, nil
}

// Locker is the Store's lock client, for other jobs that need one.
func (s *Store) Locker() *Locker { return s.locker }

func (s *Store) validate(sku, token string, qty int64) error {
	if err := ValidateSKU(sku); err != nil {
		return err
	}
	if err := ValidateToken(token); err != nil {
		return err
	}
	return validateQty(qty, s.cfg.MaxQty)
}

// ensureInit initialises a cold SKU. Callers in this process share one
// attempt (singleflight); across processes one caller takes the init lock and
// the others wait for the key, not the database.
func (s *Store) ensureInit(ctx context.Context, sku string) error {
	ch := s.inits.DoChan(sku, func() (any, error) {
		// Detached: one caller's cancellation must not fail the others.
		ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.InitWait+s.cfg.LockTTL)
		defer cancel()
		return nil, s.initCold(ictx, sku)
	})
	select {
	case r := <-ch:
		return r.Err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Store) initCold(ctx context.Context, sku string) error {
	giveUp := time.Now().Add(s.cfg.InitWait)
	for {
		lock, err := s.locker.Obtain(ctx, initLockKey(sku), s.cfg.LockTTL, 0)
		if err == nil {
			s.stats.ColdInits.Add(1)
			err = s.initLocked(ctx, sku)
			if rerr := lock.Release(context.WithoutCancel(ctx)); rerr != nil && !errors.Is(rerr, ErrLockNotHeld) && err == nil {
				s.cfg.Logger.Warn("stock: releasing init lock", "sku", sku, "err", rerr)
			}
			return err
		}
		if !errors.Is(err, ErrLockNotObtained) {
			return fmt.Errorf("%w: init lock for %s: %v", ErrUnavailable, sku, err)
		}
		// Someone else is initialising: wait for the key, not the database.
		s.stats.InitWaits.Add(1)
		if time.Now().After(giveUp) {
			return fmt.Errorf("%w: %s is being initialised elsewhere", ErrUnavailable, sku)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %v", ErrUnavailable, ctx.Err())
		case <-time.After(5*time.Millisecond + rand.N(20*time.Millisecond)):
		}
		n, err := s.rdb.Exists(ctx, stockKey(sku)).Result()
		if err != nil {
			return fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		if n == 1 {
			return nil
		}
	}
}

// initLocked runs under the init lock: check again, read the database, write.
// The script checks a third time, atomically with the write, so even a lock
// that expired during a slow read cannot make two inits both write.
func (s *Store) initLocked(ctx context.Context, sku string) error {
	n, err := s.rdb.Exists(ctx, stockKey(sku)).Result()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if n == 1 {
		return nil
	}
	snap, err := s.cfg.Init(ctx, sku)
	if err != nil {
		if errors.Is(err, ErrUnknownSKU) {
			return err
		}
		return fmt.Errorf("%w: reading %s: %v", ErrUnavailable, sku, err)
	}
	if snap.Stock < Unlimited {
		return fmt.Errorf("%w: snapshot of %s has stock %d", ErrUnavailable, sku, snap.Stock)
	}
	keys := []string{stockKey(sku), holdsKey(sku), heldKey(sku), deadlinesKey(sku)}
	args := []any{snap.Stock, snap.Pending}
	for _, h := range snap.Holds {
		if ValidateToken(h.Token) != nil || h.Qty <= 0 {
			return fmt.Errorf("%w: snapshot of %s has an invalid hold %q", ErrUnavailable, sku, h.Token)
		}
		keys = append(keys, tombKey(sku, h.Token))
		args = append(args, h.Token, h.Qty, h.Deadline.UnixMilli())
	}
	res, err := initScript.Run(ctx, s.rdb, keys, args...).Int64Slice()
	if err != nil {
		return fmt.Errorf("%w: init %s: %v", ErrUnavailable, sku, err)
	}
	if res[0] == 1 && res[2] == 1 {
		s.cfg.Logger.Warn("stock: cold init clamped at 0: the database holds more than it has",
			"sku", sku, "db_stock", snap.Stock, "pending", snap.Pending, "holds", len(snap.Holds))
	}
	return nil
}
