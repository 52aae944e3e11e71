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
	"github.com/acme/inventory/internal/sale"
	"github.com/acme/inventory/stock"
)

// ErrReleased: the token's reservation was released (or expired); it can
// take nothing any more.
var ErrReleased = errors.New("tokens: reservation already released")

// Config tunes a Service.
type Config struct {
	// TTL is how long a reservation holds its units unless the caller asks
	// for another hold. Default inventory.DefaultTTL.
	TTL time.Duration
	// MaxHold is the longest hold, counted from the reservation's creation,
	// a caller may ask for or extend to. Default inventory.DefaultMaxHold.
	MaxHold time.Duration
	// Now is the clock. Default time.Now.
	Now    func() time.Time
	Logger *slog.Logger
	// OnOutbox is told when outbox rows were committed (wakes the relay).
	OnOutbox func()
	// InFlight is the longest a live node may still be writing a token's
	// admission (a request's deadline and its follow-ups'): a replay that
	// finds the token admitted longer ago and not in the database was
	// admitted by a node that died before writing it, and is taken again
	// rather than answered "in progress". Default DefaultInFlight.
	InFlight time.Duration
	// Lean records a token's hold as the lean sale does (order.Config.Lean).
	Lean bool
}

// DefaultInFlight is Config.InFlight's default: a minute, the longest
// request deadline the service allows, and then some.
const DefaultInFlight = 70 * time.Second

// Held is a reservation's answer: what Redis had left when it was taken
// (or inventory.Unlimited), and when its hold ends.
type Held struct {
	Result    int64
	ExpiresAt time.Time
}

// errInProgress answers a replay of a token Redis admitted and the
// database has not recorded.
var errInProgress = fmt.Errorf("%w: a reservation with this token is in progress; retry", inventory.ErrConflict)

// tokenMargin is how much longer than its hold Redis remembers a token, so
// a replay within the hold is sent to the database, not admitted again.
const tokenMargin = time.Minute

// Service runs the token API.
type Service struct {
	db    *gorm.DB
	stock *stock.Store
	redis followup.Redis
	sales sale.Pipeline
	cfg   Config
}

// New is the token API on db and st, recording reservations through w.
func New(db *gorm.DB, st *stock.Store, w *groupcommit.Writer, cfg Config) *Service {
	if cfg.TTL == 0 {
		cfg.TTL = inventory.DefaultTTL
	}
	if cfg.MaxHold == 0 {
		cfg.MaxHold = max(inventory.DefaultMaxHold, cfg.TTL)
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
	if cfg.InFlight <= 0 {
		cfg.InFlight = DefaultInFlight
	}
	f := followup.Redis{Stock: st, Log: cfg.Logger}
	return &Service{db: db, stock: st, redis: f, sales: sale.Pipeline{Writer: w, Redis: f}, cfg: cfg}
}

func (s *Service) now() time.Time { return s.cfg.Now().UTC().Truncate(time.Microsecond) }

// Holds is the service's hold policy (the default hold and the maximum).
func (s *Service) Holds() inventory.Holds {
	return inventory.Holds{Default: s.cfg.TTL, Max: s.cfg.MaxHold}
}

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

// Reserve takes qty units of sku for the client's token for the default
// hold; it returns what Redis had left (or inventory.Unlimited). See
// ReserveHold.
func (s *Service) Reserve(ctx context.Context, sku string, qty int64, token string) (int64, error) {
	h, err := s.ReserveHold(ctx, sku, qty, token, 0)
	return h.Result, err
}

// ReserveHold takes qty units of sku for the client's token: Redis admits,
// the database records a HELD reservation that ends after hold (0: the
// default; within Holds). A replay with the same qty returns the first
// answer (and the hold's current end) and takes nothing; with another qty it
// is a conflict; after a release, ErrReleased. That holds whatever Redis
// remembers of the token: a replay Redis forgot (a flush, past the token
// key's TTL) is taken again and given back when the database refuses the
// duplicate, or, when Redis cannot cover it any more, found in the
// database by the refusal.
func (s *Service) ReserveHold(ctx context.Context, sku string, qty int64, token string, hold time.Duration) (Held, error) {
	key, err := rawKey(sku, token)
	if err != nil {
		return Held{}, err
	}
	hold, err = s.Holds().For(hold)
	if err != nil {
		return Held{}, err
	}
	return s.reserve(ctx, sku, qty, key, hold, true)
}

// reserve is ReserveHold of the token's key; stale says whether a replay
// the database does not know may find its admission stale (and forget it,
// to be admitted again, once).
func (s *Service) reserve(ctx context.Context, sku string, qty int64, key string, hold time.Duration, stale bool) (Held, error) {
	adm, err := s.stock.AdmitFor(ctx, sku, qty, key, hold+tokenMargin)
	switch {
	case errors.Is(err, inventory.ErrReplay):
		h, err := s.replay(ctx, sku, qty, key)
		if !stale || !errors.Is(err, errInProgress) {
			return h, err
		}
		// Admitted and never written: by a node still writing it, or by
		// one that died first, whose admission Redis would otherwise
		// remember for the hold's whole life. Past the longest a write
		// can take, it is the latter: forgotten, the token is admitted
		// again (the units the dead admission took come back with the
		// SKU's realignment), and the database decides.
		if forgot, ferr := s.stock.ForgetStaleToken(ctx, sku, key, s.cfg.InFlight); ferr != nil || !forgot {
			return h, err
		}
		s.cfg.Logger.Warn("a token's admission was never written; admitting it again", "sku", sku)
		return s.reserve(ctx, sku, qty, key, hold, false)
	case errors.Is(err, inventory.ErrInsufficientStock):
		// Only a refusal asks the database: a first deduction Redis admits
		// costs no read.
		return s.refused(ctx, sku, qty, key, err)
	case err != nil:
		return Held{}, err
	}
	now := s.now()
	row := arbiter.Reservation{Token: key, SKU: sku, Qty: qty, State: arbiter.Held, Result: adm.Remaining,
		ExpiresAt: now.Add(hold), CreatedAt: now, UpdatedAt: now}
	line := inventory.Line{SKU: sku, Qty: qty}
	return sale.Write(ctx, s.sales, sale.Sale[Held]{Token: key, Request: &groupcommit.Request{Rows: []arbiter.Reservation{row}, Lean: s.cfg.Lean},
		// Given back or of unknown outcome, Redis forgets the token with
		// the units, so the client's retry asks the database (the first
		// answer, or a new reservation) rather than be told the first call
		// is still in progress for the token's whole life in Redis.
		Admitted: sale.Lines{Lines: []inventory.Line{line}, Adm: []stock.Admission{adm}, Token: key},
		Written:  func(map[string]arbiter.Fence) Held { return Held{Result: adm.Remaining, ExpiresAt: row.ExpiresAt} },
		// Redis forgot the token (a key loss): the database remembers.
		Duplicate: func(ctx context.Context) (Held, error) { return s.replay(ctx, sku, qty, key) },
	})
}

// replay answers a token seen before from its database row.
func (s *Service) replay(ctx context.Context, sku string, qty int64, key string) (Held, error) {
	r, found, err := s.recorded(ctx, sku, key)
	switch {
	case err != nil:
		return Held{}, err
	case !found:
		// The first call is still writing (or failed and undid its admission).
		return Held{}, errInProgress
	}
	return answer(r, qty)
}

// refused answers a deduction Redis refused for lack of stock: a token the
// database recorded is a replay Redis forgot (a flush, past the token key's
// TTL), answered as its first call was; any other is refusal. When the
// database cannot be asked, the answer is unknown (ErrUnavailable).
func (s *Service) refused(ctx context.Context, sku string, qty int64, key string, refusal error) (Held, error) {
	r, found, err := s.recorded(ctx, sku, key)
	switch {
	case err != nil:
		return Held{}, fmt.Errorf("%w: %s is refused in Redis and the database could not say whether this token reserved before: %v",
			inventory.ErrUnavailable, sku, err)
	case !found:
		return Held{}, refusal
	}
	return answer(r, qty)
}

// recorded reads the token's reservation of sku (by primary key),
// projected first if only the lean sale recorded it.
func (s *Service) recorded(ctx context.Context, sku, key string) (arbiter.Reservation, bool, error) {
	read := func() ([]arbiter.Reservation, error) {
		var rows []arbiter.Reservation
		err := s.db.WithContext(ctx).Where("token = ? AND sku = ?", key, sku).Limit(1).Find(&rows).Error
		return rows, err
	}
	rows, err := read()
	if err == nil && len(rows) == 0 {
		var found bool
		if found, err = s.project(ctx, sku, key); err == nil && found {
			rows, err = read()
		}
	}
	if err != nil || len(rows) == 0 {
		return arbiter.Reservation{}, false, err
	}
	return rows[0], true, nil
}

// project writes the projection of the token's hold if only the lean sale
// recorded it (arbiter.ProjectHold); found reports a hold it recorded.
// Every path that finds no reservation of a token asks it before it
// answers so.
func (s *Service) project(ctx context.Context, sku, key string) (found bool, err error) {
	err = arbiter.Transact(ctx, s.db, func(tx *gorm.DB) error {
		found, err = arbiter.In(tx).ProjectHold("", sku, key)
		return err
	})
	return found, err
}

// answer is a replay's answer from the reservation the first call recorded:
// its result (and the hold's current end), a conflict for another
// quantity, ErrReleased once released.
func answer(r arbiter.Reservation, qty int64) (Held, error) {
	switch {
	case r.State == arbiter.Released:
		return Held{}, ErrReleased
	case r.Qty != qty:
		return Held{}, fmt.Errorf("%w: token was used for %d units, not %d", inventory.ErrConflict, r.Qty, qty)
	}
	return Held{Result: r.Result, ExpiresAt: r.ExpiresAt.UTC()}, nil
}

// Extend moves the end of the client's HELD reservation to by from now
// (never earlier than it is), in one conditional UPDATE: the hold must be
// HELD, not ended, and end within the maximum counted from its creation.
// An extension racing the timeout sweep either lands before the deadline
// or is refused: it never revives a released hold. With an idempotency
// key, a retry answers the end the first call set. Errors:
// ErrInvalidArgument, ErrNotFound, ErrReleased, ErrConflict.
func (s *Service) Extend(ctx context.Context, sku, token, idemKey string, by time.Duration) (time.Time, error) {
	key, err := rawKey(sku, token)
	if err != nil {
		return time.Time{}, err
	}
	if err := inventory.ValidateIdempotencyKey(idemKey); err != nil {
		return time.Time{}, err
	}
	if by < inventory.MinHold || by > s.cfg.MaxHold {
		return time.Time{}, inventory.Invalidf("seconds must be between %d and %d", int64(inventory.MinHold/time.Second), int64(s.cfg.MaxHold/time.Second))
	}
	now := s.now()
	until := now.Add(by)
	extend := func() (bool, error) {
		return arbiter.RetryDeadlock(ctx, func() (bool, error) {
			// One statement, atomic alone: no transaction around it (one round trip).
			return arbiter.In(s.db.WithContext(ctx).Session(&gorm.Session{SkipDefaultTransaction: true})).Extend(key, sku, now, until, until.Add(-s.cfg.MaxHold), idemKey)
		})
	}
	ok, err := extend()
	if err == nil && !ok {
		// The hold only the lean sale recorded yet: projected, then the
		// UPDATE once more (a refusal is answered from the row below).
		var found bool
		if found, err = s.project(ctx, sku, key); err == nil && found {
			ok, err = extend()
		}
	}
	if err != nil {
		return time.Time{}, err
	}
	if ok {
		if err := s.stock.KeepToken(ctx, sku, key, by+tokenMargin); err != nil {
			s.cfg.Logger.Warn("tokens: Redis did not keep an extended token; a replay asks the database", "sku", sku, "err", err)
		}
		return until, nil
	}
	var r arbiter.Reservation
	if err := s.db.WithContext(ctx).Take(&r, "token = ? AND sku = ?", key, sku).Error; err != nil {
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return time.Time{}, fmt.Errorf("%w: no reservation of %s with this token", inventory.ErrNotFound, sku)
		}
		return time.Time{}, err
	}
	end := r.ExpiresAt.UTC()
	switch {
	case r.State == arbiter.Released:
		return time.Time{}, ErrReleased
	case r.State != arbiter.Held:
		return time.Time{}, fmt.Errorf("%w: the reservation is committed (sold); its hold is over", inventory.ErrConflict)
	case idemKey != "" && r.ExtendKey != nil && *r.ExtendKey == idemKey:
		return end, nil // a replay: the end its first call set (or a later one)
	case !end.After(now):
		return time.Time{}, fmt.Errorf("%w: the hold ended at %s", inventory.ErrConflict, end.Format(time.RFC3339))
	case !end.Before(until):
		return end, nil // it holds at least that long already
	}
	return time.Time{}, fmt.Errorf("%w: a hold can last at most %s from its creation (%s)", inventory.ErrConflict,
		s.cfg.MaxHold, r.CreatedAt.UTC().Add(s.cfg.MaxHold).Format(time.RFC3339))
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
		// Only the lean sale may have recorded it: projected first, or the
		// tombstone below would hide a live hold.
		if _, err := arbiter.In(tx).ProjectHold("", sku, key); err != nil {
			return err
		}
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
		err := tx.Take(&r, "token = ? AND sku = ?", key, sku).Error
		if errors.Is(err, gorm.ErrRecordNotFound) { // only the lean sale may have recorded it
			var found bool
			if found, err = arbiter.In(tx).ProjectHold("", sku, key); err == nil && found {
				// A current read: this transaction's snapshot predates a
				// projection another one committed meanwhile.
				err = tx.Clauses(clause.Locking{Strength: "UPDATE"}).Take(&r, "token = ? AND sku = ?", key, sku).Error
			} else if err == nil {
				err = gorm.ErrRecordNotFound
			}
		}
		if err != nil {
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
	now := s.now()
	if err := projectExpired(ctx, s.db, now); err != nil {
		return 0, err
	}
	var rows []arbiter.Reservation
	if err := s.db.WithContext(ctx).Where("state = ? AND expires_at <= ? AND order_id IS NULL", arbiter.Held, now).
		Order("expires_at").Limit(limit).Find(&rows).Error; err != nil {
		return 0, err
	}
	n := 0
	for _, r := range rows {
		var rel arbiter.Freed
		err := arbiter.Transact(ctx, s.db, func(tx *gorm.DB) error {
			// A commit or an extension that won first leaves nothing due.
			var err error
			rel, err = arbiter.In(tx).ReleaseDue(r.Token, r.SKU, now)
			return err
		})
		if err != nil {
			return n, err
		}
		if len(rel.Changes) > 0 {
			n++
		}
		s.redis.Apply(ctx, rel.Changes)
		s.redis.Ended(ctx, rel.Ended) // a campaign's pool: its end
	}
	return n, nil
}

// projectExpired projects the lean holds past their deadline that the
// projector has not written yet, so the sweep finds them whether it runs
// or not (arbiter.ProjectExpired).
func projectExpired(ctx context.Context, db *gorm.DB, now time.Time) error {
	return arbiter.Transact(ctx, db, func(tx *gorm.DB) error {
		_, err := arbiter.In(tx).ProjectExpired(now, expiredSKUs, expiredPerSKU)
		return err
	})
}

// The sweep's projection of expired lean holds: up to expiredPerSKU holds
// of up to expiredSKUs SKUs per pass (what is left waits for the next).
const expiredSKUs, expiredPerSKU = 1000, 1000
