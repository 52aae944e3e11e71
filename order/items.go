package order

import (
	"slices"
	"strings"

	"gorm.io/gorm"
)

// LoadItems fills each order's Items: its reservations under its
// reservation token (a late payment's re-reservation moves the token; the
// lines are the same), in SKU order. A reservation's SKU and quantity never
// change, and reservations are never pruned, so they are the order's lines
// for as long as the order exists and a sale writes no second row for
// them. Orders recorded before reservations existed have none: their lines
// are read from order_items, where they were written then.
func LoadItems(tx *gorm.DB, orders ...*Order) error {
	if len(orders) == 0 {
		return nil
	}
	byToken := make(map[string]*Order, len(orders))
	tokens := make([]string, 0, len(orders))
	for _, o := range orders {
		o.Items = []Item{}
		byToken[o.ReservationToken] = o
		tokens = append(tokens, o.ReservationToken)
	}
	var rows []struct {
		Token   string
		SKU     string `gorm:"column:sku"`
		OrderID *string
		Qty     int64
	}
	if err := tx.Raw(`SELECT token, sku, order_id, qty FROM stock_reservations WHERE token IN ?`, tokens).
		Scan(&rows).Error; err != nil {
		return err
	}
	for _, r := range rows {
		// Only the order's own (token-API tokens live in a namespace of
		// their own, "t.": this only makes the lines not depend on it).
		if o := byToken[r.Token]; r.OrderID != nil && *r.OrderID == o.ID {
			o.Items = append(o.Items, Item{OrderID: o.ID, SKU: r.SKU, Qty: r.Qty})
		}
	}
	var legacy []string
	for _, o := range orders {
		if len(o.Items) == 0 {
			legacy = append(legacy, o.ID)
		}
	}
	if len(legacy) > 0 {
		var items []Item
		if err := tx.Where("order_id IN ?", legacy).Find(&items).Error; err != nil {
			return err
		}
		byID := make(map[string]*Order, len(legacy))
		for _, o := range orders {
			byID[o.ID] = o
		}
		for _, it := range items {
			o := byID[it.OrderID]
			o.Items = append(o.Items, it)
		}
	}
	for _, o := range orders {
		// SKU order, as the answers have always listed them (compared as
		// bytes in Go, whatever the database's collation).
		slices.SortFunc(o.Items, func(a, b Item) int { return strings.Compare(a.SKU, b.SKU) })
	}
	return nil
}
