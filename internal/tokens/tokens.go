// Package tokens is the token API: raw reservations a client names with its
// own token (deduct, commit, release), recorded by the group commit like an
// order's and released by the timeout sweep when their hold ends. They live
// in a namespace of their own ("t." + token), so they can never touch an
// order's reservation (whose token is the order's random id).
package tokens

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/followup"
	"github.com/acme/inventory/internal/groupcommit"
	"github.com/acme/inventory/stock"
)

// ErrReleased: the token's reservation was released (or expired); it can
// take nothing any more.
var ErrReleased = errors.New("tokens: reservation already released")

// Config tunes a Service.
type Config struct {
	// TTL is how long a reservation holds its units. Default inventory.DefaultTTL.
	TTL time.Duration
	// Now is the clock. Default time.Now.
	Now    func() time.Time
	Logger *slog.Logger
	// OnOutbox is told when outbox rows were committed (wakes the relay).
	OnOutbox func()
}

// Service runs the token API.
type Service struct {
	db     *gorm.DB
	stock  *stock.Store
	redis  followup.Redis
	writer *groupcommit.Writer
	cfg    Config
}

// New is the token API on db and st, recording reservations through w.
func New(db *gorm.DB, st *stock.Store, w *groupcommit.Writer, cfg Config) *Service {
	if cfg.TTL == 0 {
		cfg.TTL = inventory.DefaultTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.OnOutbox == nil {
		cfg.OnOutbox = func() {}
	}
	return &Service{db: db, stock: st, redis: followup.Redis{Stock: st, Log: cfg.Logger}, writer: w, cfg: cfg}
}

func (s *Service) now() time.Time { return s.cfg.Now().UTC().Truncate(time.Microsecond) }

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
// conflict; after a release, ErrReleased.
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
	fences, err := s.writer.Write(ctx, &groupcommit.Request{Rows: []arbiter.Reservation{row}})
	if err != nil {
		fctx, cancel := stock.FollowUp(ctx)
		defer cancel()
		if uerr := s.stock.Undo(fctx, sku, qty, adm, key); uerr != nil {
			s.cfg.Logger.Warn("tokens: undoing an admission failed; the realign repairs it", "sku", sku, "err", uerr)
		}
		if arbiter.IsDuplicate(err) { // Redis forgot the token (a key loss): the database remembers
			return s.replay(ctx, sku, qty, key)
		}
		return 0, s.redis.Refused(ctx, err)
	}
	s.redis.Settle(ctx, []inventory.Line{{SKU: sku, Qty: qty}}, []stock.Admission{adm}, fences)
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
		return 0, ErrReleased
	case r.Qty != qty:
		return 0, fmt.Errorf("%w: token was used for %d units, not %d", inventory.ErrConflict, r.Qty, qty)
	}
	return r.Result, nil
}

// Release gives back what the client's unpaid reservation holds, once:
// a second release returns 0. A token never seen is recorded as released, so
// a deduction that arrives after its release takes nothing. A committed
// reservation cannot be released (it is a sale).
func (s *Service) Release(ctx context.Context, sku, token string) (int64, error) {
	key, err := rawKey(sku, token)
	if err != nil {
		return 0, err
	}
	var chs []inventory.Change
	var released int64
	err = arbiter.Transact(ctx, s.db, func(tx *gorm.DB) error {
		chs, released = nil, 0
		// Read the row first, locking it (a current read): a plain read after
		// releaseTx would see this transaction's snapshot, taken before a
		// concurrent CommitToken (or Reserve) committed, and answer "released
		// before" (0, nil) for a reservation that is committed (or still held).
		var rows []arbiter.Reservation
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Where("token = ? AND sku = ?", key, sku).
			Find(&rows).Error; err != nil {
			return err
		}
		if len(rows) == 1 {
			switch rows[0].State {
			case arbiter.Committed, arbiter.Sold, arbiter.Restored:
				return fmt.Errorf("%w: the reservation is committed (sold); it cannot be released", inventory.ErrConflict)
			case arbiter.Released:
				return nil // released before
			}
			rel, err := arbiter.In(tx).Release(key, sku)
			chs, released = rel.Changes, rel.Units[sku]
			return err
		}
		if ok, err := arbiter.SKUExists(tx, sku); err != nil || !ok {
			return errors.Join(err, inventory.UnknownSKU(sku))
		}
		now := s.now()
		return arbiter.In(tx).Tombstone(key, sku, arbiter.Reservation{ExpiresAt: now, CreatedAt: now, UpdatedAt: now})
	})
	if arbiter.IsDuplicate(err) { // a deduction with this token landed meanwhile: release it
		return s.Release(ctx, sku, token)
	}
	if err != nil {
		return 0, err
	}
	s.redis.Apply(ctx, chs)
	return released, nil
}

// Commit turns the client's held reservation into a sale: COMMITTED and
// a DEDUCT outbox row in one transaction, the same path to the database
// deduction as a paid order. A replay returns the quantity again.
func (s *Service) Commit(ctx context.Context, sku, token string) (int64, error) {
	key, err := rawKey(sku, token)
	if err != nil {
		return 0, err
	}
	var qty int64
	err = arbiter.Transact(ctx, s.db, func(tx *gorm.DB) error {
		var r arbiter.Reservation
		if err := tx.Take(&r, "token = ? AND sku = ?", key, sku).Error; err != nil {
			if errors.Is(err, gorm.ErrRecordNotFound) {
				return fmt.Errorf("%w: no reservation of %s with this token", inventory.ErrNotFound, sku)
			}
			return err
		}
		qty = r.Qty
		switch r.State {
		case arbiter.Committed, arbiter.Sold, arbiter.Restored:
			return nil
		case arbiter.Released:
			return ErrReleased
		}
		return arbiter.In(tx).Commit(key, []inventory.Line{{SKU: sku, Qty: r.Qty}})
	})
	if err != nil {
		return 0, err
	}
	s.cfg.OnOutbox()
	return qty, nil
}

// ReleaseExpired releases the token API's HELD reservations past their
// deadline (the timeout sweep); it returns how many it released.
func (s *Service) ReleaseExpired(ctx context.Context, limit int) (int, error) {
	var rows []arbiter.Reservation
	if err := s.db.WithContext(ctx).Where("state = ? AND expires_at <= ? AND order_id IS NULL", arbiter.Held, s.now()).
		Order("expires_at").Limit(limit).Find(&rows).Error; err != nil {
		return 0, err
	}
	n := 0
	for _, r := range rows {
		var chs []inventory.Change
		err := arbiter.Transact(ctx, s.db, func(tx *gorm.DB) error {
			rel, err := arbiter.In(tx).Release(r.Token, r.SKU) // a commit that won first leaves nothing HELD
			chs = rel.Changes
			return err
		})
		if err != nil {
			return n, err
		}
		if len(chs) > 0 {
			n++
		}
		s.redis.Apply(ctx, chs)
	}
	return n, nil
}
