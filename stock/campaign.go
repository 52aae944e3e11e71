package stock

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

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
// pool's own token-owned lock (the SKU's cold-init code, over pools).

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
// or not) when there is no such campaign, and write's error otherwise.
type CampaignInitFunc func(ctx context.Context, c Campaign, write func(CampaignBaseline) error) error

// errNoCampaigns is every campaign method's answer on a Store configured
// without Config.InitCampaign.
var errNoCampaigns = errors.New("stock: campaigns need Config.InitCampaign")

// campaignIDPattern is a SKU's alphabet: no colon and no brace, so a
// campaign's keys are neither another campaign's nor a token's, and keep the
// SKU's hash tag.
var campaignIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

func (s *Store) validateCampaign(c Campaign) error {
	if s.cfg.InitCampaign == nil {
		return errNoCampaigns
	}
	if !campaignIDPattern.MatchString(c.ID) {
		return inventory.Invalidf("campaign id must be 1-64 characters of A-Z a-z 0-9 . _ -, got %q", inventory.Truncate(c.ID))
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
	if err := inventory.ValidateToken(b.User); err != nil {
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
// taken or counted. A cold pool is initialised through Config.InitCampaign
// (one caller, under the pool's lock) and the admission retried. Errors:
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
		args = []any{qty, 0, b.User, b.Limit, s.cfg.QuotaTTL.Milliseconds(), now.UnixMilli()}
	}
	return s.admit(ctx, pool{sku: c.SKU, campaign: c.ID}, keys, args)
}

// UndoCampaign gives back qty units an AdmitCampaign took whose reservation
// the database refused or never recorded: into the initialisation adm came
// from only (after a re-init the pool's value came from the database, which
// never had them), and b's count back (b nil: none was counted).
func (s *Store) UndoCampaign(ctx context.Context, c Campaign, qty int64, adm Admission, b *Buyer) error {
	if err := s.validateCampaignQty(c, qty); err != nil {
		return err
	}
	if b != nil {
		if err := validateBuyer(*b); err != nil {
			return err
		}
	}
	var errs []error
	k := campaignKey(c)
	n, err := undoScript.Run(ctx, s.rdb, []string{k, k}, qty, adm.Epoch).Int64()
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("stock: undo %s: %w", c, err))
	case n != resCounted:
		s.stats.Released.Add(qty)
		s.cfg.OnCampaignBack(c)
	}
	if b != nil {
		errs = append(errs, s.ReturnCampaignQuota(ctx, c, b.User, qty))
	}
	return errors.Join(errs...)
}

// ApplyCampaign brings a committed change of c's pool into Redis exactly
// once, fenced by the pool's seq and epoch as Apply fences a SKU's (see
// applyScript): a unit released back into a live campaign is Delta +1 at the
// pool's new Seq. ch.SKU is c.SKU or empty. A change that would take the pool
// below zero sets it to zero and realigns it, as does one too old to tell
// whether it was counted; a pool Redis does not have is left alone (its next
// cold init reads the database).
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
	n, err := applyScript.Run(ctx, s.rdb, []string{campaignKey(c)}, ch.Delta, ch.Seq, ch.Epoch, ch.Ref).Int64()
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

// RealignCampaign replaces c's pool in Redis with the database's (a new
// epoch), under the pool's init lock, as Realign does for a SKU: for a pool
// found wrong (a refused admission, a rolled-back Redis, reconcile), or a
// window the database changed.
func (s *Store) RealignCampaign(ctx context.Context, c Campaign) error {
	if err := s.validateCampaign(c); err != nil {
		return err
	}
	return s.realign(ctx, pool{sku: c.SKU, campaign: c.ID})
}

// ReturnCampaignQuota gives qty units of user's limit in campaign c back
// (the purchase failed).
func (s *Store) ReturnCampaignQuota(ctx context.Context, c Campaign, user string, qty int64) error {
	if err := s.validateCampaignQty(c, qty); err != nil {
		return err
	}
	if err := inventory.ValidateToken(user); err != nil {
		return err
	}
	return quotaScript.Run(ctx, s.rdb, []string{campaignBuyersKey(c)}, user, qty).Err()
}

// DropCampaign deletes c's pool and its buyers' counts from Redis, once
// the campaign has ended and nothing sells from it: an ended campaign's
// keys (the buyers' counts one field per buyer) would otherwise stay
// forever. A late admission finds no pool and initialises it again from
// the database, ended (see maintenance.DropEndedCampaigns).
func (s *Store) DropCampaign(ctx context.Context, c Campaign) error {
	if err := s.validateCampaign(c); err != nil {
		return err
	}
	if err := s.rdb.Del(ctx, campaignKey(c), campaignBuyersKey(c)).Err(); err != nil {
		return fmt.Errorf("stock: dropping %s: %w", c, err)
	}
	return nil
}

// CampaignLevels is what Redis holds for one campaign's pool.
type CampaignLevels struct {
	Initialised   bool
	Available     int64 // units the campaign has left
	Epoch, Seq    int64
	Opens, Closes time.Time // the window, to the millisecond
}

// CampaignLevels reads c's pool as Redis holds it (nothing is initialised).
func (s *Store) CampaignLevels(ctx context.Context, c Campaign) (CampaignLevels, error) {
	if err := s.validateCampaign(c); err != nil {
		return CampaignLevels{}, err
	}
	vals, err := s.rdb.HMGet(ctx, campaignKey(c), "a", "e", "s", "o", "z").Result()
	if err != nil {
		return CampaignLevels{}, fmt.Errorf("stock: levels of %s: %w", c, err)
	}
	var lv CampaignLevels
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
// it to Redis while the database holds the pool's row lock; mode is "cold"
// or "force".
func (s *Store) writeCampaign(ctx context.Context, c Campaign, mode string) error {
	err := s.cfg.InitCampaign(ctx, c, func(b CampaignBaseline) error {
		if b.Available < 0 {
			return fmt.Errorf("%w: %s has %d units in the database", inventory.ErrUnavailable, c, b.Available)
		}
		if b.Opens.UnixMilli() <= 0 || b.Closes.UnixMilli() <= b.Opens.UnixMilli() {
			return fmt.Errorf("%w: %s has the window [%s, %s) in the database", inventory.ErrUnavailable, c, b.Opens, b.Closes)
		}
		return initScript.Run(ctx, s.rdb, []string{campaignKey(c)}, b.Available, b.Epoch, b.Seq, mode,
			b.Opens.UnixMilli(), b.Closes.UnixMilli()).Err()
	})
	switch {
	case errors.Is(err, inventory.ErrNotFound):
		return fmt.Errorf("%w: %s", inventory.ErrNotFound, c)
	case err == nil, errors.Is(err, inventory.ErrUnavailable):
		return err
	default:
		return fmt.Errorf("%w: initialising %s: %v", inventory.ErrUnavailable, c, err)
	}
}
