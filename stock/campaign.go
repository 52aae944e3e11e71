package stock

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/acme/inventory"
)

// A flash-sale campaign (docs/SPEC.md section 5) sells an allotment carved
// out of a SKU's stock inside a window [starts_at, ends_at). In the database
// the campaign's unsold units are one reservation row, the pool, with its
// own change counter (seq) and Redis epoch; in Redis the pool is a hash like
// a SKU's stock hash plus the window (keys.go), admitted by the same
// deduction script: a request outside the window is refused there, at Redis
// speed, and never reaches the database. The node's clock decides in Redis
// (the caller passes now); the database's clock decides when the
// reservation is recorded, so a node whose clock runs fast cannot sell early.
//
// A campaign's pool is fenced exactly as a SKU's value is: each
// initialisation carries an epoch and the pool's seq it read, a committed
// change of the pool is brought in once (ApplyCampaign), an admission the
// database refused is given back only into the initialisation it came from
// (UndoCampaign), and a cold pool is initialised by one caller under the
// pool's own token-owned lock (the SKU's cold-init code, over pools). Its
// buyers' counts (the per-user limit's pre-filter) are part of each
// initialisation, marked with its epoch, as a SKU's are: a re-initialised
// pool counts what the database counted, never a count an admission that
// died left behind or a Redis that came back older lost.
//
// An ended campaign has nothing in Redis: its end deletes its keys
// (DropCampaigns), an initialisation of an ended campaign writes nothing
// (InitCampaign answers inventory.ErrEnded; a realign then deletes what is
// left), and every initialisation makes both keys expire CampaignKeysLinger
// after the window's close, whatever else fails.

// Campaign names a campaign's pool in Redis: campaign ID, selling SKU.
type Campaign struct{ ID, SKU string }

// String names the campaign in errors and logs.
func (c Campaign) String() string { return "campaign " + c.ID + " of " + c.SKU }

// CampaignBaseline is what one initialisation of a campaign's pool starts
// from: the pool's units left (Available >= 0, never Unlimited) as of the
// pool's change counter Seq, under a fresh Epoch, and the campaign's window
// [Opens, Closes).
type CampaignBaseline struct {
	inventory.Baseline
	Opens, Closes time.Time
}

// CampaignInitFunc reads c's baseline from the database and calls write with
// it while the database still holds the pool's row lock (as
// inventory.InitFunc does for a SKU), so no change of the pool commits
// between the read and the write. It returns inventory.ErrNotFound (wrapped
// or not) when there is no such campaign, inventory.ErrEnded (wrapped or
// not) without calling write when the campaign has ended, and write's error
// otherwise.
type CampaignInitFunc func(ctx context.Context, c Campaign, write func(CampaignBaseline) error) error

// CampaignKeysLinger is how long after its window's close a campaign's
// Redis keys expire if nothing deleted them at its end: longer than the
// timeout sweep takes to release a pool and than any clock skew between
// Redis and the nodes (the keys must not vanish while the window is open).
const CampaignKeysLinger = time.Hour

// errNoCampaigns is every campaign method's answer on a Store configured
// without Config.InitCampaign.
var errNoCampaigns = errors.New("stock: campaigns need Config.InitCampaign")

func (s *Store) validateCampaign(c Campaign) error {
	if s.cfg.InitCampaign == nil {
		return errNoCampaigns
	}
	if err := inventory.ValidateCampaignID(c.ID); err != nil {
		return err
	}
	return inventory.ValidateSKU(c.SKU)
}

func (s *Store) validateCampaignQty(c Campaign, qty int64) error {
	if err := s.validateCampaign(c); err != nil {
		return err
	}
	return inventory.ValidateQty(qty, s.cfg.MaxQty)
}

func validateBuyer(b Buyer) error {
	if err := inventory.ValidateUserID(b.User); err != nil {
		return err
	}
	if b.Limit <= 0 {
		return inventory.Invalidf("a per-user limit must be positive")
	}
	return nil
}

// AdmitCampaign takes qty units of c's pool in Redis at now (the node's
// clock; the database's decides when it records the reservation), for b.User
// within b.Limit units per user in this campaign (b nil: no limit), in one
// script call, pipelined with concurrent admissions as Admit's are. The
// window is checked before the limit and the stock: outside it nothing is
// taken or counted. A cold pool (or, with a limit, a pool whose buyers'
// counts are not its initialisation's) is initialised through
// Config.InitCampaign (one caller, under the pool's lock) and the
// admission retried; an ended campaign's is not. Errors:
// inventory.ErrNotStarted (now is before the opening), inventory.ErrEnded
// (at or after the close), ErrOverLimit, ErrInsufficientStock, ErrNotFound
// (no such campaign), ErrUnavailable, ErrInvalidArgument.
func (s *Store) AdmitCampaign(ctx context.Context, c Campaign, qty int64, b *Buyer, now time.Time) (Admission, error) {
	if err := s.validateCampaignQty(c, qty); err != nil {
		return Admission{}, err
	}
	if now.UnixMilli() <= 0 {
		return Admission{}, inventory.Invalidf("an admission into a campaign needs the time, got %s", now)
	}
	k := campaignKey(c)
	keys := []string{k, k}
	args := []any{qty, 0, "", 0, 0, now.UnixMilli()}
	if b != nil {
		if err := validateBuyer(*b); err != nil {
			return Admission{}, err
		}
		keys = append(keys, campaignBuyersKey(c))
		args = []any{qty, 0, b.User, b.Limit, 0, now.UnixMilli()}
	}
	return s.admit(ctx, pool{sku: c.SKU, campaign: c.ID}, keys, args)
}

// UndoCampaign gives back qty units an AdmitCampaign took whose reservation
// the database refused or never recorded, and b's count (b nil: none was
// counted), both into the initialisation adm came from only: after a
// re-init the pool's value and its counts came from the database, which
// never had them. A pool Redis no longer has (the campaign ended) is left
// alone.
func (s *Store) UndoCampaign(ctx context.Context, c Campaign, qty int64, adm Admission, b *Buyer) error {
	if err := s.validateCampaignQty(c, qty); err != nil {
		return err
	}
	k := campaignKey(c)
	keys, args := []string{k, k}, []any{qty, adm.Epoch}
	if b != nil {
		if err := validateBuyer(*b); err != nil {
			return err
		}
		keys, args = append(keys, campaignBuyersKey(c)), append(args, b.User)
	}
	n, err := undoScript.Run(ctx, s.rdb, keys, args...).Int64()
	if err != nil {
		return fmt.Errorf("stock: undo %s: %w", c, err)
	}
	if n != resCounted {
		s.stats.Released.Add(qty)
		s.cfg.OnCampaignBack(c)
	}
	return nil
}

// ApplyCampaign brings a committed change of c's pool into Redis exactly
// once, fenced by the pool's seq and epoch as Apply fences a SKU's (see
// applyScript): a unit released back into a live campaign is Delta +1 at the
// pool's new Seq, with its buyer's count -1 in ch.Buyers. ch.SKU is c.SKU
// or empty. A change that would take the pool below zero sets it to zero
// and realigns it, as does one too old to tell whether it was counted; a
// pool Redis does not have is left alone (its next cold init reads the
// database; an ended campaign has none).
func (s *Store) ApplyCampaign(ctx context.Context, c Campaign, ch inventory.Change) error {
	if err := s.validateCampaign(c); err != nil {
		return err
	}
	if ch.SKU != "" && ch.SKU != c.SKU {
		return inventory.Invalidf("a change of %s is no change of %s", ch.SKU, c)
	}
	if err := validateRef(ch.Ref); err != nil {
		return err
	}
	keys, args := []string{campaignKey(c)}, []any{ch.Delta, ch.Seq, ch.Epoch, ch.Ref}
	if len(ch.Buyers) > 0 {
		keys = append(keys, campaignBuyersKey(c))
		for _, u := range slices.Sorted(maps.Keys(ch.Buyers)) {
			args = append(args, u, ch.Buyers[u])
		}
	}
	n, err := applyScript.Run(ctx, s.rdb, keys, args...).Int64()
	if err != nil {
		return fmt.Errorf("stock: apply %s: %w", c, err)
	}
	switch {
	case n == resClamped, n == resForgotten:
		return s.realign(ctx, pool{sku: c.SKU, campaign: c.ID})
	case n >= 0 && ch.Delta > 0:
		s.stats.Released.Add(ch.Delta)
		s.cfg.OnCampaignBack(c)
	}
	return nil
}

// WarmCampaign initialises c's pool in Redis if it is cold (the warm-up
// before the opening, so the first buyers find it there); a no-op if Redis
// has it.
func (s *Store) WarmCampaign(ctx context.Context, c Campaign) error {
	if err := s.validateCampaign(c); err != nil {
		return err
	}
	return s.warm(ctx, pool{sku: c.SKU, campaign: c.ID})
}

// RealignCampaign replaces c's pool and its buyers' counts in Redis with
// the database's (a new epoch), under the pool's init lock, as Realign does
// for a SKU: for a pool found wrong (a refused admission, a rolled-back
// Redis, reconcile), or a window the database changed. A campaign that has
// ended is realigned to nothing: its keys are deleted.
func (s *Store) RealignCampaign(ctx context.Context, c Campaign) error {
	if err := s.validateCampaign(c); err != nil {
		return err
	}
	return s.realign(ctx, pool{sku: c.SKU, campaign: c.ID})
}

// DropCampaigns deletes campaigns' pools and their buyers' counts from
// Redis, in one round trip (a pipeline): at a campaign's end, when nothing
// sells from it any more and nothing of it is needed (a sale in flight at
// the end finds no pool and gives nothing back into it; a hold released
// after the end goes back to the SKU; an initialisation of an ended
// campaign writes nothing). Deleting a live campaign's keys is safe too:
// its next admission initialises them again from the database.
func (s *Store) DropCampaigns(ctx context.Context, cs ...Campaign) error {
	if len(cs) == 0 {
		return nil
	}
	pipe := s.rdb.Pipeline()
	for _, c := range cs {
		if err := s.validateCampaign(c); err != nil {
			return err
		}
		pipe.Del(ctx, campaignKey(c), campaignBuyersKey(c))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("stock: dropping %d campaigns' keys: %w", len(cs), err)
	}
	return nil
}

// CampaignLevels is what Redis holds for one campaign's pool.
type CampaignLevels struct {
	Initialised   bool
	Available     int64 // units the campaign has left
	Epoch, Seq    int64
	Opens, Closes time.Time // the window, to the millisecond
	// BuyersEpoch is the initialisation the buyers' counts come from (0:
	// Redis has none; the next admission with a limit initialises them).
	BuyersEpoch int64
}

// CampaignLevels reads c's pool as Redis holds it (nothing is initialised).
func (s *Store) CampaignLevels(ctx context.Context, c Campaign) (CampaignLevels, error) {
	if err := s.validateCampaign(c); err != nil {
		return CampaignLevels{}, err
	}
	pipe := s.rdb.Pipeline()
	pool := pipe.HMGet(ctx, campaignKey(c), "a", "e", "s", "o", "z")
	mark := pipe.HGet(ctx, campaignBuyersKey(c), buyersEpoch)
	_, _ = pipe.Exec(ctx) // errors are read per command (no buyers hash is redis.Nil)
	vals, err := pool.Result()
	if err == nil {
		if err = mark.Err(); errors.Is(err, redis.Nil) {
			err = nil
		}
	}
	if err != nil {
		return CampaignLevels{}, fmt.Errorf("stock: levels of %s: %w", c, err)
	}
	var lv CampaignLevels
	lv.BuyersEpoch, _ = mark.Int64()
	if vals[0] == nil {
		return lv, nil
	}
	n := make([]int64, len(vals))
	for i, v := range vals {
		str, _ := v.(string)
		if n[i], err = strconv.ParseInt(str, 10, 64); err != nil {
			return CampaignLevels{}, fmt.Errorf("stock: levels of %s: field %d is %q", c, i, str)
		}
	}
	lv.Initialised = true
	lv.Available, lv.Epoch, lv.Seq = n[0], n[1], n[2]
	lv.Opens, lv.Closes = time.UnixMilli(n[3]), time.UnixMilli(n[4])
	return lv, nil
}

// writeCampaign reads c's baseline through Config.InitCampaign and writes
// it to Redis, with its buyers' counts, while the database holds the pool's
// row lock; mode is modeCold, modeBuyers or modeForce. An ended campaign
// is written nothing, and what Redis still has of it is deleted: a realign
// (modeForce) of it succeeds that way, an admission's initialisation
// answers inventory.ErrEnded.
func (s *Store) writeCampaign(ctx context.Context, c Campaign, mode string) error {
	err := s.cfg.InitCampaign(ctx, c, func(b CampaignBaseline) error {
		if b.Available < 0 {
			return fmt.Errorf("%w: %s has %d units in the database", inventory.ErrUnavailable, c, b.Available)
		}
		if b.Opens.UnixMilli() <= 0 || b.Closes.UnixMilli() <= b.Opens.UnixMilli() {
			return fmt.Errorf("%w: %s has the window [%s, %s) in the database", inventory.ErrUnavailable, c, b.Opens, b.Closes)
		}
		staged := stagedCampaignBuyersKey(c, b.Epoch)
		n, err := s.stageBuyers(ctx, staged, b.Buyers)
		if err != nil {
			return err
		}
		return campaignInitScript.Run(ctx, s.rdb, []string{campaignKey(c), campaignBuyersKey(c), staged},
			b.Available, b.Epoch, b.Seq, mode, b.Opens.UnixMilli(), b.Closes.UnixMilli(),
			b.Closes.Add(CampaignKeysLinger).UnixMilli(), min(n, 1)).Err()
	})
	switch {
	case errors.Is(err, inventory.ErrEnded):
		if derr := s.DropCampaigns(ctx, c); derr != nil {
			return fmt.Errorf("%w: %s has ended; deleting its keys: %v", inventory.ErrUnavailable, c, derr)
		}
		if mode == modeForce {
			return nil
		}
		return fmt.Errorf("%w: %s", inventory.ErrEnded, c)
	case errors.Is(err, inventory.ErrNotFound):
		return fmt.Errorf("%w: %s", inventory.ErrNotFound, c)
	case err == nil, errors.Is(err, inventory.ErrUnavailable):
		return err
	default:
		return fmt.Errorf("%w: initialising %s: %v", inventory.ErrUnavailable, c, err)
	}
}

// campaignInitScript writes a campaign pool's level and window and its
// buyers' counts read from the database, as one initialisation, and makes
// both keys expire a while after the window's close.
//
//	KEYS[1] pool  KEYS[2] buyers hash  KEYS[3] the counts staged for it
//	ARGV[1] units left  ARGV[2] epoch  ARGV[3] the pool's seq
//	ARGV[4] "cold" (only if the pool is absent: the double check, atomic
//	        with the write), "buyers" (only if the buyers hash is not the
//	        pool's initialisation's) or "force" (realign: replace whatever
//	        Redis has)
//	ARGV[5] ARGV[6] the window: opens and closes, unix ms
//	ARGV[7] when both keys expire, unix ms  ARGV[8] "1" when counts were
//	        staged in KEYS[3]
//
// The counts are staged as a SKU's are (Store.stageBuyers) and renamed
// into place here, marked with the epoch. Returns {1, units} when it
// wrote, {0, current} when Redis already had it (the staged counts are
// dropped).
var campaignInitScript = redis.NewScript(`
if ARGV[4] ~= 'force' then
  local cur = redis.call('HMGET', KEYS[1], 'a', 'e')
  if cur[1] and (ARGV[4] == 'cold' or redis.call('HGET', KEYS[2], '` + buyersEpoch + `') == cur[2]) then
    if ARGV[8] == '1' then redis.call('UNLINK', KEYS[3]) end
    return {0, tonumber(cur[1])}
  end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'a', ARGV[1], 'e', ARGV[2], 's', ARGV[3], 'o', ARGV[5], 'z', ARGV[6])
redis.call('UNLINK', KEYS[2])
if ARGV[8] == '1' then redis.call('RENAME', KEYS[3], KEYS[2]) end
redis.call('HSET', KEYS[2], '` + buyersEpoch + `', ARGV[2])
redis.call('PEXPIREAT', KEYS[1], ARGV[7])
redis.call('PEXPIREAT', KEYS[2], ARGV[7])
return {1, tonumber(ARGV[1])}
`)
