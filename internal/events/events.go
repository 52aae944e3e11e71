// Package events runs the stock events' one-node job: it writes
// sku.level_changed for the SKUs whose levels moved (at most one per SKU
// per second, through the arbiter), campaign.started and campaign.ended
// for the campaigns whose window the database's clock opened or closed
// and nothing announced yet (arbiter.AnnounceCampaigns), and numbers
// committed events for the replay feed (arbiter.Events.Publish), on one
// node at a time under a renewed lock, as the outbox relay does. The
// threshold events themselves are the arbiter's, written in the
// transaction that crosses the threshold; nothing here decides one, and
// no node's clock decides a campaign's.
package events

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"gorm.io/gorm"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/job"
	"github.com/acme/inventory/internal/lock"
)

// Config tunes a Job.
type Config struct {
	// Interval between rounds of numbering events. Default 200ms.
	Interval time.Duration
	// LevelInterval between rounds of sku.level_changed. Default 1s (the
	// arbiter writes at most one per SKU per second whatever it is).
	LevelInterval time.Duration
	// Batch bounds the events numbered, and the SKUs announced, per
	// transaction. Default 500.
	Batch int
	// LockTTL is the leader lock's expiry, renewed while it leads.
	// Default 2s.
	LockTTL time.Duration
	// RoundTimeout bounds one transaction. Default 5s.
	RoundTimeout time.Duration
	Logger       *slog.Logger
	// Now is the clock level events are stamped and spaced by. Default
	// time.Now.
	Now func() time.Time
}

// Job is the events job.
type Job struct {
	db     *gorm.DB
	locker *lock.Locker
	cfg    Config
	run    job.Runner
}

// New returns the events job on db, led under locker's lock.
func New(db *gorm.DB, locker *lock.Locker, cfg Config) *Job {
	if cfg.Interval <= 0 {
		cfg.Interval = 200 * time.Millisecond
	}
	if cfg.LevelInterval <= 0 {
		cfg.LevelInterval = time.Second
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 500
	}
	if cfg.LockTTL <= 0 {
		cfg.LockTTL = 2 * time.Second
	}
	if cfg.RoundTimeout <= 0 {
		cfg.RoundTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Job{db: db, locker: locker, cfg: cfg}
}

// Start runs the job until Stop; a second Start is a no-op.
func (j *Job) Start(ctx context.Context) { j.run.Start(ctx, j.loop) }

// Stop ends the job and waits for it; safe before Start and twice.
func (j *Job) Stop() { j.run.Stop() }

func (j *Job) loop(ctx context.Context) {
	job.Lead(ctx, job.Lock{Locker: j.locker, Key: lock.EventsKey, TTL: j.cfg.LockTTL, Log: j.cfg.Logger}, j.lead)
}

// lead runs rounds while this node holds the lock.
func (j *Job) lead(ctx context.Context) {
	backoff := job.Backoff{Min: j.cfg.Interval, Max: 5 * time.Second}
	var lastLevels time.Time
	for ctx.Err() == nil {
		var err error
		if time.Since(lastLevels) >= j.cfg.LevelInterval {
			lastLevels = time.Now()
			_, err = j.AnnounceLevels(ctx)
		}
		if err == nil {
			_, err = j.AnnounceCampaigns(ctx)
		}
		if err == nil {
			_, err = j.Publish(ctx)
		}
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, context.Canceled) {
				j.cfg.Logger.Warn("events: round failed", "err", err)
			}
			job.Sleep(ctx, backoff.Next(), nil)
			continue
		}
		backoff.Reset()
		job.Sleep(ctx, j.cfg.Interval, nil)
	}
}

// AnnounceLevels writes the due sku.level_changed events, a batch per
// transaction, and returns how many.
func (j *Job) AnnounceLevels(ctx context.Context) (int, error) {
	total := 0
	for {
		var n int
		err := j.tx(ctx, func(tx *gorm.DB) (err error) {
			n, err = arbiter.In(tx).AnnounceLevels(j.cfg.Now(), j.cfg.Batch)
			return err
		})
		total += n
		if err != nil || n < j.cfg.Batch {
			return total, err
		}
	}
}

// AnnounceCampaigns writes the campaign.started and campaign.ended the
// database's clock made due, a batch of campaigns per transaction, and
// returns how many. Nothing due costs one statement.
func (j *Job) AnnounceCampaigns(ctx context.Context) (int, error) {
	total := 0
	for {
		var n, seen int
		err := j.tx(ctx, func(tx *gorm.DB) (err error) {
			n, seen, err = arbiter.In(tx).AnnounceCampaigns(j.cfg.Batch)
			return err
		})
		total += n
		if err != nil || seen < j.cfg.Batch {
			return total, err
		}
	}
}

// Publish numbers the committed events for the replay feed, a batch per
// transaction, and returns how many.
func (j *Job) Publish(ctx context.Context) (int, error) {
	total := 0
	for {
		var n int
		err := j.tx(ctx, func(tx *gorm.DB) (err error) {
			n, err = arbiter.EventsOf(tx).Publish(j.cfg.Batch)
			return err
		})
		total += n
		if err != nil || n < j.cfg.Batch {
			return total, err
		}
	}
}

func (j *Job) tx(ctx context.Context, fn func(tx *gorm.DB) error) error {
	ctx, cancel := context.WithTimeout(ctx, j.cfg.RoundTimeout)
	defer cancel()
	return arbiter.Transact(ctx, j.db, fn)
}
