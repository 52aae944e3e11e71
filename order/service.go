package order

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/acme/inventory/stock"
)

// Config tunes a Service.
type Config struct {
	// TTL is how long an unpaid order holds its stock. Default 15m.
	TTL time.Duration
	// Now is the clock. Default time.Now.
	Now    func() time.Time
	Logger *slog.Logger
	// OnCreated is told about every new order (the timeout scheduler).
	OnCreated func(ctx context.Context, o *Order)
	// OnOutbox is told when outbox rows were committed (wakes the relay).
	OnOutbox func()
	// OnExpired is told how long after its deadline each order expired.
	OnExpired func(late time.Duration)
}

// Service runs the order lifecycle.
type Service struct {
	db     *gorm.DB
	stock  *stock.Store
	cfg    Config
	orders *batcher
}

func NewService(db *gorm.DB, st *stock.Store, cfg Config) *Service {
	if cfg.TTL == 0 {
		cfg.TTL = 15 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.OnCreated == nil {
		cfg.OnCreated = func(context.Context, *Order) {}
	}
	if cfg.OnOutbox == nil {
		cfg.OnOutbox = func() {}
	}
	if cfg.OnExpired == nil {
		cfg.OnExpired = func(time.Duration) {}
	}
	return &Service{db: db, stock: st, cfg: cfg, orders: newBatcher(db)}
}

func (s *Service) now() time.Time { return s.cfg.Now().UTC().Truncate(time.Microsecond) }

// idempotentID derives the order id from the client's idempotency key, so
// concurrent retries share one order id and therefore one reservation token.
func idempotentID(userID, key string) string {
	sum := sha256.Sum256([]byte(userID + "\x00" + key))
	return "o" + hex.EncodeToString(sum[:16])
}

// Get returns the order with its items.
func (s *Service) Get(ctx context.Context, id string) (*Order, error) {
	if err := validateID("order id", id); err != nil {
		return nil, err
	}
	return s.get(s.db.WithContext(ctx), id, false)
}

func (s *Service) get(tx *gorm.DB, id string, forUpdate bool) (*Order, error) {
	var o Order
	q := tx.Preload("Items", func(db *gorm.DB) *gorm.DB { return db.Order("sku") })
	if forUpdate {
		q = q.Clauses(clause.Locking{Strength: "UPDATE"})
	}
	if err := q.Take(&o, "id = ?", id).Error; err != nil {
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return nil, ErrNotFound
		}
		return nil, err
	}
	return &o, nil
}

// Create reserves every line in Redis and then writes the order; a sold-out
// request never reaches the database. With an idempotency key, a retry
// returns the same order (and a different body with the same key conflicts).
func (s *Service) Create(ctx context.Context, userID, idemKey string, lines []stock.Line) (*Order, error) {
	if err := validateID("user_id", userID); err != nil {
		return nil, err
	}
	if idemKey != "" && !keyPattern.MatchString(idemKey) {
		return nil, invalid("Idempotency-Key must be 1-128 printable ASCII characters")
	}
	lines, err := s.stock.NormaliseCart(lines)
	if err != nil {
		return nil, err
	}
	id := uuid.Must(uuid.NewV7()).String()
	if idemKey != "" {
		id = idempotentID(userID, idemKey)
		if o, err := s.Get(ctx, id); err == nil {
			return sameOrder(o, lines)
		} else if !errors.Is(err, ErrNotFound) {
			return nil, err
		}
	}

	if _, err := s.stock.DeductCart(ctx, id, lines); err != nil {
		return nil, err
	}
	now := s.now()
	o := &Order{ID: id, UserID: userID, Status: Pending, ReservationToken: id, ExpiresAt: now.Add(s.cfg.TTL), CreatedAt: now, UpdatedAt: now}
	if idemKey != "" {
		o.IdempotencyKey = &idemKey
	}
	for _, l := range lines {
		o.Items = append(o.Items, Item{OrderID: id, SKU: l.SKU, Qty: l.Qty})
	}
	if err := s.orders.write(ctx, o); err != nil {
		if isDuplicate(err) && idemKey != "" { // a concurrent retry wrote it first
			winner, gerr := s.Get(ctx, id)
			if gerr != nil {
				return nil, gerr
			}
			return sameOrder(winner, lines)
		}
		s.undo(ctx, id, lines) // the order was not written: nothing may stay held
		return nil, fmt.Errorf("order: write: %w", err)
	}

	// Re-affirm: if Redis lost its keys between the reservation and the
	// write, the cold init may not have counted this order; a replay of the
	// token takes the units again only where they are not held.
	if _, err := s.stock.DeductCart(ctx, id, lines); err != nil {
		switch {
		case errors.Is(err, stock.ErrInsufficientStock):
			if _, cerr := s.Cancel(context.WithoutCancel(ctx), id); cerr != nil && !errors.Is(cerr, ErrConflict) {
				return nil, fmt.Errorf("order: cancelling an order whose stock was lost: %w", cerr)
			}
			return nil, err
		case errors.Is(err, stock.ErrTokenReleased):
			// Cancelled or expired meanwhile, or the hold was reaped before the
			// row was written (a stall longer than the hold TTL): an order that
			// holds nothing must not stay PENDING.
			o, cerr := s.Cancel(context.WithoutCancel(ctx), id)
			if cerr == nil {
				return nil, fmt.Errorf("%w: the reservation expired before the order was written", stock.ErrUnavailable)
			}
			if errors.Is(cerr, ErrConflict) {
				return o, nil
			}
			return nil, cerr
		default:
			s.cfg.Logger.Warn("order: re-affirming the reservation failed", "order", id, "err", err)
		}
	}
	s.cfg.OnCreated(ctx, o)
	return o, nil
}

func (s *Service) undo(ctx context.Context, token string, lines []stock.Line) {
	for _, l := range lines {
		if _, err := s.stock.Undo(context.WithoutCancel(ctx), l.SKU, token); err != nil {
			s.cfg.Logger.Error("order: undoing a reservation failed; the timeout release will give it back",
				"token", token, "sku", l.SKU, "err", err)
		}
	}
}

// sameOrder answers an idempotent replay: the stored order if the request
// asked for the same lines, a conflict otherwise.
func sameOrder(o *Order, lines []stock.Line) (*Order, error) {
	if !slices.Equal(o.lines(), lines) {
		return nil, fmt.Errorf("%w: Idempotency-Key was used for a different order", ErrConflict)
	}
	return o, nil
}

// transition moves id from one of from to to, conditionally, returning the
// updated order; ErrConflict (with the current order) when another caller
// moved it first.
func (s *Service) transition(tx *gorm.DB, id string, to Status, from []Status, set map[string]any) (bool, error) {
	if set == nil {
		set = map[string]any{}
	}
	set["status"] = to
	res := tx.Model(&Order{}).Where("id = ? AND status IN ?", id, from).Updates(set)
	if res.Error != nil {
		return false, res.Error
	}
	return res.RowsAffected == 1, nil
}

// Cancel moves a PENDING order to CANCELLED and gives its units back.
func (s *Service) Cancel(ctx context.Context, id string) (*Order, error) {
	return s.close(ctx, id, Cancelled, nil)
}

// Expire moves a PENDING order whose deadline has passed to EXPIRED and gives
// its units back. It reports whether this call expired it.
func (s *Service) Expire(ctx context.Context, id string) (bool, error) {
	_, err := s.close(ctx, id, Expired, func(tx *gorm.DB) *gorm.DB {
		return tx.Where("expires_at <= ?", s.now())
	})
	if errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

func (s *Service) close(ctx context.Context, id string, to Status, cond func(*gorm.DB) *gorm.DB) (*Order, error) {
	if err := validateID("order id", id); err != nil {
		return nil, err
	}
	// The update and the read share a transaction (the UPDATE holds the row
	// lock until commit), so the token released below is the one the order
	// had when this call won, not one a late payment put there since.
	var won bool
	o, err := s.inTx(ctx, func(tx *gorm.DB) (*Order, error) {
		q := tx.Model(&Order{}).Where("id = ? AND status = ?", id, Pending)
		if cond != nil {
			q = cond(q)
		}
		res := q.Update("status", to)
		if res.Error != nil {
			return nil, res.Error
		}
		won = res.RowsAffected == 1
		return s.get(tx, id, false)
	})
	if err != nil {
		return nil, err
	}
	if !won {
		return o, fmt.Errorf("%w: order %s is %s", ErrConflict, id, o.Status)
	}
	s.giveBack(ctx, o)
	if to == Expired {
		s.cfg.OnExpired(s.now().Sub(o.ExpiresAt))
	}
	return o, nil
}

// giveBack releases every line of o in Redis. A failure leaves the hold to the
// timeout release (its deadline is in Redis too), so it is logged, not fatal.
func (s *Service) giveBack(ctx context.Context, o *Order) {
	for _, it := range o.Items {
		if _, err := s.stock.Release(context.WithoutCancel(ctx), it.SKU, o.ReservationToken); err != nil {
			s.cfg.Logger.Error("order: releasing stock failed; the timeout release will retry",
				"order", o.ID, "sku", it.SKU, "err", err)
		}
	}
}

// Pay records a successful payment: idempotent by payment id. A PENDING order
// becomes PAID with one DEDUCT outbox row per line in the same transaction. A
// payment after the deadline (or after a cancel) re-reserves the stock under a
// new token if it can and becomes PAID, else REFUND_REQUIRED.
func (s *Service) Pay(ctx context.Context, id, paymentID string) (*Order, error) {
	if err := validateID("order id", id); err != nil {
		return nil, err
	}
	if err := validateID("payment_id", paymentID); err != nil {
		return nil, err
	}
	var late *Order
	o, err := s.inTx(ctx, func(tx *gorm.DB) (*Order, error) {
		o, err := s.get(tx, id, true)
		if err != nil {
			return nil, err
		}
		if done, err := paidAlready(o, paymentID); done {
			return o, err
		}
		switch {
		case o.Status == Pending && s.now().Before(o.ExpiresAt):
			return s.markPaid(tx, o, paymentID, o.ReservationToken, Pending)
		case o.Status == Pending: // past its deadline: expire it, then pay late
			if _, err := s.transition(tx, id, Expired, []Status{Pending}, nil); err != nil {
				return nil, err
			}
			o.Status = Expired
			late = o
			return o, nil
		case o.Status == Expired || o.Status == Cancelled:
			late = o
			return o, nil
		}
		return nil, fmt.Errorf("%w: order %s is %s", ErrConflict, id, o.Status)
	})
	if err != nil {
		return nil, err
	}
	if late != nil {
		s.giveBack(ctx, late) // no-op unless this call expired it
		return s.payLate(ctx, late, paymentID)
	}
	s.confirm(ctx, o)
	return o, nil
}

// paidAlready answers a replayed callback: the same payment id returns the
// order as it is; another payment id on a paid order conflicts.
func paidAlready(o *Order, paymentID string) (bool, error) {
	if o.PaymentID == nil {
		return false, nil
	}
	if *o.PaymentID == paymentID {
		return true, nil
	}
	return true, fmt.Errorf("%w: order %s was paid by another payment", ErrConflict, o.ID)
}

// markPaid moves o (in state from) to PAID under token and writes its DEDUCT
// outbox rows, in tx.
func (s *Service) markPaid(tx *gorm.DB, o *Order, paymentID, token string, from ...Status) (*Order, error) {
	now := s.now()
	ok, err := s.transition(tx, o.ID, Paid, from, map[string]any{
		"payment_id": paymentID, "paid_at": now, "reservation_token": token,
	})
	if err != nil {
		if isDuplicate(err) {
			return nil, fmt.Errorf("%w: payment %s belongs to another order", ErrConflict, paymentID)
		}
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: order %s changed concurrently", ErrConflict, o.ID)
	}
	if err := writeOutbox(tx, o, OpDeduct); err != nil {
		return nil, err
	}
	o.Status, o.PaymentID, o.PaidAt, o.ReservationToken = Paid, &paymentID, &now, token
	return o, nil
}

// payLate re-reserves an expired or cancelled order's lines under a token of
// its own (the old token is closed) and pays it, or records REFUND_REQUIRED.
func (s *Service) payLate(ctx context.Context, o *Order, paymentID string) (*Order, error) {
	token := o.ID + ".late"
	_, rerr := s.stock.DeductCart(ctx, token, o.lines())
	if rerr != nil && !errors.Is(rerr, stock.ErrInsufficientStock) {
		return nil, rerr
	}
	paid, err := s.inTx(ctx, func(tx *gorm.DB) (*Order, error) {
		cur, err := s.get(tx, o.ID, true)
		if err != nil {
			return nil, err
		}
		if done, err := paidAlready(cur, paymentID); done {
			return cur, err
		}
		if cur.Status != Expired && cur.Status != Cancelled {
			return nil, fmt.Errorf("%w: order %s is %s", ErrConflict, o.ID, cur.Status)
		}
		if rerr != nil { // stock is gone: the payment must be refunded
			ok, err := s.transition(tx, o.ID, RefundRequired, []Status{cur.Status}, map[string]any{"payment_id": paymentID, "paid_at": s.now()})
			if err != nil || !ok {
				return nil, errors.Join(err, fmt.Errorf("%w: order %s changed concurrently", ErrConflict, o.ID))
			}
			return s.get(tx, o.ID, false)
		}
		return s.markPaid(tx, cur, paymentID, token, cur.Status)
	})
	if err != nil {
		if rerr == nil && (paid == nil || paid.ReservationToken != token) {
			s.undo(ctx, token, o.lines())
		}
		return nil, err
	}
	if paid.Status == Paid && paid.ReservationToken == token {
		s.confirm(ctx, paid)
	} else if rerr == nil {
		s.undo(ctx, token, o.lines())
	}
	return paid, nil
}

// confirm turns the paid order's holds into sales in Redis, and wakes the relay.
func (s *Service) confirm(ctx context.Context, o *Order) {
	s.cfg.OnOutbox()
	for _, it := range o.Items {
		_, err := s.stock.Confirm(context.WithoutCancel(ctx), it.SKU, o.ReservationToken)
		switch {
		case err == nil, errors.Is(err, stock.ErrNotHeld):
			// ErrNotHeld: Redis was re-initialised after the payment committed and
			// counted the line as paid-but-unapplied already.
		default:
			s.cfg.Logger.Error("order: confirming a paid line in Redis failed; reconcile will report it",
				"order", o.ID, "sku", it.SKU, "err", err)
		}
	}
}

// Refund moves a PAID order to REFUNDED, writes RESTORE outbox rows for the
// database and gives the units back in Redis. A REFUND_REQUIRED order (it
// never took stock) just becomes REFUNDED.
func (s *Service) Refund(ctx context.Context, id string) (*Order, error) {
	if err := validateID("order id", id); err != nil {
		return nil, err
	}
	var restored bool
	o, err := s.inTx(ctx, func(tx *gorm.DB) (*Order, error) {
		o, err := s.get(tx, id, true)
		if err != nil {
			return nil, err
		}
		if o.Status != Paid && o.Status != RefundRequired {
			return nil, fmt.Errorf("%w: order %s is %s", ErrConflict, id, o.Status)
		}
		if _, err := s.transition(tx, id, Refunded, []Status{o.Status}, nil); err != nil {
			return nil, err
		}
		if o.Status == Paid {
			if err := writeOutbox(tx, o, OpRestore); err != nil {
				return nil, err
			}
			restored = true
		}
		o.Status = Refunded
		return o, nil
	})
	if err != nil {
		return nil, err
	}
	if restored {
		s.cfg.OnOutbox()
		for _, it := range o.Items {
			q, err := s.stock.Release(context.WithoutCancel(ctx), it.SKU, o.ReservationToken)
			if err == nil && q == 0 {
				// Redis no longer knows the sale (its tombstone expired, or a cold
				// init counted it as paid-unapplied): give the units back directly.
				_, err = s.stock.Adjust(context.WithoutCancel(ctx), it.SKU, it.Qty)
			}
			if err != nil {
				s.cfg.Logger.Error("order: giving back refunded units in Redis failed; reconcile will repair it",
					"order", o.ID, "sku", it.SKU, "err", err)
			}
		}
	}
	return o, nil
}

func writeOutbox(tx *gorm.DB, o *Order, op Op) error {
	rows := make([]OutboxRow, len(o.Items))
	for i, it := range o.Items {
		rows[i] = OutboxRow{OrderID: o.ID, SKU: it.SKU, Op: op, Qty: it.Qty}
	}
	return tx.Create(&rows).Error
}

// inTx runs fn in a transaction, retrying a few times on deadlock.
func (s *Service) inTx(ctx context.Context, fn func(tx *gorm.DB) (*Order, error)) (*Order, error) {
	return retryDeadlock(func() (*Order, error) {
		var out *Order
		err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			o, err := fn(tx)
			out = o
			return err
		})
		return out, err
	})
}

func retryDeadlock[T any](fn func() (T, error)) (T, error) {
	for attempt := 0; ; attempt++ {
		v, err := fn()
		var me *mysql.MySQLError
		if attempt < 4 && errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205) {
			time.Sleep(time.Duration(attempt+1) * 5 * time.Millisecond)
			continue
		}
		return v, err
	}
}

func isDuplicate(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1062 || errors.Is(err, gorm.ErrDuplicatedKey)
}

// Snapshot returns the stock.InitFunc over db: a SKU's stock, its unpaid
// reservations and its paid-but-unapplied units, read in one consistent
// snapshot.
func Snapshot(db *gorm.DB) stock.InitFunc {
	return func(ctx context.Context, sku string) (stock.Snapshot, error) {
		return snapshot(ctx, db, sku)
	}
}

func snapshot(ctx context.Context, db *gorm.DB, sku string) (stock.Snapshot, error) {
	var snap stock.Snapshot
	var opts []*sql.TxOptions
	if db.Dialector.Name() == "mysql" { // one consistent read view for all three queries
		opts = append(opts, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	}
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var err error
		snap, err = readSnapshot(tx, sku, false)
		return err
	}, opts...)
	return snap, err
}

// readSnapshot reads sku's stock (locking its row if forUpdate), its unpaid
// reservations and its paid-but-unapplied units, in tx.
func readSnapshot(tx *gorm.DB, sku string, forUpdate bool) (stock.Snapshot, error) {
	var snap stock.Snapshot
	q := tx.Table("skus").Select("stock").Where("sku = ?", sku)
	if forUpdate {
		q = q.Clauses(clause.Locking{Strength: "UPDATE"})
	}
	var st []int64
	if err := q.Pluck("stock", &st).Error; err != nil {
		return snap, err
	}
	if len(st) == 0 {
		return snap, stock.ErrUnknownSKU
	}
	snap.Stock = st[0]
	var holds []struct {
		Token     string
		Qty       int64
		ExpiresAt time.Time
	}
	if err := tx.Raw(`SELECT o.reservation_token AS token, i.qty, o.expires_at
		FROM order_items i JOIN orders o ON o.id = i.order_id
		WHERE i.sku = ? AND o.status = ?`, sku, Pending).Scan(&holds).Error; err != nil {
		return snap, err
	}
	for _, h := range holds {
		snap.Holds = append(snap.Holds, stock.Hold{Token: h.Token, Qty: h.Qty, Deadline: h.ExpiresAt})
	}
	err := tx.Raw(`SELECT COALESCE(SUM(CASE WHEN ob.op = ? THEN ob.qty ELSE -ob.qty END), 0)
		FROM stock_outbox ob
		LEFT JOIN stock_ledger l ON l.order_id = ob.order_id AND l.sku = ob.sku AND l.op = ob.op
		LEFT JOIN stock_anomalies a ON a.order_id = ob.order_id AND a.sku = ob.sku AND a.op = ob.op
		WHERE ob.sku = ? AND l.id IS NULL AND a.id IS NULL`, OpDeduct, sku).Scan(&snap.Pending).Error
	return snap, err
}
