package order

import (
	"context"
	"database/sql"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/acme/inventory"
)

// OnPool is db (its callbacks and settings: what counts and guards its
// statements) sending its statements on pool instead: how the service's
// handle on a multi-statement pool (Config.MultiStatements) is made from
// its db and that pool (mysqlconn.MultiStatements, behind the breaker's
// ConnPool when db's is).
func OnPool(db *gorm.DB, pool gorm.ConnPool) *gorm.DB {
	on := db.Session(&gorm.Session{NewDB: true, Context: context.Background()})
	on.Statement.ConnPool = pool
	return on
}

// extendOneTrip is Extend's conditional UPDATE and the read of its answer
// (the order and its lines as they are after it, and whether the UPDATE
// moved the deadline: ROW_COUNT()) sent as one text, one round trip, on
// s.cfg.MultiStatements. The UPDATE alone decides, as on any path: the
// SELECT only reads what it left (or, when it changed nothing, the order
// as it stands, for whyNotExtended). The server runs the SELECT only if
// the UPDATE succeeded; a statement failing is the query's error.
//
// An order recorded before its lines were its reservations (no
// reservation row names it) has its lines read from order_items after:
// LoadItems, one more round trip, only for those.
func (s *Service) extendOneTrip(ctx context.Context, id, userID, idemKey string, now, until time.Time) (*Order, bool, error) {
	var key any // NULL: an extension without a key clears the last one's
	if idemKey != "" {
		key = idemKey
	}
	rows, err := s.cfg.MultiStatements.WithContext(ctx).Raw(extendSQL,
		until, now, key,
		id, Pending, now, until, until.Add(-s.cfg.MaxHold),
		userID == "", userID, idemKey == "", idemKey,
		id).Rows()
	if err != nil {
		return nil, false, err
	}
	defer rows.Close()
	var o *Order
	var moved bool
	for rows.Next() {
		var r struct {
			moved                                      int64
			o                                          Order
			idem, payment, extendKey, sku, itemOrderID sql.NullString
			paidAt                                     sql.NullTime
			qty                                        sql.NullInt64
		}
		if err := rows.Scan(&r.moved, &r.o.ID, &r.o.UserID, &r.idem, &r.o.Status, &r.o.ReservationToken, &r.payment,
			&r.o.ExpiresAt, &r.paidAt, &r.o.CreatedAt, &r.o.UpdatedAt, &r.extendKey, &r.sku, &r.itemOrderID, &r.qty); err != nil {
			return nil, false, err
		}
		if o == nil {
			o, moved = &r.o, r.moved == 1
			o.IdempotencyKey, o.PaymentID, o.ExtendKey = nullable(r.idem), nullable(r.payment), nullable(r.extendKey)
			if r.paidAt.Valid {
				o.PaidAt = &r.paidAt.Time
			}
			o.Items = []Item{}
		}
		if r.sku.Valid && r.itemOrderID.Valid && r.itemOrderID.String == o.ID { // as LoadItems: the order's own
			o.Items = append(o.Items, Item{OrderID: o.ID, SKU: r.sku.String, Qty: r.qty.Int64})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, false, err
	}
	if err := rows.Close(); err != nil {
		return nil, false, err
	}
	if o == nil {
		return nil, false, inventory.ErrNotFound
	}
	if len(o.Items) == 0 {
		if err := LoadItems(s.db.WithContext(ctx), o); err != nil { // lines from before reservations
			return nil, false, err
		}
	}
	slices.SortFunc(o.Items, func(a, b Item) int { return strings.Compare(a.SKU, b.SKU) })
	return o, moved, nil
}

// extendSQL is Extend's conditional UPDATE (the same conditions as the
// GORM path's: PENDING, not past its deadline, the new one later and
// within the maximum from creation; the buyer's own order when a buyer
// asks; not the key that moved it last) and the read of the answer, in one
// text. Parameters: until, now, key (NULL for none); id, PENDING, now,
// until, the earliest creation; no buyer (an admin), the buyer; no key,
// the key; id.
const extendSQL = `UPDATE orders SET expires_at = ?, updated_at = ?, extend_key = ?
WHERE id = ? AND status = ? AND expires_at > ? AND expires_at < ? AND created_at >= ?
AND (? OR user_id = ?) AND (? OR extend_key IS NULL OR extend_key <> ?);
SELECT ROW_COUNT(), o.id, o.user_id, o.idempotency_key, o.status, o.reservation_token, o.payment_id,
o.expires_at, o.paid_at, o.created_at, o.updated_at, o.extend_key, r.sku, r.order_id, r.qty
FROM orders o LEFT JOIN stock_reservations r ON r.token = o.reservation_token
WHERE o.id = ?`

func nullable(s sql.NullString) *string {
	if !s.Valid {
		return nil
	}
	return &s.String
}
