package main

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"time"
)

// resolveUnknowns settles, once the run has settled, what the database can
// tell of the operations whose answer never came: a create, cancel or
// adjust that left no trace in the database never took effect and is
// dropped; one that did is certain, at some time after it was sent (its
// end stays open), and a create learns its order and deadline. What the
// database cannot tell stays unknown. Each unknown operation the search
// need not place is one way fewer to order the history.
//
// The creates dropped are returned apart (never): the database never
// took them, but Redis may have admitted them before their node died, and
// their units and buyers' counts then stay taken in Redis until the
// realign gives them back (histConfig.Never).
func resolveUnknowns(ctx context.Context, db *sql.DB, ops []histOp, base time.Time) (kept, never []histOp, err error) {
	known := map[string]bool{} // orders some answer named
	keyed := map[[2]string]bool{}
	tokens := map[[2]string]bool{}
	cancelled := map[string]bool{}
	refunded := map[string]bool{} // orders a refund was answered for
	for i := range ops {
		op := &ops[i]
		if op.Out != outOK {
			continue
		}
		switch {
		case op.Kind == opCreate && op.Token != "":
			tokens[[2]string{op.Lines[0].SKU, op.Token}] = true
		case op.Kind == opCreate:
			known[op.Order] = true
			if op.Key != "" {
				keyed[[2]string{op.User, op.Key}] = true
			}
		case op.Kind == opCancel:
			cancelled[op.Order] = true
		case op.Kind == opRefund:
			refunded[op.Order] = true
		}
	}
	// An answered create whose key an earlier attempt went unanswered
	// under stands for every attempt (foldRetries), from the first one's
	// sending; the database tells when the hold was made, no earlier.
	ops = slices.Clone(ops)
	retried := map[[2]string]time.Duration{}
	for _, op := range ops {
		if k := [2]string{op.User, op.Key}; op.Kind == opCreate && op.Key != "" && op.Out == outUnknown {
			if at, ok := retried[k]; !ok || op.Call < at {
				retried[k] = op.Call
			}
		}
	}
	for i := range ops {
		op := &ops[i]
		if at, ok := retried[[2]string{op.User, op.Key}]; !ok || op.Kind != opCreate || op.Out != outOK || at >= op.Call {
			continue
		}
		var created time.Time
		err := db.QueryRowContext(ctx, `SELECT created_at FROM orders WHERE id = ?`, op.Order).Scan(&created)
		if errors.Is(err, sql.ErrNoRows) {
			continue // acknowledged and never made: the checks say so
		}
		if err != nil {
			return nil, nil, err
		}
		op.Made = created.Sub(base)
	}
	// A seckill buy names no key: its order is the buyer's one no answer
	// named, if the buyer has exactly one such order and one such buy.
	unknownBuys := map[string]int{}
	for i := range ops {
		if op := &ops[i]; op.Kind == opCreate && op.Out == outUnknown && isSeckill(op) {
			unknownBuys[op.User]++
		}
	}
	out := make([]histOp, 0, len(ops))
	for _, op := range ops {
		if op.Out != outUnknown {
			out = append(out, op)
			continue
		}
		keep, err := resolve(ctx, db, &op, base, known, keyed, tokens, cancelled, refunded, unknownBuys)
		if err != nil {
			return nil, nil, err
		}
		if !keep && op.Kind == opCreate {
			never = append(never, op)
		}
		if keep && op.Kind == opCreate && op.Token != "" && op.Out == outOK {
			// Certain, and a deduct with the same token is the same
			// hold: the first attempt sent stands for every attempt.
			k := [2]string{op.Lines[0].SKU, op.Token}
			if tokens[k] {
				continue
			}
			tokens[k] = true
		}
		if keep {
			out = append(out, op)
		}
	}
	return out, never, nil
}

// resolve settles one unknown operation; false drops it.
func resolve(ctx context.Context, db *sql.DB, op *histOp, base time.Time, known map[string]bool, keyed, tokens map[[2]string]bool, cancelled, refunded map[string]bool, unknownBuys map[string]int) (bool, error) {
	// A create the database has is certain: it took effect after the
	// node stamped the order's created_at (its clock, on this host, before
	// the commit), at a time the answer never told.
	certain := func(order string, expires, created time.Time) {
		op.Out, op.Order, op.ExpiresAt = outOK, order, expires
		if at := created.Sub(base) - expirySlack; at > op.Call {
			op.Call = at
		}
	}
	switch op.Kind {
	case opCreate:
		switch {
		case op.Token != "":
			if len(op.Lines) != 1 || tokens[[2]string{op.Lines[0].SKU, op.Token}] {
				return true, nil // a replay of an answered deduct, or a request the check cannot name
			}
			var qty int64
			err := db.QueryRowContext(ctx, `SELECT qty FROM stock_reservations WHERE token = ? AND sku = ?`, "t."+op.Token, op.Lines[0].SKU).Scan(&qty)
			if errors.Is(err, sql.ErrNoRows) || err == nil && qty == 0 {
				return false, nil // never reserved (or only released: a tombstone)
			}
			if err == nil && qty == op.Lines[0].Qty {
				op.Out = outOK
			}
			return true, err
		case op.Key != "":
			if keyed[[2]string{op.User, op.Key}] {
				return true, nil // answered by another attempt
			}
			var id string
			var expires, created time.Time
			// The key's own table (migration 44) names the order either way
			// the sale wrote it; the lean sale's projection leaves
			// orders.idempotency_key empty.
			err := db.QueryRowContext(ctx, `SELECT o.id, o.expires_at, o.created_at FROM idempotency_keys k JOIN orders o ON o.id = k.order_id
				WHERE k.user_id = ? AND k.idempotency_key = ?`, op.User, op.Key).Scan(&id, &expires, &created)
			if errors.Is(err, sql.ErrNoRows) {
				err = db.QueryRowContext(ctx, `SELECT id, expires_at, created_at FROM orders WHERE user_id = ? AND idempotency_key = ?`, op.User, op.Key).Scan(&id, &expires, &created)
			}
			if errors.Is(err, sql.ErrNoRows) {
				return false, nil
			}
			if err == nil {
				certain(id, expires, created)
			}
			return true, err
		case isSeckill(op):
			rows, err := db.QueryContext(ctx, `SELECT id, expires_at, created_at FROM orders WHERE user_id = ?`, op.User)
			if err != nil {
				return true, err
			}
			defer rows.Close()
			var ids []string
			var deadline, created []time.Time
			for rows.Next() {
				var id string
				var expires, at time.Time
				if err := rows.Scan(&id, &expires, &at); err != nil {
					return true, err
				}
				if !known[id] {
					ids, deadline, created = append(ids, id), append(deadline, expires), append(created, at)
				}
			}
			switch {
			case len(ids) == 0:
				return false, rows.Err() // every order of the buyer was answered: this buy took nothing
			case len(ids) == 1 && unknownBuys[op.User] == 1:
				certain(ids[0], deadline[0], created[0])
			}
			return true, rows.Err()
		}
	case opCancel:
		if cancelled[op.Order] {
			return true, nil
		}
		var status string
		err := db.QueryRowContext(ctx, `SELECT status FROM orders WHERE id = ?`, op.Order).Scan(&status)
		if errors.Is(err, sql.ErrNoRows) || err == nil && status != "CANCELLED" && status != "REFUND_REQUIRED" && status != "REFUNDED" {
			return false, nil // no such order (a faultbugs build acknowledged a create it never committed), or it ended otherwise
		}
		return true, err
	case opRefund:
		// With none answered done (partition drops the rest: a refund is
		// done once), the order's status tells whether one took.
		if refunded[op.Order] {
			return true, nil
		}
		var status string
		err := db.QueryRowContext(ctx, `SELECT status FROM orders WHERE id = ?`, op.Order).Scan(&status)
		if errors.Is(err, sql.ErrNoRows) || err == nil && status != "REFUNDED" {
			return false, nil
		}
		return true, err
	case opPay:
		// The order names the payment that paid it (or that must be
		// refunded): any other changed nothing.
		var status string
		var paidBy sql.NullString
		err := db.QueryRowContext(ctx, `SELECT status, payment_id FROM orders WHERE id = ?`, op.Order).Scan(&status, &paidBy)
		if errors.Is(err, sql.ErrNoRows) || err == nil && paidBy.String != op.PaymentID {
			return false, nil
		}
		if err == nil {
			op.Out, op.AnswerPaid = outOK, op.PaymentID
			op.Answer = "PAID"
			if status == "REFUND_REQUIRED" {
				op.Answer = status
			}
		}
		return true, err
	case opAdjust:
		if op.Ref == "" {
			return true, nil
		}
		var n int
		err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM stock_adjustments WHERE reference = ?`, op.Ref).Scan(&n)
		if err == nil && n == 0 {
			return false, nil
		}
		if err == nil {
			op.Out = outOK
		}
		return true, err
	}
	return true, nil
}
