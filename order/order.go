// Package order runs the order lifecycle and is the database side of every
// reservation: Redis (package stock) admits, the database arbitrates.
//
//	reserve: Redis admits each line; one transaction records the reservation
//	         rows (and the order) with a conditional increment of reserved per
//	         SKU, group-committed; a refusal undoes the admission and realigns
//	cancel / expire / release: HELD -> RELEASED and reserved given back in one
//	         transaction, then the change is brought into Redis, fenced
//	pay / commit: HELD -> COMMITTED and a DEDUCT outbox row per line, in one
//	         transaction
//	relay:   outbox rows -> ordered messages (key = SKU), by one node at a time
//	apply:   each (token, SKU, op) once: a unique ledger row in the transaction
//	         of one merged UPDATE of on_hand and reserved per SKU
package order

import (
	"time"

	"github.com/acme/inventory"
)

// Status is an order's state. Transitions:
//
//	PENDING -> PAID -> REFUNDED
//	PENDING -> CANCELLED | EXPIRED
//	EXPIRED -> PAID                        (late payment, stock re-reserved)
//	EXPIRED -> REFUND_REQUIRED             (late payment, stock gone)
//	CANCELLED -> REFUND_REQUIRED           (payment after the buyer cancelled)
//	REFUND_REQUIRED -> REFUNDED
type Status string

const (
	Pending        Status = "PENDING"
	Paid           Status = "PAID"
	Cancelled      Status = "CANCELLED"
	Expired        Status = "EXPIRED"
	Refunded       Status = "REFUNDED"
	RefundRequired Status = "REFUND_REQUIRED"
)

// Order is one order and its lines.
type Order struct {
	ID               string     `json:"id" gorm:"primaryKey"`
	UserID           string     `json:"user_id"`
	IdempotencyKey   *string    `json:"-"`
	Status           Status     `json:"status"`
	ReservationToken string     `json:"-"`
	PaymentID        *string    `json:"payment_id,omitempty"`
	ExpiresAt        time.Time  `json:"expires_at"`
	PaidAt           *time.Time `json:"paid_at,omitempty"`
	ShippedAt        *time.Time `json:"shipped_at,omitempty"` // its lines left the warehouse (Ship)
	CreatedAt        time.Time  `json:"created_at"`
	UpdatedAt        time.Time  `json:"updated_at"`
	ExtendKey        *string    `json:"-"`              // the last extension's Idempotency-Key
	Items            []Item     `json:"items" gorm:"-"` // see loadItems
}

// Item is one line of an order. An order's lines are its reservations
// under its reservation token (LoadItems); order_items holds the lines of
// orders recorded before that, which have none.
type Item struct {
	OrderID string `json:"-" gorm:"primaryKey"`
	SKU     string `json:"sku" gorm:"primaryKey;column:sku"`
	Qty     int64  `json:"qty"`
}

func (Item) TableName() string { return "order_items" }

// Lines are the order's items as cart lines.
func (o *Order) Lines() []inventory.Line {
	out := make([]inventory.Line, len(o.Items))
	for i, it := range o.Items {
		out[i] = inventory.Line{SKU: it.SKU, Qty: it.Qty}
	}
	return out
}

// Statuses are every order status.
var Statuses = []Status{Pending, Paid, Cancelled, Expired, Refunded, RefundRequired}
