package webhooks

import (
	"context"
	"fmt"
	"time"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
)

// Target is a subscription as its delivery needs it: with its secret
// (never logged: it has no String, and the delivery names only ID) and
// its delivery state.
type Target struct {
	ID, URL, Secret string
	Events, SKUs    []string
	State           State
	DeliveredID     int64
	Attempts        int
	FailingSince    *time.Time
	NextAttemptAt   *time.Time
}

// IDs lists the subscriptions' ids.
func (svc *Service) IDs(ctx context.Context) ([]string, error) {
	var ids []string
	err := svc.db.WithContext(ctx).Model(&row{}).Order("id").Pluck("id", &ids).Error
	return ids, err
}

// Target reads subscription id for its delivery (inventory.ErrNotFound
// once deleted).
func (svc *Service) Target(ctx context.Context, id string) (*Target, error) {
	var rows []row
	if err := svc.db.WithContext(ctx).Where("id = ?", id).Find(&rows).Error; err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%w: no webhook %s", inventory.ErrNotFound, id)
	}
	r := rows[0]
	t := &Target{ID: r.ID, URL: r.URL, Secret: r.Secret, State: r.State, DeliveredID: r.DeliveredID,
		Attempts: r.Attempts, FailingSince: r.FailingSince, NextAttemptAt: r.NextAttemptAt}
	return t, r.filters(&t.Events, &t.SKUs)
}

// Pending reads up to limit of t's events above its cursor, in feed id
// order, and the feed's head as it was before they were read: when fewer
// than limit come back, every event up to head that t subscribed to is
// among them, so its cursor may pass head once they are delivered.
func (svc *Service) Pending(ctx context.Context, t *Target, limit int) (events []arbiter.Event, head int64, err error) {
	feed := arbiter.EventsOf(svc.db.WithContext(ctx))
	if head, err = feed.Head(); err != nil {
		return nil, 0, err
	}
	events, err = feed.Page(arbiter.EventFilter{After: t.DeliveredID, Types: t.Events, SKUs: t.SKUs, Limit: limit})
	return events, head, err
}

// Delivered records that subscription id's event eventID was delivered at
// now: its cursor moves there (never back: a node that delivered an older
// event late changes nothing) and its failures are forgotten.
func (svc *Service) Delivered(ctx context.Context, id string, eventID int64, now time.Time) error {
	return svc.db.WithContext(ctx).Model(&row{}).Where("id = ? AND delivered_id < ?", id, eventID).Updates(map[string]any{
		"delivered_id": eventID, "state": Active, "attempts": 0, "failing_since": nil, "next_attempt_at": nil,
		"last_success_at": now.UTC().Truncate(time.Microsecond),
	}).Error
}

// Skip moves subscription id's cursor up to through, over events it did
// not subscribe to (never back).
func (svc *Service) Skip(ctx context.Context, id string, through int64) error {
	return svc.db.WithContext(ctx).Model(&row{}).Where("id = ? AND delivered_id < ?", id, through).
		Update("delivered_id", through).Error
}

// Failure is a failed attempt at a subscription's oldest undelivered
// event, as the delivery decided it.
type Failure struct {
	At, Next time.Time // when it failed, when the next attempt may start
	Attempts int       // failed attempts in a row, this one counted
	Since    time.Time // when the first of them failed
	Failing  bool      // failing for longer than the threshold
	Error    string    // what went wrong, without the secret or the signature
}

// maxErrorLen is last_error's width.
const maxErrorLen = 1024

// Failed records a failed attempt of subscription id while its cursor is
// still at deliveredID (a node that lost the subscription and failed late
// changes nothing once the cursor moved). A failing subscription keeps
// its backlog: nothing is ever skipped or deleted for failing.
func (svc *Service) Failed(ctx context.Context, id string, deliveredID int64, f Failure) error {
	state := Active
	if f.Failing {
		state = Failing
	}
	msg := f.Error
	if len(msg) > maxErrorLen {
		msg = msg[:maxErrorLen-3] + "..."
	}
	at := f.At.UTC().Truncate(time.Microsecond)
	return svc.db.WithContext(ctx).Model(&row{}).Where("id = ? AND delivered_id = ?", id, deliveredID).Updates(map[string]any{
		"state": state, "attempts": f.Attempts, "failing_since": f.Since.UTC().Truncate(time.Microsecond),
		"next_attempt_at": f.Next.UTC().Truncate(time.Microsecond), "last_error": msg, "last_error_at": at,
	}).Error
}

// Oldest is, per subscription id, when its oldest undelivered event
// occurred (absent: nothing undelivered). Each subscription costs one
// read of the first of its events above its cursor, which the delivery
// keeps at its head of line.
func (svc *Service) Oldest(ctx context.Context) (map[string]time.Time, error) {
	var rows []row
	if err := svc.db.WithContext(ctx).Select("id", "events", "skus", "delivered_id").Find(&rows).Error; err != nil {
		return nil, err
	}
	out := make(map[string]time.Time, len(rows))
	for _, r := range rows {
		t := Target{ID: r.ID, DeliveredID: r.DeliveredID}
		if err := r.filters(&t.Events, &t.SKUs); err != nil {
			return nil, err
		}
		first, err := arbiter.EventsOf(svc.db.WithContext(ctx)).Page(arbiter.EventFilter{
			After: t.DeliveredID, Types: t.Events, SKUs: t.SKUs, Limit: 1})
		if err != nil {
			return nil, err
		}
		if len(first) == 1 {
			out[r.ID] = first[0].OccurredAt
		}
	}
	return out, nil
}
