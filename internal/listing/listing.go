// Package listing pages through what the service holds, for operators and
// storefronts: SKUs (optionally those low on stock), one SKU's movements,
// and orders (by buyer, status and creation time). Each page is one query
// on an index, with a cursor that is the last key seen; nothing here writes.
package listing

import (
	"context"
	"slices"
	"time"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/order"
	"gorm.io/gorm"
)

// Page sizes of every listing: 0 asks for the default.
const (
	DefaultPageSize = 50
	MaxPageSize     = 500
)

func pageLimit(limit int) (int, error) {
	switch {
	case limit == 0:
		return DefaultPageSize, nil
	case limit < 1 || limit > MaxPageSize:
		return 0, inventory.Invalidf("limit must be between 1 and %d", MaxPageSize)
	}
	return limit, nil
}

// Reader reads the listings from db.
type Reader struct{ db *gorm.DB }

// New is a Reader on db.
func New(db *gorm.DB) *Reader { return &Reader{db: db} }

// MovementPage is one page of a SKU's history, in position order. Next is
// where to read on from, on every page, the last one too: the position of
// the page's last movement, or the after it was read from when it is
// empty. More says that more movements follow it already (the page is
// full); a follower polls from Next whether or not.
type MovementPage struct {
	Items []arbiter.Movement
	Next  int64
	More  bool
}

// Movements returns sku's movements with a position above after, in
// position order, at most limit (0: DefaultPageSize). Positions are
// numbered under the SKU's row lock as the changes commit (see
// arbiter.Movement), so a reader that reads on from the last position it
// has gets every movement once, in commit order, whatever commits late: a
// movement still uncommitted when a page is read is numbered after every
// movement that page could show.
func (r *Reader) Movements(ctx context.Context, sku string, after int64, limit int) (*MovementPage, error) {
	if err := inventory.ValidateSKU(sku); err != nil {
		return nil, err
	}
	if after < 0 {
		return nil, inventory.Invalidf("after must be a movement position (0 or above)")
	}
	limit, err := pageLimit(limit)
	if err != nil {
		return nil, err
	}
	db := r.db.WithContext(ctx)
	// The SKU's last position, which the SKU's existence comes with: an
	// after beyond it was never a position of this SKU (a movement id, a
	// cursor of another SKU), and reading on from it would wait for ever.
	var last []int64
	if err := db.Model(&arbiter.SKU{}).Where("sku = ?", sku).Pluck("movement_position", &last).Error; err != nil {
		return nil, err
	}
	if len(last) == 0 {
		return nil, inventory.UnknownSKU(sku)
	}
	if after > last[0] {
		return nil, inventory.Invalidf("after %d is beyond %s's last movement (position %d)", after, sku, last[0])
	}
	var ms []arbiter.Movement
	if err := db.Where("sku = ? AND position > ?", sku, after).Order("position").Limit(limit + 1).Find(&ms).Error; err != nil {
		return nil, err
	}
	p := &MovementPage{Items: ms, Next: after}
	if ms == nil {
		p.Items = []arbiter.Movement{}
	}
	if len(ms) > limit {
		p.Items, p.More = ms[:limit], true
	}
	if n := len(p.Items); n > 0 {
		p.Next = p.Items[n-1].Position
	}
	return p, nil
}

// SKUQuery selects a page of the SKU listing, in SKU order.
type SKUQuery struct {
	// LowStock keeps only limited SKUs with on_hand - reserved <= *LowStock.
	LowStock *int64
	// After is the cursor: the last SKU of the previous page ("" for the first).
	After string
	// Limit is the page size (0: DefaultPageSize).
	Limit int
}

// SKUListItem is a SKU in a listing: the view Get returns without
// redis_available. A listing is built from the database rows alone (one
// query per page, no Redis round trip per SKU); GET /v1/skus/{sku} shows what
// Redis has.
type SKUListItem struct {
	SKU          string `json:"sku"`
	OnHand       int64  `json:"on_hand"`
	Reserved     int64  `json:"reserved"`
	Available    int64  `json:"available"`
	Unlimited    bool   `json:"unlimited"`
	PerUserLimit int64  `json:"per_user_limit"`
}

// SKUPage is one page of the SKU listing; Next is the cursor of the following
// page ("" on the last).
type SKUPage struct {
	Items []SKUListItem
	Next  string
}

// SKUs returns a page of SKUs in SKU order. A low-stock filter reads the SKUs
// in key order and keeps the matching ones (no index covers on_hand -
// reserved): its cost grows with the catalog, not with the page.
func (r *Reader) SKUs(ctx context.Context, q SKUQuery) (*SKUPage, error) {
	if q.After != "" {
		if err := inventory.ValidateSKU(q.After); err != nil {
			return nil, inventory.Invalidf("cursor must name a SKU")
		}
	}
	if q.LowStock != nil && (*q.LowStock < 0 || *q.LowStock > arbiter.MaxStock) {
		return nil, inventory.Invalidf("low_stock must be between 0 and %d", int64(arbiter.MaxStock))
	}
	limit, err := pageLimit(q.Limit)
	if err != nil {
		return nil, err
	}
	db := r.db.WithContext(ctx).Where("sku > ?", q.After)
	if q.LowStock != nil {
		db = db.Where("on_hand <> ? AND on_hand - reserved <= ?", inventory.Unlimited, *q.LowStock)
	}
	var recs []arbiter.SKU
	if err := db.Order("sku").Limit(limit + 1).Find(&recs).Error; err != nil {
		return nil, err
	}
	p := &SKUPage{Items: make([]SKUListItem, 0, min(len(recs), limit))}
	for _, rec := range recs[:min(len(recs), limit)] {
		p.Items = append(p.Items, SKUListItem{SKU: rec.SKU, OnHand: rec.OnHand, Reserved: rec.Reserved,
			Available: rec.Available(), Unlimited: rec.OnHand == inventory.Unlimited, PerUserLimit: rec.PerUserLimit})
	}
	if len(recs) > limit {
		p.Next = p.Items[limit-1].SKU
	}
	return p, nil
}

// OrderQuery selects a page of the order listing, newest first. Empty fields
// do not filter.
type OrderQuery struct {
	UserID string
	Status order.Status
	// CreatedFrom and CreatedTo bound created_at, half-open: [from, to).
	CreatedFrom, CreatedTo time.Time
	// After is the cursor: the last order id of the previous page.
	After string
	// Limit is the page size (0: DefaultPageSize).
	Limit int
}

// OrderPage is one page of the order listing; Next is the cursor of the
// following page ("" on the last).
type OrderPage struct {
	Items []order.Order
	Next  string
}

// Orders returns a page of orders, newest first: order ids are UUIDv7, so id
// order is creation order and the cursor is the last id seen. Each filter
// has an index ending in id (migration 00014); the items of the page's
// orders are read in one more query.
func (r *Reader) Orders(ctx context.Context, q OrderQuery) (*OrderPage, error) {
	if q.UserID != "" {
		if err := inventory.ValidateUserID(q.UserID); err != nil {
			return nil, err
		}
	}
	if q.Status != "" && !slices.Contains(order.Statuses, q.Status) {
		return nil, inventory.Invalidf("status must be one of PENDING, PAID, CANCELLED, EXPIRED, REFUNDED, REFUND_REQUIRED")
	}
	if !q.CreatedFrom.IsZero() && !q.CreatedTo.IsZero() && !q.CreatedFrom.Before(q.CreatedTo) {
		return nil, inventory.Invalidf("created_from must be before created_to")
	}
	if q.After != "" && inventory.ValidateOrderID("cursor", q.After) != nil {
		return nil, inventory.Invalidf("cursor must name an order")
	}
	limit, err := pageLimit(q.Limit)
	if err != nil {
		return nil, err
	}
	db := r.db.WithContext(ctx)
	if idx := pageIndex(q); idx != "" && db.Dialector.Name() == "mysql" {
		db = db.Table("orders FORCE INDEX (" + idx + ")")
	}
	if q.UserID != "" {
		db = db.Where("user_id = ?", q.UserID)
	}
	if q.Status != "" {
		db = db.Where("status = ?", q.Status)
	}
	// created_at is stored in UTC (microseconds): compare in UTC too, which
	// SQLite, comparing the stored text, needs.
	if !q.CreatedFrom.IsZero() {
		db = db.Where("created_at >= ?", q.CreatedFrom.UTC())
	}
	if !q.CreatedTo.IsZero() {
		db = db.Where("created_at < ?", q.CreatedTo.UTC())
	}
	if q.After != "" {
		db = db.Where("id < ?", q.After)
	}
	var orders []order.Order
	if err := db.Order("id DESC").Limit(limit + 1).Find(&orders).Error; err != nil {
		return nil, err
	}
	p := &OrderPage{Items: orders}
	if len(orders) > limit {
		p.Items = orders[:limit]
		p.Next = p.Items[limit-1].ID
	}
	page := make([]*order.Order, len(p.Items))
	for i := range p.Items {
		page[i] = &p.Items[i]
	}
	if err := order.LoadItems(r.db.WithContext(ctx), page...); err != nil {
		return nil, err
	}
	if p.Items == nil {
		p.Items = []order.Order{}
	}
	return p, nil
}

// pageIndex is the index a page of one buyer's orders, or of one
// status's, is read on, named to MariaDB: left to choose, it reads such a
// page by its equality alone (a "ref" on user_id or status) from the
// newest order down, passing every order newer than the cursor, when the
// buyer or the status holds most of the table (a page deep in a buyer's
// 30,000 orders read 16,718 rows; named, 51: docs/benchmarks.md).
// A buyer's orders in one status are read on the buyer's index too, the
// status filtered on them: left to choose, on 100,000 orders MariaDB
// intersected both indexes (every PAID entry read) and sorted. With a
// window of creation the optimizer chooses (it reads the window).
func pageIndex(q OrderQuery) string {
	if !q.CreatedFrom.IsZero() || !q.CreatedTo.IsZero() {
		return ""
	}
	switch {
	case q.UserID != "":
		return "orders_user_id"
	case q.Status != "":
		return "orders_status_id"
	}
	return ""
}

// EventQuery selects a page of the replay feed of stock events.
type EventQuery struct {
	// After is the id of the last event the reader has (0: from the
	// oldest kept).
	After int64
	// SKU, if given, keeps that SKU's events only.
	SKU string
	// Limit is the page size (0: DefaultPageSize).
	Limit int
}

// Events returns the stock events with an id above q.After, in id order:
// each SKU's in seq order. An event is in the feed once the events job
// numbered it (about 200 ms after its commit), and its id is above every
// id numbered before, so a reader that pages on from the last id it read
// never passes over one. Retention keeps at least the horizon it is
// configured with (7 days by default).
func (r *Reader) Events(ctx context.Context, q EventQuery) ([]arbiter.Event, error) {
	if q.After < 0 {
		return nil, inventory.Invalidf("after must be an event id (0 or above)")
	}
	if q.SKU != "" {
		if err := inventory.ValidateSKU(q.SKU); err != nil {
			return nil, err
		}
	}
	limit, err := pageLimit(q.Limit)
	if err != nil {
		return nil, err
	}
	items, err := arbiter.EventsOf(r.db.WithContext(ctx)).Page(arbiter.EventFilter{After: q.After, SKU: q.SKU, Limit: limit})
	if items == nil && err == nil {
		items = []arbiter.Event{}
	}
	return items, err
}
