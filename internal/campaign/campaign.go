// Package campaign runs flash-sale campaigns (docs/SPEC.md section 5): an
// allotment of one SKU sold within a window. The database holds each
// campaign and its pool (internal/arbiter: the carve-out, the sale under
// the database's clock, the end); Redis admits (stock: the window and the
// pool checked at Redis speed); the order lifecycle records each sale as
// an order (order.Service.BuyCampaign). This package puts, reads, ends and
// sells campaigns, and keeps each campaign's view in memory for the product
// pages that poll it.
package campaign

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"gorm.io/gorm"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/followup"
	"github.com/acme/inventory/order"
	"github.com/acme/inventory/stock"
)

// States of a campaign as GET answers it.
const (
	Scheduled = "SCHEDULED"
	Live      = "LIVE"
	SoldOut   = "SOLD_OUT"
	Ended     = "ENDED"
)

// Staleness is how old a campaign's view may be when it is answered: each
// node reads a campaign's counts at most this often (one read at a time),
// however many product pages poll it. Before the opening nothing sells,
// and a change of the campaign (a PUT, an end, on any node) writes the
// pool's Redis copy again under a new epoch: so a view read before the
// opening stays current until starts_at while Redis's copy still has the
// epoch and the window the view was read with, which each node checks
// (one HMGET, no statement) at most every Staleness. A crowd polling and
// buying ahead of the opening costs the database nothing, and another
// node's change is seen within Staleness. Only when Redis cannot tell (it
// lost the pool, or is out of reach) is a scheduled view read from the
// database again, every ScheduledStaleness. A change is answered at once
// on the node that made it.
const (
	Staleness          = 500 * time.Millisecond
	ScheduledStaleness = 5 * time.Second
)

// View is a campaign as its product page and its admin see it.
type View struct {
	ID           string    `json:"id"`
	SKU          string    `json:"sku"`
	State        string    `json:"state"`
	Allotment    int64     `json:"allotment"`
	Sold         int64     `json:"sold"`
	Held         int64     `json:"held"`
	Remaining    int64     `json:"remaining"`
	StartsAt     time.Time `json:"starts_at"`
	EndsAt       time.Time `json:"ends_at"`
	PerUserLimit int64     `json:"per_user_limit"`
	HoldSeconds  int64     `json:"hold_seconds"`
	Now          time.Time `json:"now"`
	// Version is the campaign's entity tag (If-Match on PUT).
	Version string `json:"-"`
}

// Spec is what an admin puts.
type Spec struct {
	SKU          string
	Allotment    int64
	StartsAt     time.Time
	EndsAt       time.Time
	PerUserLimit int64
	HoldSeconds  int64
}

// Config tunes a Service.
type Config struct {
	Now    func() time.Time
	Logger *slog.Logger
}

// Service runs campaigns.
type Service struct {
	db     *gorm.DB
	st     *stock.Store
	orders *order.Service
	redis  followup.Redis
	cfg    Config

	mu    sync.RWMutex
	views map[string]cached
	gen   uint64 // numbers the views read, so a check lands only on the view it checked
	reads singleflight.Group
}

// cached is a view as this node holds it.
type cached struct {
	v     View
	epoch int64     // campaigns.redis_epoch as read: Redis's copy of the pool carries it until the campaign changes
	read  time.Time // when v was read from the database
	// checked is when v was last known current: read, or found in Redis
	// unchanged since (a view read before the opening only); retry is
	// when Redis is asked again after it could not tell.
	checked, retry time.Time
	// defined is when v's definition (its window, limit and hold: what a
	// buy is checked against, not its counts) was last known current:
	// read, or Redis's copy found with v's epoch and window since.
	defined time.Time
	gen     uint64
}

// New is the campaign service on db and st, selling through orders.
func New(db *gorm.DB, st *stock.Store, orders *order.Service, cfg Config) *Service {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Service{db: db, st: st, orders: orders, redis: followup.Redis{Stock: st, Log: cfg.Logger}, cfg: cfg,
		views: map[string]cached{}}
}

// InitFunc reads a campaign's pool and its buyers' counts for its Redis
// copy (stock's cold init and realign), under the pool's row lock, with a
// new epoch; inventory.ErrEnded once the campaign has ended.
func InitFunc(db *gorm.DB) stock.CampaignInitFunc {
	return func(ctx context.Context, c stock.Campaign, write func(stock.CampaignBaseline) error) error {
		return arbiter.Transact(ctx, db, func(tx *gorm.DB) error {
			camp, b, err := arbiter.In(tx).CampaignBaseline(c.ID)
			if err != nil {
				return err
			}
			if camp.SKU != c.SKU {
				return fmt.Errorf("%w: campaign %s sells %s, not %s", inventory.ErrNotFound, c.ID, camp.SKU, c.SKU)
			}
			return write(stock.CampaignBaseline{Baseline: b, Opens: camp.StartsAt, Closes: camp.EndsAt})
		})
	}
}

func (s *Service) now() time.Time { return s.cfg.Now().UTC().Truncate(time.Microsecond) }

// SoldOutKey names campaign id's sold-out flag among the SKUs' (a colon is
// in no SKU).
func SoldOutKey(id string) string { return "c:" + id }

// maxWindow bounds a campaign's window: a flash sale, not a catalog.
const maxWindow = 90 * 24 * time.Hour

func (s *Service) validate(id string, spec Spec, now time.Time) error {
	if err := inventory.ValidateCampaignID(id); err != nil {
		return err
	}
	if err := inventory.ValidateSKU(spec.SKU); err != nil {
		return err
	}
	switch {
	case spec.Allotment < 1 || spec.Allotment > arbiter.MaxStock:
		return inventory.Invalidf("allotment must be between 1 and %d", int64(arbiter.MaxStock))
	case spec.StartsAt.IsZero() || spec.EndsAt.IsZero():
		return inventory.Invalidf("starts_at and ends_at are required")
	case !spec.EndsAt.After(spec.StartsAt):
		return inventory.Invalidf("ends_at must be after starts_at")
	case spec.EndsAt.Sub(spec.StartsAt) > maxWindow:
		return inventory.Invalidf("a campaign's window is at most %s", maxWindow)
	case !spec.EndsAt.After(now):
		return inventory.Invalidf("ends_at must be in the future")
	case spec.PerUserLimit < 0 || spec.PerUserLimit > inventory.DefaultMaxQty:
		return inventory.Invalidf("per_user_limit must be between 0 (none) and %d", inventory.DefaultMaxQty)
	}
	if spec.HoldSeconds != 0 {
		if _, err := s.orders.Holds().For(inventory.Seconds(spec.HoldSeconds)); err != nil {
			return err
		}
	}
	return nil
}

// Put creates campaign id or changes it (ifMatch: its version must be one
// of them, "*" any). The allotment is carved out of the SKU's available
// units (inventory.ErrInsufficientStock when they cannot cover it). Refused
// with inventory.ErrConflict: an overlapping campaign of the SKU, an
// allotment below what is sold and held, a change of the SKU, a change of
// an ended campaign. Redis's copy of the pool is then written from the
// database (the warm-up: the first buyers find it there).
func (s *Service) Put(ctx context.Context, id string, spec Spec, ifMatch []string) (View, error) {
	now := s.now()
	if err := s.validate(id, spec, now); err != nil {
		return View{}, err
	}
	c := arbiter.Campaign{ID: id, SKU: spec.SKU, Allotment: spec.Allotment, StartsAt: spec.StartsAt.UTC().Truncate(time.Microsecond),
		EndsAt: spec.EndsAt.UTC().Truncate(time.Microsecond), PerUserLimit: spec.PerUserLimit, HoldSeconds: spec.HoldSeconds}
	var chs []inventory.Change
	err := arbiter.Transact(ctx, s.db, func(tx *gorm.DB) error {
		var err error
		chs, err = arbiter.In(tx).PutCampaign(c, ifMatch, now)
		return err
	})
	var refused arbiter.RefusedError
	if errors.As(err, &refused) {
		return View{}, fmt.Errorf("%w: %s has fewer than the allotment's units available", inventory.ErrInsufficientStock, spec.SKU)
	}
	if err != nil {
		return View{}, err
	}
	s.redis.Apply(ctx, chs)
	s.sync(ctx, stock.Campaign{ID: id, SKU: spec.SKU})
	return s.read(ctx, id)
}

// sync writes the pool's Redis copy from the database (a new epoch, the
// window as it is now); a failure is logged: the next admission's cold
// init or the realign writes it.
func (s *Service) sync(ctx context.Context, c stock.Campaign) {
	s.forget(c.ID)
	fctx, cancel := stock.FollowUp(ctx)
	defer cancel()
	if err := s.st.RealignCampaign(fctx, c); err != nil {
		s.cfg.Logger.Warn("writing a campaign's pool to Redis failed; its first admission does", "campaign", c.ID, "err", err)
	}
}

func (s *Service) forget(id string) {
	s.mu.Lock()
	delete(s.views, id)
	s.mu.Unlock()
}

// Get is campaign id's view, at most Staleness old (its state and now as
// of the answer; see Staleness for how a node keeps it so).
func (s *Service) Get(ctx context.Context, id string) (View, error) {
	if err := inventory.ValidateCampaignID(id); err != nil {
		return View{}, err
	}
	c, ok := s.cached(id)
	if ok && c.answerable(s.cfg.Now()) {
		return s.stated(c.v), nil
	}
	v, err, _ := s.reads.Do(id, func() (any, error) {
		// A read or a check that finished since this caller looked is as good.
		c, ok := s.cached(id)
		now := s.cfg.Now()
		if ok && c.answerable(now) {
			return c.v, nil
		}
		ctx := context.WithoutCancel(ctx)
		if ok && c.checkable(now) {
			switch same, err := s.unchanged(ctx, c); {
			case same:
				s.confirm(id, c.gen, now, time.Time{})
				return c.v, nil
			case err != nil && now.Sub(c.read) < ScheduledStaleness:
				// Redis cannot tell: the view read less than
				// ScheduledStaleness ago stands, Redis asked again after
				// Staleness.
				s.confirm(id, c.gen, time.Time{}, now.Add(Staleness))
				return c.v, nil
			}
		}
		return s.read(ctx, id)
	})
	switch {
	case err == nil:
		return s.stated(v.(View)), nil
	case ok && !errors.Is(err, inventory.ErrNotFound):
		// The database is slow or away: the last view read stands (its
		// state still follows the clock); a sale is decided elsewhere.
		return s.stated(c.v), nil
	}
	return View{}, err
}

func (s *Service) cached(id string) (cached, bool) {
	s.mu.RLock()
	c, ok := s.views[id]
	s.mu.RUnlock()
	return c, ok
}

// answerable says whether c may be answered at now: it is less than
// Staleness old, counting a view read before the opening as current until
// its last check or starts_at, whichever is first (nothing sells before
// it); or Redis could not tell and it is less than ScheduledStaleness old.
func (c cached) answerable(now time.Time) bool {
	if c.read.Before(c.v.StartsAt) && c.v.State != Ended && now.Before(c.retry) {
		return now.Sub(c.read) < ScheduledStaleness && now.Sub(c.v.StartsAt) < Staleness
	}
	asOf := c.checked
	if c.read.Before(c.v.StartsAt) && c.v.StartsAt.Before(asOf) {
		asOf = c.v.StartsAt
	}
	return now.Sub(asOf) < Staleness
}

// checkable says whether a check in Redis can make c answerable at now: a
// view read before the opening, until Staleness after it.
func (c cached) checkable(now time.Time) bool {
	return c.read.Before(c.v.StartsAt) && c.v.State != Ended && now.Sub(c.v.StartsAt) < Staleness
}

// unchanged says whether Redis's copy of c's pool is still the one c was
// read with (the same initialisation, the same window): every change of
// the campaign writes it again under a new epoch. An error: Redis cannot
// tell (out of reach, or it has no copy).
func (s *Service) unchanged(ctx context.Context, c cached) (bool, error) {
	lv, err := s.st.CampaignLevels(ctx, stock.Campaign{ID: c.v.ID, SKU: c.v.SKU})
	switch {
	case err != nil:
		return false, err
	case !lv.Initialised:
		return false, fmt.Errorf("%w: Redis has no copy of campaign %s", inventory.ErrUnavailable, c.v.ID)
	}
	return lv.Epoch == c.epoch && lv.Opens.UnixMilli() == c.v.StartsAt.UnixMilli() && lv.Closes.UnixMilli() == c.v.EndsAt.UnixMilli(), nil
}

// confirm records a check of view gen of campaign id: current at checked
// (zero: not known), Redis asked again at retry. A view read since is left
// alone.
func (s *Service) confirm(id string, gen uint64, checked, retry time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.views[id]; ok && c.gen == gen {
		if !checked.IsZero() {
			c.checked = checked
		}
		c.retry = retry
		s.views[id] = c
	}
}

// read reads campaign id's view from the database and keeps it.
func (s *Service) read(ctx context.Context, id string) (View, error) {
	read := s.cfg.Now()
	var c arbiter.Campaign
	if err := s.db.WithContext(ctx).Take(&c, "id = ?", id).Error; err != nil {
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return View{}, fmt.Errorf("%w: no campaign %s", inventory.ErrNotFound, id)
		}
		return View{}, err
	}
	n, err := arbiter.CountCampaign(s.db.WithContext(ctx), id)
	if err != nil {
		return View{}, err
	}
	v := View{ID: c.ID, SKU: c.SKU, Allotment: c.Allotment, Sold: n.Sold, Held: n.Held, Remaining: n.Left,
		StartsAt: c.StartsAt.UTC(), EndsAt: c.EndsAt.UTC(), PerUserLimit: c.PerUserLimit, HoldSeconds: c.HoldSeconds,
		Version: c.Version()}
	if n.Ended {
		v.Remaining, v.State = 0, Ended
	}
	s.mu.Lock()
	s.gen++
	s.views[id] = cached{v: v, epoch: c.RedisEpoch, read: read, checked: read, defined: read, gen: s.gen}
	s.mu.Unlock()
	return s.stated(v), nil
}

// stated is v with its state and now as of this moment (the window's
// edges pass between two reads of the counts).
func (s *Service) stated(v View) View {
	v.Now = s.now()
	switch {
	case v.State == Ended || !v.Now.Before(v.EndsAt):
		v.State = Ended
	case v.Now.Before(v.StartsAt):
		v.State = Scheduled
	case v.Remaining == 0:
		v.State = SoldOut
	default:
		v.State = Live
	}
	return v
}

// End ends campaign id now: its window closes and the unsold rest returns
// to the SKU in one movement. Ending an ended campaign changes nothing.
func (s *Service) End(ctx context.Context, id string) (View, error) {
	if err := inventory.ValidateCampaignID(id); err != nil {
		return View{}, err
	}
	var freed arbiter.Freed
	var sku string
	err := arbiter.Transact(ctx, s.db, func(tx *gorm.DB) error {
		var err error
		if freed, err = arbiter.In(tx).EndCampaign(id, s.now()); err != nil {
			return err
		}
		return tx.Model(&arbiter.Campaign{}).Where("id = ?", id).Pluck("sku", &sku).Error
	})
	if err != nil {
		return View{}, err
	}
	s.redis.Apply(ctx, freed.Changes)
	// Nothing of an ended campaign is needed in Redis: its keys go now (an
	// end repeated deletes what a failed deletion left).
	s.forget(id)
	s.redis.Ended(ctx, []arbiter.CampaignRef{{ID: id, SKU: sku}})
	// A sold-out flag would answer insufficient_stock where the answer is
	// now sale_ended: every node drops it (a buy then finds no pool, and
	// its initialisation answers ended).
	if err := s.st.PublishStockBack(ctx, SoldOutKey(id)); err != nil {
		s.cfg.Logger.Warn("publishing a campaign's end failed; other nodes' sold-out flags expire on their own", "campaign", id, "err", err)
	}
	return s.read(ctx, id)
}

// NotStarted is a buy before the opening: the answer says when it opens.
type NotStarted struct{ StartsAt, Now time.Time }

func (e NotStarted) Error() string {
	return fmt.Sprintf("the sale opens at %s", e.StartsAt.Format(time.RFC3339))
}

func (e NotStarted) Unwrap() error { return inventory.ErrNotStarted }

// definition is the view of campaign id a buy is checked against at now:
// its window, limit and hold at most Staleness old; its counts may be
// older (a buy does not need them). The view Get would answer serves; past
// Staleness, Redis's copy of the pool (every change of the campaign writes
// it again under a new epoch) confirms the definition with one HMGET, one
// at a time per node. So a crowd buying during a sale waits for no read of
// the counts, whose cost grows with the sales (a scan of the campaign's
// reservations); Get reads them at most every Staleness for the pages
// polling. Only when Redis cannot confirm it is the view read again.
func (s *Service) definition(ctx context.Context, id string, now time.Time) (View, error) {
	c, ok := s.cached(id)
	if ok && (c.answerable(now) || now.Sub(c.defined) < Staleness) {
		return c.v, nil
	}
	if ok && c.v.State != Ended {
		v, err, _ := s.reads.Do("definition:"+id, func() (any, error) {
			c, ok := s.cached(id)
			now := s.cfg.Now()
			if ok && (c.answerable(now) || now.Sub(c.defined) < Staleness) {
				return c.v, nil
			}
			if same, err := s.unchanged(context.WithoutCancel(ctx), c); err != nil || !same {
				return nil, errors.Join(err, errChanged)
			}
			s.defined(id, c.gen, now)
			return c.v, nil
		})
		if err == nil {
			return v.(View), nil
		}
	}
	return s.Get(ctx, id)
}

// errChanged is a definition Redis did not confirm.
var errChanged = errors.New("campaign: changed since read")

// defined records that view gen of campaign id had the current definition
// at t. A view read since is left alone.
func (s *Service) defined(id string, gen uint64, t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.views[id]; ok && c.gen == gen && t.After(c.defined) {
		c.defined = t
		s.views[id] = c
	}
}

// Buy sells one unit of campaign id to userID as a PENDING order (with
// idemKey, a retry answers the same order). Before the opening it answers
// a NotStarted itself, not wrapped (inventory.ErrNotStarted), after the
// end inventory.ErrEnded, sold out inventory.ErrInsufficientStock, past
// the buyer's limit inventory.ErrConflict: Redis decides these without the database, which
// decides again, by its own clock, as it records the sale.
func (s *Service) Buy(ctx context.Context, id, userID, idemKey string) (*order.Order, error) {
	// Checked before the window, as the sale would check them: a bad
	// request gets its own answer, before the opening too.
	if err := inventory.ValidateUserID(userID); err != nil {
		return nil, err
	}
	if err := inventory.ValidateIdempotencyKey(idemKey); err != nil {
		return nil, err
	}
	now := s.cfg.Now()
	v, err := s.definition(ctx, id, now)
	if err != nil {
		return nil, err
	}
	// Before the opening (by this node's clock and the view it holds, whose
	// window is at most Staleness old) the answer needs neither Redis nor
	// the database: Redis would compare the same clock with the same
	// window.
	if now.Before(v.StartsAt) {
		return nil, NotStarted{StartsAt: v.StartsAt, Now: now}
	}
	// After the end, or ended by the route, likewise: a crowd that comes
	// late costs Redis nothing (an ended campaign has no keys there; a buy
	// a stale view lets through finds none, and its initialisation answers
	// ended without writing them again).
	if v.State == Ended || !now.Before(v.EndsAt) {
		return nil, fmt.Errorf("%w: %s", inventory.ErrEnded, stock.Campaign{ID: v.ID, SKU: v.SKU})
	}
	o, err := s.orders.BuyCampaign(ctx, userID, idemKey, order.CampaignSale{ID: v.ID, SKU: v.SKU, Limit: v.PerUserLimit,
		Hold: inventory.Seconds(v.HoldSeconds)}, now)
	if errors.Is(err, inventory.ErrNotStarted) {
		return nil, NotStarted{StartsAt: v.StartsAt, Now: now}
	}
	return o, err
}
