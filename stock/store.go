package stock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/lock"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"
)

// Config tunes a Store. Only Init is required.
type Config struct {
	// Init reads a SKU's level from the database (cold init and realign).
	Init inventory.InitFunc
	// InitCampaign reads a campaign pool's baseline from the database (its
	// cold init and realign). Optional: without it the campaign methods
	// answer errNoCampaigns.
	InitCampaign CampaignInitFunc
	// TokenTTL is how long a token-API reservation's token is remembered in
	// Redis, so a replay goes to the database instead of taking units again.
	// Default 16m (the hold TTL).
	TokenTTL time.Duration
	// QuotaTTL is how long a SKU's per-user pre-filter (the buyers hash) is
	// kept after its last purchase. The database is the limit's record; the
	// hash only spares it repeat buyers during a sale, so it may forget
	// afterwards instead of growing with every buyer forever. Default 24h.
	QuotaTTL time.Duration
	// MaxQty bounds one line's quantity. Default DefaultMaxQty.
	MaxQty int64
	// InitWait bounds how long a caller waits for another caller's cold init
	// before giving up with ErrUnavailable. Default 3s.
	InitWait time.Duration
	// LockTTL is the cold-init lock's expiry. Default 5s.
	LockTTL time.Duration
	Logger  *slog.Logger
	// OnStockBack is told when units of a SKU may have come back (a release,
	// a positive adjustment, a realign), so sold-out flags on every node can clear.
	OnStockBack func(sku string)
	// OnCampaignBack is told when units of a campaign's pool may have come
	// back (an undo, a release into the pool, a realign). A campaign's units
	// are not the SKU's: OnStockBack is not told of them.
	OnCampaignBack func(Campaign)
	// OneCallPerAdmission sends each admission in a round trip of its own
	// instead of pipelining concurrent ones together (coalesce.go): what the
	// benchmarks' "one call per request" variants measure.
	OneCallPerAdmission bool
}

func (c *Config) setDefaults() error {
	if c.Init == nil {
		return errors.New("stock: Config.Init is required")
	}
	if c.TokenTTL == 0 {
		c.TokenTTL = 16 * time.Minute
	}
	if c.MaxQty == 0 {
		c.MaxQty = inventory.DefaultMaxQty
	}
	if c.QuotaTTL == 0 {
		c.QuotaTTL = 24 * time.Hour
	}
	if c.InitWait == 0 {
		c.InitWait = 3 * time.Second
	}
	if c.LockTTL == 0 {
		c.LockTTL = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.OnStockBack == nil {
		c.OnStockBack = func(string) {}
	}
	if c.OnCampaignBack == nil {
		c.OnCampaignBack = func(Campaign) {}
	}
	if c.TokenTTL < time.Second || c.MaxQty < 1 || c.InitWait <= 0 || c.LockTTL < 100*time.Millisecond {
		return fmt.Errorf("stock: invalid config (TokenTTL %s, MaxQty %d, InitWait %s, LockTTL %s)",
			c.TokenTTL, c.MaxQty, c.InitWait, c.LockTTL)
	}
	return nil
}

// Store is the Redis side of the stock: works on a single Redis and on Redis
// Cluster alike.
type Store struct {
	rdb    redis.UniversalClient
	cfg    Config
	locker *lock.Locker
	inits  singleflight.Group
	// realigns coalesces realigns per pool (see realign).
	realigns struct {
		sync.Mutex
		m map[string]*realignState
	}
	stats  Stats
	admits *coalescer // nil: one round trip per admission
	// stockBack is the channel of the stock-back news (stockBackChannelOf).
	stockBack string
}

// Stats counts what a Store did, for metrics.
type Stats struct {
	Deducted     atomic.Int64 // admissions that took units
	Unlimited    atomic.Int64 // admissions of unlimited SKUs
	Insufficient atomic.Int64 // admissions refused for lack of stock
	ColdInits    atomic.Int64 // cold inits this process performed
	InitWaits    atomic.Int64 // times this process waited for another's cold init
	Realigns     atomic.Int64 // forced re-initialisations (Redis was found wrong)
	Released     atomic.Int64 // units given back
	// Pipelines counts the pipelines admissions were sent in, Pipelined the
	// admissions they carried (Pipelined/Pipelines is the mean pipeline).
	Pipelines, Pipelined atomic.Int64
}

// Stats returns the Store's counters.
func (s *Store) Stats() *Stats { return &s.stats }

func NewStore(rdb redis.UniversalClient, cfg Config) (*Store, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	s := &Store{rdb: rdb, cfg: cfg, locker: lock.NewLocker(rdb), stockBack: stockBackChannelOf(rdb)}
	if !cfg.OneCallPerAdmission {
		s.admits = newCoalescer(rdb, &s.stats)
	}
	return s, nil
}

// Admission is what Redis said when it admitted a reservation.
type Admission struct {
	// Remaining is what Redis has left after taking, or Unlimited.
	Remaining int64
	// Epoch is the initialisation the units were taken from (for Undo and Apply).
	Epoch int64
}

// Admit takes qty units of sku in Redis: the admission of a reservation the
// database then arbitrates. token is a token-API reservation's key, remembered
// so a replay takes nothing (ErrReplay: ask the database); order lines pass
// "" and keep nothing per reservation in Redis. Errors: ErrInvalidArgument,
// ErrInsufficientStock, ErrReplay, ErrUnknownSKU, ErrUnavailable.
func (s *Store) Admit(ctx context.Context, sku string, qty int64, token string) (Admission, error) {
	return s.AdmitFor(ctx, sku, qty, token, s.cfg.TokenTTL)
}

// AdmitFor is Admit with token remembered for keep (a hold's length and a
// margin) instead of Config.TokenTTL.
func (s *Store) AdmitFor(ctx context.Context, sku string, qty int64, token string, keep time.Duration) (Admission, error) {
	if err := s.validate(sku, qty); err != nil {
		return Admission{}, err
	}
	if token != "" && !keyPattern.MatchString(token) {
		return Admission{}, inventory.Invalidf("token must be 1-140 characters of A-Z a-z 0-9 . _ : -")
	}
	ttl := int64(0)
	if token != "" {
		ttl = max(keep, time.Second).Milliseconds()
	}
	return s.admit(ctx, pool{sku: sku}, admitKeys(sku, token), []any{qty, ttl})
}

// KeepToken makes Redis remember token's reservation of sku for keep from
// now (a hold that was extended). A token Redis forgot stays forgotten: a
// replay then asks the database, which knows it.
func (s *Store) KeepToken(ctx context.Context, sku, token string, keep time.Duration) error {
	return s.rdb.PExpire(ctx, tokenKey(sku, token), max(keep, time.Second)).Err()
}

// ForgetToken drops Redis's memory of token's reservation of sku, so a
// replay of it asks the database (an admission of unknown outcome: the
// database may or may not have it).
func (s *Store) ForgetToken(ctx context.Context, sku, token string) error {
	key, err := validTokenKey(sku, token)
	if err != nil {
		return err
	}
	if err := s.rdb.Del(ctx, key).Err(); err != nil {
		return fmt.Errorf("stock: forget token of %s: %w", sku, err)
	}
	return nil
}

// ForgetStaleToken drops Redis's memory of token's reservation of sku if
// it was admitted longer than older ago (by Redis's clock), and reports
// whether it did: an admission whose write no live node can still be
// waiting for (its node died between the admission and the write), so a
// replay may take the units again and the database decide. One that is
// younger, or none, is left alone.
func (s *Store) ForgetStaleToken(ctx context.Context, sku, token string, older time.Duration) (bool, error) {
	key, err := validTokenKey(sku, token)
	if err != nil {
		return false, err
	}
	n, err := staleTokenScript.Run(ctx, s.rdb, []string{key}, older.Milliseconds()).Int64()
	if err != nil {
		return false, fmt.Errorf("stock: forget a stale token of %s: %w", sku, err)
	}
	return n == 1, nil
}

// validTokenKey is the key of token's reservation of sku, once both are
// valid.
func validTokenKey(sku, token string) (string, error) {
	if err := inventory.ValidateSKU(sku); err != nil {
		return "", err
	}
	if !keyPattern.MatchString(token) {
		return "", inventory.Invalidf("token must be 1-140 characters of A-Z a-z 0-9 . _ : -")
	}
	return tokenKey(sku, token), nil
}

// Buyer is a per-user limit an admission counts against.
type Buyer struct {
	User  string
	Limit int64 // > 0
}

// AdmitBuyer admits qty units of sku for b.User, within b.Limit units per
// user, in one script call: the limit's pre-filter (the buyers hash, which
// the database's record backs) and the stock are checked and taken
// together, so a sale costs one Redis round trip. The units count against
// the limit whether the SKU is limited or unlimited; a refusal counts
// nothing. Errors: Admit's (no ErrReplay), and ErrOverLimit.
func (s *Store) AdmitBuyer(ctx context.Context, sku string, qty int64, b Buyer) (Admission, error) {
	if err := s.validate(sku, qty); err != nil {
		return Admission{}, err
	}
	if err := inventory.ValidateUserID(b.User); err != nil {
		return Admission{}, err
	}
	if b.Limit <= 0 {
		return Admission{}, inventory.Invalidf("a per-user limit must be positive")
	}
	keys := append(admitKeys(sku, ""), buyersKey(sku))
	return s.admit(ctx, pool{sku: sku}, keys, []any{qty, 0, b.User, b.Limit, s.cfg.QuotaTTL.Milliseconds()})
}

// admit runs the deduction script on p's key (keys[0]), initialising p
// first if it is cold.
func (s *Store) admit(ctx context.Context, p pool, keys []string, args []any) (Admission, error) {
	// A key can be lost again right after it was initialised (FLUSHALL in a
	// loop); three rounds bound the work.
	for round := 0; round < 3; round++ {
		res, err := s.deduct(ctx, keys, args)
		if err != nil {
			return Admission{}, fmt.Errorf("stock: deduct %s: %w", p, err)
		}
		if res[0] == resNotInitialised || res[0] == resBuyersCold {
			mode := modeCold
			if res[0] == resBuyersCold {
				mode = modeBuyers
			}
			if err := s.ensurePool(ctx, p, mode); err != nil {
				return Admission{}, err
			}
			continue
		}
		return s.admission(p.String(), res[0], res[1])
	}
	return Admission{}, fmt.Errorf("%w: %s keeps losing its key", inventory.ErrUnavailable, p)
}

// deduct runs the deduction script once: in a pipeline with other callers'
// admissions, or alone.
func (s *Store) deduct(ctx context.Context, keys []string, args []any) ([]int64, error) {
	if s.admits != nil {
		return s.admits.run(ctx, keys, args)
	}
	return scriptAnswer(deductScript.Run(ctx, s.rdb, keys, args...))
}

// FollowUpGrace is how long a write's follow-ups in Redis (undoing an
// admission, giving a quota back, bringing a committed change in, realigning
// a SKU the database refused) may run past the request's deadline.
const FollowUpGrace = 500 * time.Millisecond

// FollowUp is the context of a write's follow-ups in Redis: they must not
// stop because the caller went away (an undo left undone hides units until
// the next realign), and must not keep the request much past its deadline,
// so it ends FollowUpGrace after that deadline, however late and however
// many follow-ups in turn ask for it (an undo, then a quota given back,
// then a realign: each had FollowUpGrace from its own start once, and
// together kept a refused seckill under a slow Redis answering 2 s after
// its 1 s deadline). A context without a deadline (background work) gives
// one without either.
func FollowUp(ctx context.Context) (context.Context, context.CancelFunc) {
	bg := context.WithoutCancel(ctx)
	d, ok := ctx.Deadline()
	if !ok {
		return bg, func() {}
	}
	return context.WithDeadline(bg, d.Add(FollowUpGrace))
}

// Request is one admission of a batch.
type Request struct {
	SKU string
	Qty int64
}

// Result is what Admit would have returned for one Request.
type Result struct {
	Admission
	Err error
}

// AdmitMany runs many order-line admissions in one round trip (a pipeline of
// EVALSHA), for callers that batch requests. A SKU that is not initialised
// (or a server that lacks the script) is retried alone through Admit.
func (s *Store) AdmitMany(ctx context.Context, reqs []Request) []Result {
	out := make([]Result, len(reqs))
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(reqs))
	for i, r := range reqs {
		if err := s.validate(r.SKU, r.Qty); err != nil {
			out[i].Err = err
			continue
		}
		cmds[i] = deductScript.EvalSha(ctx, pipe, admitKeys(r.SKU, ""), r.Qty, 0)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command below
	for i, cmd := range cmds {
		if cmd == nil {
			continue
		}
		res, err := cmd.Int64Slice()
		if err != nil || res[0] == resNotInitialised {
			out[i].Admission, out[i].Err = s.Admit(ctx, reqs[i].SKU, reqs[i].Qty, "")
			continue
		}
		out[i].Admission, out[i].Err = s.admission(reqs[i].SKU, res[0], res[1])
	}
	return out
}

// admission turns a deduct script result (other than -3) into Admit's
// answer, and counts it; name is the SKU (or the campaign) for errors.
func (s *Store) admission(name string, r, epoch int64) (Admission, error) {
	switch r {
	case resInsufficient:
		s.stats.Insufficient.Add(1)
		return Admission{}, fmt.Errorf("%w: %s", inventory.ErrInsufficientStock, name)
	case resReplay:
		return Admission{}, inventory.ErrReplay
	case resOverLimit:
		return Admission{}, fmt.Errorf("%w: %s", inventory.ErrOverLimit, name)
	case resNotStarted: // only a campaign's pool has a window
		return Admission{}, fmt.Errorf("%w: %s", inventory.ErrNotStarted, name)
	case resEnded:
		return Admission{}, fmt.Errorf("%w: %s", inventory.ErrEnded, name)
	case resUnlimited:
		s.stats.Unlimited.Add(1)
		return Admission{Remaining: inventory.Unlimited, Epoch: epoch}, nil
	}
	s.stats.Deducted.Add(1)
	return Admission{Remaining: r, Epoch: epoch}, nil
}

// AdmitCart admits every line, or none: lines are taken in SKU order and, if
// one fails, the lines already taken are undone. This holds on Redis Cluster,
// where a cart's SKUs live in different slots and no script can see them all.
// If the process dies half way, the units taken are hidden until the SKU is
// next realigned; the database never counted them.
func (s *Store) AdmitCart(ctx context.Context, lines []inventory.Line) ([]Admission, error) {
	for _, l := range lines { // before anything is taken
		if err := s.validate(l.SKU, l.Qty); err != nil {
			return nil, err
		}
	}
	out := make([]Admission, len(lines))
	for i, l := range lines {
		a, err := s.Admit(ctx, l.SKU, l.Qty, "")
		if err != nil {
			fctx, cancel := FollowUp(ctx)
			s.UndoCart(fctx, lines[:i], out[:i])
			cancel()
			return nil, err // it names the SKU
		}
		out[i] = a
	}
	return out, nil
}

// UndoCart undoes AdmitCart's admissions (best effort: a unit left taken is
// hidden until the SKU is realigned, never sold twice).
func (s *Store) UndoCart(ctx context.Context, lines []inventory.Line, adm []Admission) {
	for i, l := range lines {
		if err := s.Undo(ctx, l.SKU, l.Qty, adm[i], ""); err != nil {
			s.cfg.Logger.Warn("stock: undoing an admission failed; the realign gives the units back",
				"sku", l.SKU, "err", err)
		}
	}
}

// Undo gives back qty units an admission took whose reservation the database
// refused or never recorded, and forgets token (if any) so it may reserve again.
func (s *Store) Undo(ctx context.Context, sku string, qty int64, adm Admission, token string) error {
	if err := s.validate(sku, qty); err != nil {
		return err
	}
	if adm.Remaining == inventory.Unlimited {
		return nil // nothing was taken, and no token remembered
	}
	return s.undo(ctx, sku, qty, admitKeys(sku, token), []any{qty, adm.Epoch})
}

// UndoBuyer undoes an AdmitBuyer admission whose reservation the database
// refused or never recorded: its units, and the units it counted against
// user's limit, each given back only into the initialisation it was taken
// from (a re-init since read the database, which never had them).
func (s *Store) UndoBuyer(ctx context.Context, sku string, qty int64, adm Admission, user string) error {
	if err := s.validate(sku, qty); err != nil {
		return err
	}
	if err := inventory.ValidateUserID(user); err != nil {
		return err
	}
	return s.undo(ctx, sku, qty, append(admitKeys(sku, ""), buyersKey(sku)), []any{qty, adm.Epoch, user})
}

func (s *Store) undo(ctx context.Context, sku string, qty int64, keys []string, args []any) error {
	n, err := undoScript.Run(ctx, s.rdb, keys, args...).Int64()
	if err != nil {
		return fmt.Errorf("stock: undo %s: %w", sku, err)
	}
	if n != resCounted {
		s.stats.Released.Add(qty)
		s.cfg.OnStockBack(sku)
	}
	return nil
}

// Apply brings a committed change into Redis exactly once (see applyScript):
// delivered again, it changes nothing. A change that would take Redis below
// zero sets it to zero and realigns the SKU from the database, and so does
// one too old for Redis to tell whether it was counted. A SKU Redis does
// not have is left alone: its next cold init reads the database.
func (s *Store) Apply(ctx context.Context, c inventory.Change) error {
	if err := inventory.ValidateSKU(c.SKU); err != nil {
		return err
	}
	if err := validateRef(c.Ref); err != nil {
		return err
	}
	keys, args := applyCall(c)
	n, err := applyScript.Run(ctx, s.rdb, keys, args...).Int64()
	if err != nil {
		return fmt.Errorf("stock: apply %s: %w", c.SKU, err)
	}
	return s.applied(ctx, c, n)
}

// applyCall is applyScript's keys and arguments for c.
func applyCall(c inventory.Change) ([]string, []any) {
	keys, args := []string{stockKey(c.SKU)}, []any{c.Delta, c.Seq, c.Epoch, c.Ref}
	if len(c.Buyers) > 0 {
		keys = append(keys, buyersKey(c.SKU))
		for _, u := range slices.Sorted(maps.Keys(c.Buyers)) {
			args = append(args, u, c.Buyers[u])
		}
	}
	return keys, args
}

// applied follows applyScript's answer n to c: a change that would have
// taken Redis below zero realigns the SKU; units that came back are told.
func (s *Store) applied(ctx context.Context, c inventory.Change, n int64) error {
	switch {
	case n == resClamped, n == resForgotten:
		return s.Realign(ctx, c.SKU)
	case n >= 0 && c.Delta > 0:
		s.stats.Released.Add(c.Delta)
		s.cfg.OnStockBack(c.SKU)
	}
	return nil
}

// validateRef checks a change's ref (inventory.Change.Ref), which names it
// in Redis among the changes of its seq: a token's alphabet and length.
func validateRef(ref string) error {
	if ref != "" && !keyPattern.MatchString(ref) {
		return inventory.Invalidf("a change's ref must be 1-140 characters of A-Z a-z 0-9 . _ : -, got %q", inventory.Truncate(ref))
	}
	return nil
}

// NormaliseCart validates every line (before anything is touched), merges
// repeated SKUs and sorts by SKU: the form AdmitCart admits, and the form
// an order stores its lines in.
func (s *Store) NormaliseCart(lines []inventory.Line) ([]inventory.Line, error) {
	if len(lines) == 0 || len(lines) > 100 {
		return nil, inventory.Invalidf("a cart has 1 to 100 lines, got %d", len(lines))
	}
	merged := map[string]int64{}
	for _, l := range lines {
		if err := s.validate(l.SKU, l.Qty); err != nil {
			return nil, err
		}
		merged[l.SKU] += l.Qty
		if err := inventory.ValidateQty(merged[l.SKU], s.cfg.MaxQty); err != nil {
			return nil, err
		}
	}
	cart := make([]inventory.Line, 0, len(merged))
	for sku, q := range merged {
		cart = append(cart, inventory.Line{SKU: sku, Qty: q})
	}
	slices.SortFunc(cart, func(a, b inventory.Line) int { return strings.Compare(a.SKU, b.SKU) })
	return cart, nil
}

// Forget drops sku's Redis value, so the next use re-initialises it from the
// database.
func (s *Store) Forget(ctx context.Context, sku string) error {
	if err := inventory.ValidateSKU(sku); err != nil {
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
	if err := inventory.ValidateSKU(sku); err != nil {
		return err
	}
	return s.warm(ctx, pool{sku: sku})
}

// warm initialises p from the database if Redis does not have it.
func (s *Store) warm(ctx context.Context, p pool) error {
	// The first check of the double check: a warm key costs one EXISTS, not
	// a lock round.
	n, err := s.rdb.Exists(ctx, p.key()).Result()
	if err != nil {
		return fmt.Errorf("%w: %v", inventory.ErrUnavailable, err)
	}
	if n == 1 {
		return nil
	}
	return s.ensurePool(ctx, p, modeCold)
}

// Realign replaces sku's Redis value and its buyers' counts with the
// database's, under the init lock: for a Redis found wrong (a refused
// admission, a rolled-back or failed-over Redis, reconcile). Exact even while
// reservations flow: an admission taken from the replaced value (its units
// and its buyer's count) is either counted by the database read or brought
// in by its own Apply, and a give-back of the replaced initialisation is
// not given back into the new one.
func (s *Store) Realign(ctx context.Context, sku string) error {
	if err := inventory.ValidateSKU(sku); err != nil {
		return err
	}
	return s.realign(ctx, pool{sku: sku})
}

// realign replaces p's Redis value (a SKU's with its buyers' counts) with
// the database's, under p's init lock. Realigns of one pool coalesce: a
// call is answered by a realign that starts after it (the one running may
// have read the database before the change the caller knows of), and
// every call that arrives while one runs shares the next. A burst of
// refusals asks for as many realigns as it has sales; run one after the
// other, each would take the pool's row lock from the sales in turn, and
// each new copy would count the admissions then in flight as available
// again. The realign runs detached from the caller (its own deadline:
// InitWait and LockTTL), so one the caller stops waiting for still
// repairs the pool.
func (s *Store) realign(ctx context.Context, p pool) error {
	s.realigns.Lock()
	if s.realigns.m == nil {
		s.realigns.m = map[string]*realignState{}
	}
	st := s.realigns.m[p.key()]
	if st == nil {
		st = &realignState{}
		s.realigns.m[p.key()] = st
	}
	if st.next == nil {
		st.next = &realignCall{done: make(chan struct{})}
	}
	call := st.next
	if !st.running {
		st.running = true
		go s.realignLoop(context.WithoutCancel(ctx), p, st)
	}
	s.realigns.Unlock()
	select {
	case <-call.done:
		return call.err
	case <-ctx.Done():
		return fmt.Errorf("%w: realigning %s: %v", inventory.ErrUnavailable, p, ctx.Err())
	}
}

// realignState is one pool's realigns: whether one runs, and the call the
// callers since it started wait for.
type realignState struct {
	running bool
	next    *realignCall
}

type realignCall struct {
	done chan struct{}
	err  error
}

// realignLoop runs p's realigns while callers wait for one.
func (s *Store) realignLoop(ctx context.Context, p pool, st *realignState) {
	for {
		s.realigns.Lock()
		call := st.next
		if call == nil {
			st.running = false
			delete(s.realigns.m, p.key())
			s.realigns.Unlock()
			return
		}
		st.next = nil
		s.realigns.Unlock()
		rctx, cancel := context.WithTimeout(ctx, s.cfg.InitWait+s.cfg.LockTTL)
		call.err = s.realignNow(rctx, p)
		cancel()
		close(call.done)
	}
}

// realignNow is one realign of p.
func (s *Store) realignNow(ctx context.Context, p pool) error {
	held, err := s.locker.Obtain(ctx, p.lockKey(), s.cfg.LockTTL, s.cfg.InitWait)
	if err != nil {
		return fmt.Errorf("%w: init lock for %s: %v", inventory.ErrUnavailable, p, err)
	}
	defer s.releaseLock(ctx, p, held)
	s.stats.Realigns.Add(1)
	if err := s.writePool(ctx, p, modeForce); err != nil {
		return err
	}
	s.back(p)
	return nil
}

// Buyers reads sku's buyers hash: each buyer's count (units counted against
// the per-user limit) and the initialisation the counts come from (0: the
// hash is not initialised).
func (s *Store) Buyers(ctx context.Context, sku string) (map[string]int64, int64, error) {
	if err := inventory.ValidateSKU(sku); err != nil {
		return nil, 0, err
	}
	all, err := s.rdb.HGetAll(ctx, buyersKey(sku)).Result()
	if err != nil {
		return nil, 0, fmt.Errorf("stock: buyers of %s: %w", sku, err)
	}
	out := make(map[string]int64, len(all))
	var epoch int64
	for k, v := range all {
		n, _ := strconv.ParseInt(v, 10, 64)
		if k == buyersEpoch {
			epoch = n
			continue
		}
		out[k] = n
	}
	return out, epoch, nil
}

// Levels is what Redis holds for one SKU.
type Levels struct {
	Initialised bool
	Unlimited   bool
	Available   int64 // units that can be taken now
	Epoch       int64
	Seq         int64
	// BuyersEpoch is the initialisation the buyers hash's counts come from:
	// Epoch when they are the stock's, 0 when the hash is not initialised
	// (lost: the next admission with a limit initialises it), another
	// epoch when Redis came back inconsistent (realign).
	BuyersEpoch int64
}

func (s *Store) Levels(ctx context.Context, sku string) (Levels, error) {
	lvs, err := s.LevelsOf(ctx, []string{sku})
	if err != nil {
		return Levels{}, err
	}
	return lvs[0], nil
}

// LevelsOf reads the levels of many SKUs in one round trip (a pipeline), in
// the order given: for the jobs that walk the catalog.
func (s *Store) LevelsOf(ctx context.Context, skus []string) ([]Levels, error) {
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, len(skus))
	marks := make([]*redis.StringCmd, len(skus))
	for i, sku := range skus {
		if err := inventory.ValidateSKU(sku); err != nil {
			return nil, err
		}
		cmds[i] = pipe.HMGet(ctx, stockKey(sku), "a", "e", "s")
		marks[i] = pipe.HGet(ctx, buyersKey(sku), buyersEpoch)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command below (a missing buyers hash is redis.Nil)
	for i := range cmds {
		if err := cmds[i].Err(); err != nil {
			return nil, fmt.Errorf("stock: levels: %w", err)
		}
		if err := marks[i].Err(); err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("stock: levels: %w", err)
		}
	}
	num := func(v any) int64 {
		n, _ := strconv.ParseInt(fmt.Sprint(v), 10, 64)
		return n
	}
	out := make([]Levels, len(skus))
	for i, cmd := range cmds {
		vals := cmd.Val()
		if vals[0] != nil {
			lv := &out[i]
			lv.Initialised = true
			lv.Available, lv.Epoch, lv.Seq = num(vals[0]), num(vals[1]), num(vals[2])
			lv.Unlimited = lv.Available == inventory.Unlimited
		}
		out[i].BuyersEpoch, _ = marks[i].Int64()
	}
	return out, nil
}

// Locker is the Store's lock client, for other jobs that need one.
func (s *Store) Locker() *lock.Locker { return s.locker }

func (s *Store) validate(sku string, qty int64) error {
	if err := inventory.ValidateSKU(sku); err != nil {
		return err
	}
	return inventory.ValidateQty(qty, s.cfg.MaxQty)
}

// pool names one Redis value a Store initialises from the database: a
// SKU's stock hash (campaign "") or a campaign's pool. The cold init (its
// singleflight, lock and double check), the realign and the admission's
// retry after -3 (and a SKU's after -10) are written once, over pools.
type pool struct{ sku, campaign string }

func (p pool) key() string {
	if p.campaign == "" {
		return stockKey(p.sku)
	}
	return campaignKey(p.asCampaign())
}

// buyersKey is p's buyers hash: a SKU's, or the campaign's.
func (p pool) buyersKey() string {
	if p.campaign == "" {
		return buyersKey(p.sku)
	}
	return campaignBuyersKey(p.asCampaign())
}

func (p pool) lockKey() string {
	if p.campaign == "" {
		return initLockKey(p.sku)
	}
	return campaignInitLockKey(p.asCampaign())
}

func (p pool) asCampaign() Campaign { return Campaign{ID: p.campaign, SKU: p.sku} }

// String names p in errors: the SKU, or the campaign.
func (p pool) String() string {
	if p.campaign == "" {
		return p.sku
	}
	return p.asCampaign().String()
}

// writePool reads p's baseline through its init callback and writes it to
// Redis while the database row is locked; mode is modeCold or modeForce, or
// for a SKU modeBuyers.
func (s *Store) writePool(ctx context.Context, p pool, mode string) error {
	if p.campaign == "" {
		return s.write(ctx, p.sku, mode)
	}
	return s.writeCampaign(ctx, p.asCampaign(), mode)
}

// back tells whoever listens that units of p may have come back.
func (s *Store) back(p pool) {
	if p.campaign == "" {
		s.cfg.OnStockBack(p.sku)
		return
	}
	s.cfg.OnCampaignBack(p.asCampaign())
}

// The modes of an initialisation (initScript's ARGV[4]).
const (
	modeCold   = "cold"   // the stock (or the campaign's pool) is absent
	modeBuyers = "buyers" // a SKU's buyers hash is not its stock's initialisation's
	modeForce  = "force"  // realign
)

// ensureInit initialises a cold SKU (see ensurePool).
func (s *Store) ensureInit(ctx context.Context, sku, mode string) error {
	return s.ensurePool(ctx, pool{sku: sku}, mode)
}

// ensurePool initialises a cold pool (mode modeCold), or one whose buyers
// hash is not initialised (modeBuyers: both are initialised again, the
// counts need the fence of a fresh epoch). Callers in this process share
// one attempt (singleflight); across processes one caller takes the init
// lock and the others wait for the key, not the database.
func (s *Store) ensurePool(ctx context.Context, p pool, mode string) error {
	ch := s.inits.DoChan(mode+":"+p.key(), func() (any, error) {
		// Detached: one caller's cancellation must not fail the others.
		ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.InitWait+s.cfg.LockTTL)
		defer cancel()
		return nil, s.initCold(ictx, p, mode)
	})
	select {
	case r := <-ch:
		return r.Err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// initialised is initCold's check: p is initialised (and, in modeBuyers,
// its buyers hash too).
func (s *Store) initialised(ctx context.Context, p pool, mode string) (bool, error) {
	n, err := initialisedScript.Run(ctx, s.rdb, []string{p.key(), p.buyersKey()}, mode).Int64()
	if err != nil {
		return false, fmt.Errorf("%w: %v", inventory.ErrUnavailable, err)
	}
	return n == 1, nil
}

func (s *Store) initCold(ctx context.Context, p pool, mode string) error {
	giveUp := time.Now().Add(s.cfg.InitWait)
	for {
		held, err := s.locker.Obtain(ctx, p.lockKey(), s.cfg.LockTTL, 0)
		if err == nil {
			defer s.releaseLock(ctx, p, held)
			// Check again under the lock; the script checks a third time,
			// atomically with the write.
			if ok, err := s.initialised(ctx, p, mode); err != nil || ok {
				return err
			}
			s.stats.ColdInits.Add(1)
			return s.writePool(ctx, p, mode)
		}
		if !errors.Is(err, lock.ErrNotObtained) {
			return fmt.Errorf("%w: init lock for %s: %v", inventory.ErrUnavailable, p, err)
		}
		// Someone else is initialising: wait for the key, not the database.
		s.stats.InitWaits.Add(1)
		if time.Now().After(giveUp) {
			return fmt.Errorf("%w: %s is being initialised elsewhere", inventory.ErrUnavailable, p)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %v", inventory.ErrUnavailable, ctx.Err())
		case <-time.After(5*time.Millisecond + rand.N(20*time.Millisecond)):
		}
		if ok, err := s.initialised(ctx, p, mode); err != nil || ok {
			return err
		}
	}
}

func (s *Store) releaseLock(ctx context.Context, p pool, held *lock.Lock) {
	if err := held.Release(context.WithoutCancel(ctx)); err != nil && !errors.Is(err, lock.ErrNotHeld) {
		if p.campaign == "" {
			s.cfg.Logger.Warn("stock: releasing init lock", "sku", p.sku, "err", err)
		} else {
			s.cfg.Logger.Warn("stock: releasing init lock", "sku", p.sku, "campaign", p.campaign, "err", err)
		}
	}
}

// stageChunk is how many buyers' counts one command stages: Redis serves
// other callers between chunks.
const stageChunk = 1000

// stageBuyers writes counts into key (this initialisation's own), a chunk
// per command in one pipeline, expiring in a minute (an initialisation that
// dies half way leaves nothing for long); it returns how many it wrote.
func (s *Store) stageBuyers(ctx context.Context, key string, counts map[string]int64) (int, error) {
	users := make([]string, 0, len(counts))
	for u, q := range counts {
		if q > 0 {
			users = append(users, u)
		}
	}
	if len(users) == 0 {
		return 0, nil
	}
	slices.Sort(users)
	pipe := s.rdb.Pipeline()
	for i := 0; i < len(users); i += stageChunk {
		chunk := users[i:min(i+stageChunk, len(users))]
		args := make([]any, 0, 2*len(chunk))
		for _, u := range chunk {
			args = append(args, u, counts[u])
		}
		pipe.HSet(ctx, key, args...)
	}
	pipe.PExpire(ctx, key, time.Minute)
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("stock: staging the buyers' counts: %w", err)
	}
	return len(users), nil
}

// write reads sku's level and buyers' counts through the init callback and
// writes them to Redis while the database row is locked; mode is modeCold,
// modeBuyers or modeForce.
func (s *Store) write(ctx context.Context, sku, mode string) error {
	err := s.cfg.Init(ctx, sku, func(lv inventory.Baseline) error {
		if lv.Available < inventory.Unlimited {
			return fmt.Errorf("%w: %s has available %d in the database", inventory.ErrUnavailable, sku, lv.Available)
		}
		staged := stagedBuyersKey(sku, lv.Epoch)
		n, err := s.stageBuyers(ctx, staged, lv.Buyers)
		if err != nil {
			return err
		}
		return initScript.Run(ctx, s.rdb, []string{stockKey(sku), buyersKey(sku), staged},
			lv.Available, lv.Epoch, lv.Seq, mode, s.cfg.QuotaTTL.Milliseconds(), min(n, 1)).Err()
	})
	switch {
	case errors.Is(err, inventory.ErrUnknownSKU):
		return fmt.Errorf("%w: %s", inventory.ErrUnknownSKU, sku)
	case err == nil, errors.Is(err, inventory.ErrUnavailable):
		return err
	default:
		return fmt.Errorf("%w: initialising %s: %v", inventory.ErrUnavailable, sku, err)
	}
}
