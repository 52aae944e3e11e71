package maintenance

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/stock"
)

// WarmAhead is how long before its opening a campaign's pool is written to
// Redis if Redis does not have it (after a restart or a flush), so no
// buyer waits for a cold init at the opening.
const WarmAhead = 10 * time.Minute

// EndedKeysHorizon is how far back the realign looks for ended campaigns
// whose Redis keys to delete again: each end deletes them itself, and this
// is for a deletion that failed (Redis out of reach at the end, the node
// died between the end's commit and its deletion). Keys left longer than
// this expire stock.CampaignKeysLinger after their window's close.
const EndedKeysHorizon = 24 * time.Hour

// CampaignReport is one campaign whose Redis copy disagrees with the
// database.
type CampaignReport struct {
	ID         string `json:"campaign"`
	SKU        string `json:"sku"`
	Left       int64  `json:"left"`       // the pool's units in the database
	RedisLeft  *int64 `json:"redis_left"` // nil: Redis does not have it
	Problem    string `json:"problem"`
	Repaired   bool   `json:"repaired"`
	RedisEpoch *int64 `json:"redis_epoch"` // the initialisation Redis holds
}

// livePool is a campaign whose pool is HELD and whose window has not
// closed (it has not ended).
type livePool struct {
	arbiter.Campaign
	Left int64 `gorm:"column:pool_left"`
	Seq  int64 `gorm:"column:pool_seq"` // the pool's change counter (its result column)
}

// livePools reads every campaign that has not ended at now, with its
// pool's units and seq (the pool is the campaign's one reservation row
// without an order); ids, if any, only those campaigns. A campaign whose
// window closed has nothing in Redis (its pool is released by the timeout
// sweep; its initialisation answers ended).
func (c *Reconciler) livePools(ctx context.Context, now time.Time, ids ...string) ([]livePool, error) {
	q := `SELECT c.*, r.qty AS pool_left, r.result AS pool_seq FROM campaigns c
		JOIN stock_reservations r ON r.campaign_id = c.id AND r.order_id IS NULL AND r.state = 'HELD'
		WHERE c.ends_at > ?`
	args := []any{now.UTC()}
	if len(ids) > 0 {
		q += ` AND c.id IN ?`
		args = append(args, ids)
	}
	var rows []livePool
	err := c.db.WithContext(ctx).Raw(q+` ORDER BY c.id`, args...).Scan(&rows).Error
	return rows, err
}

// checkCampaign compares campaign p's pool in Redis with the database's at
// now: what is wrong with it, or "" (a pool Redis does not have is fine:
// its first admission initialises it, and warm reports whether it should
// be written now), and how it stands (behindDB: only fewer units, which
// admissions in flight explain for a moment).
func checkCampaign(p livePool, lv stock.CampaignLevels, now time.Time) (problem string, st standing, warm bool) {
	switch {
	case !lv.Initialised:
		return "", notInRedis, p.StartsAt.Sub(now) < WarmAhead
	case lv.Epoch != p.RedisEpoch:
		return fmt.Sprintf("Redis holds initialisation %d; the database last handed out %d", lv.Epoch, p.RedisEpoch), wrong, false
	case lv.BuyersEpoch != 0 && lv.BuyersEpoch != lv.Epoch:
		return fmt.Sprintf("Redis's buyers' counts come from initialisation %d, its pool from %d", lv.BuyersEpoch, lv.Epoch), wrong, false
	case lv.Opens.UnixMilli() != p.StartsAt.UnixMilli() || lv.Closes.UnixMilli() != p.EndsAt.UnixMilli():
		return "Redis has another window than the database", wrong, false
	case lv.Available < p.Left:
		return fmt.Sprintf("Redis has %d units left; the pool has %d", lv.Available, p.Left), behindDB, false
	case lv.Available > p.Left:
		return fmt.Sprintf("Redis has %d units left; the pool has %d", lv.Available, p.Left), wrong, false
	}
	return "", aligned, false
}

// eachPool calls fn with every campaign that has not ended, its pool in
// Redis and what Redis holds of it; a campaign whose Redis read fails is
// skipped, the errors joined.
func (c *Reconciler) eachPool(ctx context.Context, fn func(livePool, stock.Campaign, stock.CampaignLevels) error) error {
	pools, err := c.livePools(ctx, time.Now())
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range pools {
		camp := stock.Campaign{ID: p.ID, SKU: p.SKU}
		lv, err := c.stock.CampaignLevels(ctx, camp)
		if err == nil {
			err = fn(p, camp, lv)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ReconcileCampaigns checks every campaign that has not ended: its Redis
// copy against the pool in the database (units, initialisation, window).
// With repair it writes the pool to Redis again (a new epoch: exact even
// under traffic). Redis numbers are exact at a quiet point; under traffic
// an admission in flight shows as a difference of its units.
func (c *Reconciler) ReconcileCampaigns(ctx context.Context, repair bool) ([]CampaignReport, error) {
	var out []CampaignReport
	err := c.eachPool(ctx, func(p livePool, camp stock.Campaign, lv stock.CampaignLevels) error {
		problem, _, _ := checkCampaign(p, lv, time.Now())
		if problem == "" {
			return nil
		}
		r := CampaignReport{ID: p.ID, SKU: p.SKU, Left: p.Left, Problem: problem}
		if lv.Initialised {
			r.RedisLeft, r.RedisEpoch = &lv.Available, &lv.Epoch
		}
		var err error
		if repair {
			err = c.stock.RealignCampaign(ctx, camp)
			r.Repaired = err == nil
		}
		out = append(out, r)
		return err
	})
	return out, err
}

// RealignCampaigns is the periodic job's part for campaigns: every pool
// whose Redis copy differs from the database's is written again, and every
// pool Redis lacks is written if its campaign opens within WarmAhead (the
// warm-up); a pool only behind the database is left alone while a sale
// moves it, as Realign leaves a SKU. Then the keys of campaigns that ended
// within EndedKeysHorizon are deleted again. It returns the campaigns it
// wrote.
func (c *Reconciler) RealignCampaigns(ctx context.Context) ([]string, error) {
	var done []string
	var behind []poolSample
	err := c.eachPool(ctx, func(p livePool, camp stock.Campaign, lv stock.CampaignLevels) error {
		var err error
		switch problem, st, warm := checkCampaign(p, lv, time.Now()); {
		case warm:
			err = c.stock.WarmCampaign(ctx, camp)
		case st == behindDB:
			behind = append(behind, poolSample{p, lv})
			return nil
		case problem != "":
			err = c.stock.RealignCampaign(ctx, camp)
		default:
			return nil
		}
		if err == nil {
			done = append(done, p.ID)
		}
		return err
	})
	if len(behind) > 0 && ctx.Err() == nil {
		still, serr := c.poolsStoodStill(ctx, behind)
		for _, p := range still {
			rerr := c.stock.RealignCampaign(ctx, stock.Campaign{ID: p.ID, SKU: p.SKU})
			if rerr == nil {
				done = append(done, p.ID)
			}
			serr = errors.Join(serr, rerr)
		}
		err = errors.Join(err, serr)
	}
	return done, errors.Join(err, c.DropEndedCampaigns(ctx, time.Now()))
}

// poolSample is a live pool as the database had it and Redis's copy, read
// one after the other.
type poolSample struct {
	p  livePool
	lv stock.CampaignLevels
}

// poolsStoodStill is stoodStill for campaign pools: after the settle, the
// pools whose seq, Redis value and epoch did not move and that are still
// only behind.
func (c *Reconciler) poolsStoodStill(ctx context.Context, before []poolSample) ([]livePool, error) {
	c.wait(ctx, c.settle)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ids := make([]string, len(before))
	for i, b := range before {
		ids[i] = b.p.ID
	}
	pools, err := c.livePools(ctx, time.Now(), ids...)
	if err != nil {
		return nil, err
	}
	now := make(map[string]livePool, len(pools))
	for _, p := range pools {
		now[p.ID] = p
	}
	var out []livePool
	var errs []error
	for _, b := range before {
		p, ok := now[b.p.ID]
		if !ok || p.Seq != b.p.Seq {
			continue
		}
		lv, err := c.stock.CampaignLevels(ctx, stock.Campaign{ID: p.ID, SKU: p.SKU})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if _, st, _ := checkCampaign(p, lv, time.Now()); st == behindDB && lv.Available == b.lv.Available && lv.Epoch == b.lv.Epoch {
			out = append(out, p)
		}
	}
	return out, errors.Join(errs...)
}

// DropEndedCampaigns deletes from Redis, again, the keys of every campaign
// that ended within EndedKeysHorizon before now (its end deleted them, but
// a deletion can fail). Deleting keys nothing has is free of harm, and
// nothing writes an ended campaign's keys again.
func (c *Reconciler) DropEndedCampaigns(ctx context.Context, now time.Time) error {
	ended, err := arbiter.EndedCampaigns(c.db.WithContext(ctx), now.Add(-EndedKeysHorizon), now)
	if err != nil || len(ended) == 0 {
		return err
	}
	cs := make([]stock.Campaign, len(ended))
	for i, e := range ended {
		cs[i] = stock.Campaign{ID: e.ID, SKU: e.SKU}
	}
	return c.stock.DropCampaigns(ctx, cs...)
}
