package order

import (
	"context"
	"errors"
	"fmt"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/stock"
)

// The token API: raw reservations a client names with its own token. They
// live in a namespace of their own ("t." + token), so they can never touch an
// order's reservation (whose token is the order's random id).

// ErrTokenReleased: the token's reservation was released (or expired); it
// can take nothing any more.
var ErrTokenReleased = errors.New("order: reservation already released")

// rawKey validates a token-API request's SKU and token and returns the
// token's key in the database.
func rawKey(sku, token string) (string, error) {
	if err := inventory.ValidateSKU(sku); err != nil {
		return "", err
	}
	if err := inventory.ValidateToken(token); err != nil {
		return "", err
	}
	return "t." + token, nil
}

// Reserve takes qty units of sku for the client's token: Redis admits, the
// database records a HELD reservation that expires after the order TTL. It
// returns what Redis had left (or inventory.Unlimited). A replay with the same
// qty returns the first answer and takes nothing; with another qty it is a
// conflict; after a release, ErrTokenReleased.
func (s *Service) Reserve(ctx context.Context, sku string, qty int64, token string) (int64, error) {
	key, err := rawKey(sku, token)
	if err != nil {
		return 0, err
	}
	adm, err := s.stock.Admit(ctx, sku, qty, key)
	if errors.Is(err, inventory.ErrReplay) {
		return s.replay(ctx, sku, qty, key)
	}
	if err != nil {
		return 0, err
	}
	now := s.now()
	row := arbiter.Reservation{Token: key, SKU: sku, Qty: qty, State: arbiter.Held, Result: adm.Remaining,
		ExpiresAt: now.Add(s.cfg.TTL), CreatedAt: now, UpdatedAt: now}
	marks, err := s.orders.write(ctx, &writeReq{rows: []arbiter.Reservation{row}})
	if err != nil {
		fctx, cancel := stock.FollowUp(ctx)
		defer cancel()
		if uerr := s.stock.Undo(fctx, sku, qty, adm, key); uerr != nil {
			s.cfg.Logger.Warn("order: undoing an admission failed; the realign repairs it", "sku", sku, "err", uerr)
		}
		if arbiter.IsDuplicate(err) { // Redis forgot the token (a key loss): the database remembers
			return s.replay(ctx, sku, qty, key)
		}
		return 0, s.refused(ctx, err)
	}
	s.settle(ctx, []inventory.Line{{SKU: sku, Qty: qty}}, []stock.Admission{adm}, marks)
	return adm.Remaining, nil
}

// replay answers a token seen before from its database row.
func (s *Service) replay(ctx context.Context, sku string, qty int64, key string) (int64, error) {
	var r arbiter.Reservation
	err := s.db.WithContext(ctx).Take(&r, "token = ? AND sku = ?", key, sku).Error
	switch {
	case errors.Is(err, gorm.ErrRecordNotFound):
		// The first call is still writing (or failed and undid its admission).
		return 0, fmt.Errorf("%w: a reservation with this token is in progress; retry", inventory.ErrConflict)
	case err != nil:
		return 0, err
	case r.State == arbiter.Released:
		return 0, ErrTokenReleased
	case r.Qty != qty:
		return 0, fmt.Errorf("%w: token was used for %d units, not %d", inventory.ErrConflict, r.Qty, qty)
	}
	return r.Result, nil
}

// ReleaseToken gives back what the client's unpaid reservation holds, once:
// a second release returns 0. A token never seen is recorded as released, so
// a deduction that arrives after its release takes nothing. A committed
// reservation cannot be released (it is a sale).
func (s *Service) ReleaseToken(ctx context.Context, sku, token string) (int64, error) {
	key, err := rawKey(sku, token)
	if err != nil {
		return 0, err
	}
	var chs []inventory.Change
	var released int64
	_, err = s.inTx(ctx, func(tx *gorm.DB) (*Order, error) {
		chs, released = nil, 0
		// Read the row first, locking it (a current read): a plain read after
		// releaseTx would see this transaction's snapshot, taken before a
		// concurrent CommitToken (or Reserve) committed, and answer "released
		// before" (0, nil) for a reservation that is committed (or still held).
		var rows []arbiter.Reservation
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Where("token = ? AND sku = ?", key, sku).
			Find(&rows).Error; err != nil {
			return nil, err
		}
		if len(rows) == 1 {
			switch rows[0].State {
			case arbiter.Committed, arbiter.Sold, arbiter.Restored:
				return nil, fmt.Errorf("%w: the reservation is committed (sold); it cannot be released", inventory.ErrConflict)
			case arbiter.Released:
				return nil, nil // released before
			}
			rel, err := arbiter.In(tx).Release(key, sku)
			chs, released = rel.Changes, rel.Units[sku]
			return nil, err
		}
		if ok, err := arbiter.SKUExists(tx, sku); err != nil || !ok {
			return nil, errors.Join(err, inventory.UnknownSKU(sku))
		}
		now := s.now()
		return nil, arbiter.In(tx).Forbid(key, sku, arbiter.Reservation{ExpiresAt: now, CreatedAt: now, UpdatedAt: now})
	})
	if arbiter.IsDuplicate(err) { // a deduction with this token landed meanwhile: release it
		return s.ReleaseToken(ctx, sku, token)
	}
	if err != nil {
		return 0, err
	}
	s.ApplyChanges(ctx, chs)
	return released, nil
}

// CommitToken turns the client's held reservation into a sale: COMMITTED and
// a DEDUCT outbox row in one transaction, the same path to the database
// deduction as a paid order. A replay returns the quantity again.
func (s *Service) CommitToken(ctx context.Context, sku, token string) (int64, error) {
	key, err := rawKey(sku, token)
	if err != nil {
		return 0, err
	}
	var qty int64
	_, err = s.inTx(ctx, func(tx *gorm.DB) (*Order, error) {
		var r arbiter.Reservation
		if err := tx.Take(&r, "token = ? AND sku = ?", key, sku).Error; err != nil {
			if errors.Is(err, gorm.ErrRecordNotFound) {
				return nil, fmt.Errorf("%w: no reservation of %s with this token", inventory.ErrNotFound, sku)
			}
			return nil, err
		}
		qty = r.Qty
		switch r.State {
		case arbiter.Committed, arbiter.Sold, arbiter.Restored:
			return nil, nil
		case arbiter.Released:
			return nil, ErrTokenReleased
		}
		return nil, arbiter.In(tx).Commit(key, []inventory.Line{{SKU: sku, Qty: r.Qty}})
	})
	if err != nil {
		return 0, err
	}
	s.cfg.OnOutbox()
	return qty, nil
}

// ReleaseExpiredTokens releases the token API's HELD reservations past their
// deadline (the timeout sweep); it returns how many it released.
func (s *Service) ReleaseExpiredTokens(ctx context.Context, limit int) (int, error) {
	var rows []arbiter.Reservation
	if err := s.db.WithContext(ctx).Where("state = ? AND expires_at <= ? AND order_id IS NULL", arbiter.Held, s.now()).
		Order("expires_at").Limit(limit).Find(&rows).Error; err != nil {
		return 0, err
	}
	n := 0
	for _, r := range rows {
		var chs []inventory.Change
		_, err := s.inTx(ctx, func(tx *gorm.DB) (*Order, error) {
			rel, err := arbiter.In(tx).Release(r.Token, r.SKU) // a commit that won first leaves nothing HELD
			chs = rel.Changes
			return nil, err
		})
		if err != nil {
			return n, err
		}
		if len(chs) > 0 {
			n++
		}
		s.ApplyChanges(ctx, chs)
	}
	return n, nil
}
