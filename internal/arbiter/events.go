package arbiter

import (
	"database/sql"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/acme/inventory"
)

// Stock events (table stock_events) say what a change of a SKU's quantities
// means to a storefront. The database decides them, never Redis:
//
//   - a threshold event is written by the arbiter in the transaction of the
//     change that crosses the threshold, under the SKU's row lock: every
//     method that moves on_hand or reserved reads the row as it left it
//     (with the fence it reads anyway: no statement more for a change that
//     crosses nothing) and compares it with the thresholds the SKU's last
//     events announced (skus.event_flags). So concurrent changes decide each
//     crossing once, a rolled-back change announces nothing, and a path
//     that changes availability cannot forget its event.
//   - sku.level_changed is written by the events job (AnnounceLevels) for
//     the SKUs those statements marked (skus.level_dirty), at most once per
//     SKU per second, with the levels as they are then: a sale costs one
//     column in the UPDATE it runs anyway.
//
// A SKU's events carry seq 1, 2, 3, ... (skus.event_seq, bumped under the
// row lock), so per SKU they commit in seq order with no gap; Publish then
// numbers committed events for the replay feed (their id). Its campaigns'
// events (campaign_events.go) take their seqs from the same stream.

// The events' names (docs/api.md lists them).
const (
	EventSoldOut      = "sku.sold_out"      // available fell to 0
	EventBackInStock  = "sku.back_in_stock" // available rose from 0
	EventLowStock     = "sku.low_stock"     // available fell to low_stock_threshold or below
	EventLevelChanged = "sku.level_changed" // on_hand or reserved moved (coalesced)
	EventShortage     = "sku.shortage"      // a count found fewer units than are held (counts.go)
)

// EventTypes are the names a subscription may ask for: the SKUs' and the
// campaigns' (campaign_events.go).
var EventTypes = []string{EventSoldOut, EventBackInStock, EventLowStock, EventLevelChanged, EventShortage,
	EventCampaignStarted, EventCampaignSoldOut, EventCampaignBackInStock, EventCampaignEnded}

// Event is one stock event: id is its place in the replay feed (nil until
// published), seq its number among its SKU's events; the levels are the
// database's as the change left them (available -1: unlimited).
type Event struct {
	RowID      int64     `gorm:"primaryKey;column:row_id" json:"-"`
	ID         *int64    `gorm:"column:id" json:"id"`
	Type       string    `gorm:"column:type" json:"type"`
	SKU        string    `gorm:"column:sku" json:"sku"`
	Seq        int64     `gorm:"column:seq" json:"seq"`
	CampaignID *string   `gorm:"column:campaign_id" json:"campaign_id,omitempty"`
	OccurredAt time.Time `gorm:"column:occurred_at" json:"occurred_at"`
	OnHand     int64     `gorm:"column:on_hand" json:"on_hand"`
	Reserved   int64     `gorm:"column:reserved" json:"reserved"`
	Available  int64     `gorm:"column:available" json:"available"`
	// Short and CountID are a sku.shortage's: the units the count could
	// not take (on_hand stayed at reserved), and the count.
	Short   *int64  `gorm:"column:short" json:"short,omitempty"`
	CountID *string `gorm:"column:count_id" json:"count_id,omitempty"`
}

func (Event) TableName() string { return "stock_events" }

// The thresholds a SKU's events announced (skus.event_flags).
const (
	flagLow     = 1 // sku.low_stock announced, not yet re-armed by a rise above the threshold
	flagSoldOut = 2 // sku.sold_out announced, not yet followed by sku.back_in_stock
)

// levelRow is a SKU's row as a change left it: its fence and what its
// events need.
type levelRow struct {
	SKU               string `gorm:"column:sku"`
	Seq               int64  `gorm:"column:seq"`
	RedisEpoch        int64  `gorm:"column:redis_epoch"`
	OnHand            int64  `gorm:"column:on_hand"`
	Reserved          int64  `gorm:"column:reserved"`
	LowStockThreshold int64  `gorm:"column:low_stock_threshold"`
	EventFlags        int64  `gorm:"column:event_flags"`
	EventSeq          int64  `gorm:"column:event_seq"`
	MovementPosition  int64  `gorm:"column:movement_position"`
}

func (r levelRow) available() int64 {
	if r.OnHand == inventory.Unlimited {
		return inventory.Unlimited
	}
	return r.OnHand - r.Reserved
}

// thresholdFlags is what a SKU at these levels has crossed: sold out at 0
// available, low at or below a threshold above 0. An unlimited SKU is
// neither.
func thresholdFlags(onHand, reserved, threshold int64) int64 {
	if onHand == inventory.Unlimited {
		return 0
	}
	var f int64
	if onHand-reserved <= 0 {
		f |= flagSoldOut
	}
	if threshold > 0 && onHand-reserved <= threshold {
		f |= flagLow
	}
	return f
}

// Crossed is the arbiter's threshold rule for a checker replaying a
// SKU's history: the flags a SKU at these levels has crossed, and the
// events a move to them from the announced flags writes, in order.
func Crossed(announced, onHand, reserved, threshold int64) (int64, []string) {
	now := thresholdFlags(onHand, reserved, threshold)
	return now, crossings(announced, now)
}

// crossings are the events of a move from the announced flags to now, in
// the order they happened: a fall past the low threshold before the fall
// to zero. A rise above the low threshold re-arms it silently.
func crossings(announced, now int64) []string {
	var out []string
	if now&flagLow != 0 && announced&flagLow == 0 {
		out = append(out, EventLowStock)
	}
	switch {
	case now&flagSoldOut != 0 && announced&flagSoldOut == 0:
		out = append(out, EventSoldOut)
	case now&flagSoldOut == 0 && announced&flagSoldOut != 0:
		out = append(out, EventBackInStock)
	}
	return out
}

var eventColumns = []string{"type", "sku", "seq", "campaign_id", "occurred_at", "on_hand", "reserved", "available"}

// levelsSelect reads what fencesAfter needs of a SKU's row.
const levelsSelect = `SELECT sku, seq, redis_epoch, on_hand, reserved, low_stock_threshold, event_flags, event_seq, movement_position FROM skus WHERE sku IN ?`

// fencesAfter reads skus as this transaction's change left them (their
// rows are locked by that change), writes the threshold events of the
// crossings the change made, and returns the SKUs' fences. Every method
// that moves a SKU's on_hand or reserved calls it after the move. No SKU
// (a batch of campaign sales only, a release back to live pools): no read.
func (a Arbiter) fencesAfter(skus []string) (map[string]Fence, error) {
	fences, _, err := a.levelsAfter(skus)
	return fences, err
}

// levelsAfter is fencesAfter, with the position of each SKU's last
// movement as the change left it (the same read): a change that writes
// movements reads it here, then writes them (insertMovements).
func (a Arbiter) levelsAfter(skus []string) (map[string]Fence, positions, error) {
	if len(skus) == 0 {
		return map[string]Fence{}, positions{}, nil
	}
	rows := make([]levelRow, 0, len(skus))
	if err := a.query(func(rs *sql.Rows) error {
		var r levelRow
		if err := rs.Scan(&r.SKU, &r.Seq, &r.RedisEpoch, &r.OnHand, &r.Reserved, &r.LowStockThreshold, &r.EventFlags, &r.EventSeq,
			&r.MovementPosition); err != nil {
			return err
		}
		rows = append(rows, r)
		return nil
	}, inList(levelsSelect, len(skus)), anys(skus)...); err != nil {
		return nil, nil, err
	}
	return a.levels(rows)
}

// levels is the fences and positions of rows, SKUs as this transaction's
// change left them, after it wrote the threshold events they crossed.
func (a Arbiter) levels(rows []levelRow) (map[string]Fence, positions, error) {
	out := make(map[string]Fence, len(rows))
	last := make(positions, len(rows))
	for _, r := range rows {
		out[r.SKU] = Fence{Seq: r.Seq, Epoch: r.RedisEpoch}
		last[r.SKU] = r.MovementPosition
	}
	return out, last, a.announce(rows)
}

// announce writes the threshold events rows crossed since their last ones
// and records what is announced now.
func (a Arbiter) announce(rows []levelRow) error {
	var args []any
	now := time.Now().UTC().Truncate(time.Microsecond)
	slices.SortFunc(rows, func(x, y levelRow) int { return strings.Compare(x.SKU, y.SKU) })
	for _, r := range rows {
		flags := thresholdFlags(r.OnHand, r.Reserved, r.LowStockThreshold)
		if flags == r.EventFlags {
			continue
		}
		events := crossings(r.EventFlags, flags)
		for i, typ := range events {
			args = append(args, typ, r.SKU, r.EventSeq+int64(i)+1, nil, now, r.OnHand, r.Reserved, r.available())
		}
		if _, err := a.exec(`UPDATE skus SET event_flags = ?, event_seq = event_seq + ? WHERE sku = ?`,
			flags, len(events), r.SKU); err != nil {
			return err
		}
	}
	return a.insertRows("stock_events", eventColumns, args)
}

// levelEvery is the least time between two sku.level_changed of a SKU.
const levelEvery = time.Second

// AnnounceLevels writes sku.level_changed for up to limit SKUs whose
// on_hand or reserved moved since their last one, if that was at least a
// second before now, with their levels as they are (read under their row
// locks, taken in SKU order like every writer's), and returns how many.
// Run it in a transaction, on one node at a time (the events job); a
// second runner would only wait for the first's locks and find the SKUs
// clean or too recent.
func (a Arbiter) AnnounceLevels(now time.Time, limit int) (int, error) {
	now = now.UTC().Truncate(time.Microsecond)
	var skus []string
	if err := a.tx.Raw(`SELECT sku FROM skus WHERE level_dirty = 1 AND (level_at IS NULL OR level_at <= ?) ORDER BY sku LIMIT ?`,
		now.Add(-levelEvery), limit).Scan(&skus).Error; err != nil || len(skus) == 0 {
		return 0, err
	}
	var rows []levelRow
	if err := a.tx.Table("skus").Select("sku, on_hand, reserved, event_seq").
		Where("sku IN ? AND level_dirty = 1 AND (level_at IS NULL OR level_at <= ?)", skus, now.Add(-levelEvery)).
		Order("sku").Clauses(clause.Locking{Strength: "UPDATE"}).Scan(&rows).Error; err != nil {
		return 0, err
	}
	if len(rows) == 0 {
		return 0, nil
	}
	args := make([]any, 0, len(rows)*len(eventColumns))
	names := make([]string, len(rows))
	for i, r := range rows {
		args = append(args, EventLevelChanged, r.SKU, r.EventSeq+1, nil, now, r.OnHand, r.Reserved, r.available())
		names[i] = r.SKU
	}
	if err := a.tx.Exec(`UPDATE skus SET level_dirty = 0, level_at = ?, event_seq = event_seq + 1 WHERE sku IN ?`,
		now, names).Error; err != nil {
		return 0, err
	}
	return len(rows), a.insertRows("stock_events", eventColumns, args)
}

// Events is the stock events' table for the ones that read or number its
// rows: the events job (Publish), the replay feed (Page), the webhook
// subscriptions (Head, Count), retention (PruneBefore). The arbiter
// writes them (announce, AnnounceLevels).
type Events struct{ db *gorm.DB }

// EventsOf is the events' table through db (a transaction or the pool).
func EventsOf(db *gorm.DB) Events { return Events{db: db} }

// Publish gives up to limit committed, unpublished events their feed id,
// in the order they were written, above every id given before, and
// returns how many. The ids grow in the order they become visible: a
// reader paging after an id never passes over one published later. The
// unique id refuses a second publisher's overlapping numbers (its
// transaction fails; the next round numbers them). Run it in a
// transaction, on one node at a time.
func (e Events) Publish(limit int) (int, error) {
	var rowIDs []int64
	if err := e.db.Raw(`SELECT row_id FROM stock_events WHERE id IS NULL ORDER BY row_id LIMIT ?`, limit).
		Scan(&rowIDs).Error; err != nil || len(rowIDs) == 0 {
		return 0, err
	}
	var last int64
	if err := e.db.Raw(`SELECT COALESCE(MAX(id), 0) FROM stock_events`).Scan(&last).Error; err != nil {
		return 0, err
	}
	// Every id above last, in row_id order: row_id + (last + 1 - the first).
	res := e.db.Exec(`UPDATE stock_events SET id = row_id + ? WHERE row_id IN ? AND id IS NULL`,
		last+1-rowIDs[0], rowIDs)
	return int(res.RowsAffected), res.Error
}

// EventFilter selects a page of the replay feed: events with an id above
// After, of SKU if given, at most Limit. A webhook's delivery narrows it to
// the events it subscribed to: of Types if any, of SKUs if any.
type EventFilter struct {
	After int64
	SKU   string
	Limit int
	Types []string
	SKUs  []string
}

// Page reads published events in id order.
func (e Events) Page(f EventFilter) ([]Event, error) {
	var out []Event
	err := e.selected(f).Order("id").Limit(f.Limit).Find(&out).Error
	return out, err
}

// Count counts the published events f selects, whatever its Limit (a
// webhook subscription's backlog: those after the id it was delivered up
// to, of its types and SKUs).
func (e Events) Count(f EventFilter) (int64, error) {
	var n int64
	err := e.selected(f).Model(&Event{}).Count(&n).Error
	return n, err
}

// selected is the published events f selects (an unpublished event's id
// is NULL, so no After passes it).
func (e Events) selected(f EventFilter) *gorm.DB {
	q := e.db.Where("id > ?", f.After)
	if f.SKU != "" {
		q = q.Where("sku = ?", f.SKU)
	}
	if len(f.Types) > 0 {
		q = q.Where("type IN ?", f.Types)
	}
	if len(f.SKUs) > 0 {
		q = q.Where("sku IN ?", f.SKUs)
	}
	return q
}

// Head is the highest feed id given so far (0: none).
func (e Events) Head() (int64, error) {
	var head int64
	err := e.db.Raw(`SELECT COALESCE(MAX(id), 0) FROM stock_events`).Scan(&head).Error
	return head, err
}

// PruneBefore deletes up to limit numbered events that occurred before t
// and whose feed id is at most through, and returns how many (retention:
// through is the lowest id a webhook subscription was delivered up to,
// so nothing a subscription still has to deliver goes). An event not
// numbered yet stays, and so does the one with the highest id, however
// old: Publish numbers on from it, so a reader paging after the last id
// it read never finds the feed numbered again from 1 below it (a week
// without an event would otherwise prune them all).
func (e Events) PruneBefore(t time.Time, through int64, limit int) (int64, error) {
	var rows []int64
	if err := e.db.Raw(`SELECT row_id FROM stock_events WHERE occurred_at < ? AND id IS NOT NULL AND id <= ?
		AND id < (SELECT MAX(id) FROM stock_events) ORDER BY occurred_at LIMIT ?`,
		t, through, limit).Scan(&rows).Error; err != nil || len(rows) == 0 {
		return 0, err
	}
	res := e.db.Exec(`DELETE FROM stock_events WHERE row_id IN ?`, rows)
	return res.RowsAffected, res.Error
}

// OfSKU reads every event of sku, published or not, in seq order (tests,
// fault runs).
func (e Events) OfSKU(sku string) ([]Event, error) {
	var out []Event
	err := e.db.Where("sku = ?", sku).Order("seq").Find(&out).Error
	return out, err
}

// Unpublished counts the events not yet given a feed id.
func (e Events) Unpublished() (int64, error) {
	var n int64
	err := e.db.Raw(`SELECT COUNT(*) FROM stock_events WHERE id IS NULL`).Scan(&n).Error
	return n, err
}
