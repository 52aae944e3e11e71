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

// EndedKeysLinger is how long after its end a campaign's Redis keys are
// kept (a buy a node answers from a view of the window up to
// campaign.Staleness old still finds them), and EndedKeysHorizon how far
// back the realign looks for ended campaigns whose keys to delete: one
// that ended earlier (the job was down that long) keeps its keys.
const (
	EndedKeysLinger  = time.Hour
	EndedKeysHorizon = 7 * 24 * time.Hour
)

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

// livePool is a campaign whose pool is HELD (it has not ended).
type livePool struct {
	arbiter.Campaign
	Left int64 `gorm:"column:pool_left"`
}

// livePools reads every campaign that has not ended, with its pool's units
// (the pool is the campaign's one reservation row without an order).
func (c *Reconciler) livePools(ctx context.Context) ([]livePool, error) {
	var rows []livePool
	err := c.db.WithContext(ctx).Raw(`SELECT c.*, r.qty AS pool_left FROM campaigns c
		JOIN stock_reservations r ON r.campaign_id = c.id AND r.order_id IS NULL AND r.state = 'HELD' ORDER BY c.id`).Scan(&rows).Error
	return rows, err
}

// checkCampaign compares campaign p's pool in Redis with the database's at
// now: what is wrong with it, or "" (a pool Redis does not have is fine:
// its first admission initialises it, and warm reports whether it should
// be written now).
func checkCampaign(p livePool, lv stock.CampaignLevels, now time.Time) (problem string, warm bool) {
	switch {
	case !lv.Initialised:
		return "", p.StartsAt.Sub(now) < WarmAhead
	case lv.Epoch != p.RedisEpoch:
		return fmt.Sprintf("Redis holds initialisation %d; the database last handed out %d", lv.Epoch, p.RedisEpoch), false
	case lv.Available != p.Left:
		return fmt.Sprintf("Redis has %d units left; the pool has %d", lv.Available, p.Left), false
	case lv.Opens.UnixMilli() != p.StartsAt.UnixMilli() || lv.Closes.UnixMilli() != p.EndsAt.UnixMilli():
		return "Redis has another window than the database", false
	}
	return "", false
}

// eachPool calls fn with every campaign that has not ended, its pool in
// Redis and what Redis holds of it; a campaign whose Redis read fails is
// skipped, the errors joined.
func (c *Reconciler) eachPool(ctx context.Context, fn func(livePool, stock.Campaign, stock.CampaignLevels) error) error {
	pools, err := c.livePools(ctx)
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
		problem, _ := checkCampaign(p, lv, time.Now())
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
// warm-up). It returns the campaigns it wrote.
func (c *Reconciler) RealignCampaigns(ctx context.Context) ([]string, error) {
	var done []string
	err := c.eachPool(ctx, func(p livePool, camp stock.Campaign, lv stock.CampaignLevels) error {
		var err error
		switch problem, warm := checkCampaign(p, lv, time.Now()); {
		case warm:
			err = c.stock.WarmCampaign(ctx, camp)
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
	return done, errors.Join(err, c.DropEndedCampaigns(ctx, time.Now()))
}

// DropEndedCampaigns deletes from Redis the keys of every campaign that
// ended between EndedKeysHorizon and EndedKeysLinger before now. Each
// node's reconciler drops a campaign once (a late buy that initialised the
// pool again leaves it, a few hashes, until that node restarts).
func (c *Reconciler) DropEndedCampaigns(ctx context.Context, now time.Time) error {
	var ended []arbiter.Campaign
	if err := c.db.WithContext(ctx).Select("id", "sku").Where("ends_at >= ? AND ends_at < ?", now.Add(-EndedKeysHorizon), now.Add(-EndedKeysLinger)).
		Find(&ended).Error; err != nil {
		return err
	}
	var errs []error
	for _, e := range ended {
		if _, done := c.dropped.Load(e.ID); done {
			continue
		}
		err := c.stock.DropCampaign(ctx, stock.Campaign{ID: e.ID, SKU: e.SKU})
		if err == nil {
			c.dropped.Store(e.ID, true)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
