package order

import (
	"context"

	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/followup"
	"github.com/acme/inventory/internal/groupcommit"
	"github.com/acme/inventory/internal/sale"
	"github.com/acme/inventory/stock"
)

// Config tunes a Service.
type Config struct {
	// TTL is how long an unpaid order holds its stock unless the caller
	// asks for another hold. Default 15m.
	TTL time.Duration
	// MaxHold is the longest hold, counted from the order's creation, a
	// caller may ask for or extend to. Default inventory.DefaultMaxHold.
	MaxHold time.Duration
	// Now is the clock. Default time.Now.
	Now    func() time.Time
	Logger *slog.Logger
	// OnCreated is told about every new order (the timeout scheduler).
	OnCreated func(ctx context.Context, o *Order)
	// OnFinished is told when an order stopped waiting for its deadline
	// (paid or cancelled), to unschedule it.
	OnFinished func(ctx context.Context, o *Order)
	// OnExtended is told the new deadline of an order whose hold was
	// extended (the timeout scheduler moves it).
	OnExtended func(ctx context.Context, id string, deadline time.Time)
	// OnOutbox is told when outbox rows were committed (wakes the relay).
	OnOutbox func()
	// OnExpired is told how long after its deadline each order expired.
	OnExpired func(late time.Duration)
	// MultiStatements, on MySQL and MariaDB, is the service's db on a pool
	// whose connections take several statements in one query (OnPool of
	// mysqlconn.MultiStatements): Extend sends its conditional UPDATE and
	// the read of its answer as one text there, one round trip. Nil
	// (SQLite): the UPDATE, then the order and its lines, three.
	MultiStatements *gorm.DB
	// Writer is the group commit that records new orders with their
	// reservations (the token API shares it). Default: one of the
	// Service's own, which Close closes.
	Writer *groupcommit.Writer
	// Lean has a sale record its holds as the lean sale does (one row of
	// holds each, the order and its reservations projected after the
	// commit; docs/design.md "The lean sale"), a campaign's only with
	// LeanCampaigns too. Off (the default), a sale writes the order and its
	// reservations in its commit; either way every read and transition
	// finds an order the other way wrote.
	Lean, LeanCampaigns bool
}

// Service runs the order lifecycle.
type Service struct {
	db     *gorm.DB
	stock  *stock.Store
	cfg    Config
	redis  followup.Redis
	sales  sale.Pipeline
	limits limits
	orders *groupcommit.Writer
	owned  bool // orders is the Service's own (Close closes it)

	// contracted: every key is in idempotency_keys, orders_idempotency
	// gone (MySQL) or never needed (SQLite): keyedBeforeTheKeys.
	contracted atomic.Bool

	transitions sync.Map // Status -> *atomic.Int64
}

// count records one order reaching status on this node (metrics read
// Transitions; counting in memory keeps a scrape off the orders table).
func (s *Service) count(status Status) {
	v, _ := s.transitions.LoadOrStore(status, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

// Transitions is how many orders reached each status on this node (a new
// order counts as PENDING).
func (s *Service) Transitions() map[Status]int64 {
	out := map[Status]int64{}
	s.transitions.Range(func(k, v any) bool {
		out[k.(Status)] = v.(*atomic.Int64).Load()
		return true
	})
	return out
}

func NewService(db *gorm.DB, st *stock.Store, cfg Config) *Service {
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
	if cfg.OnExtended == nil {
		cfg.OnExtended = func(context.Context, string, time.Time) {}
	}
	if cfg.OnCreated == nil {
		cfg.OnCreated = func(context.Context, *Order) {}
	}
	if cfg.OnFinished == nil {
		cfg.OnFinished = func(context.Context, *Order) {}
	}
	if cfg.OnOutbox == nil {
		cfg.OnOutbox = func() {}
	}
	if cfg.OnExpired == nil {
		cfg.OnExpired = func(time.Duration) {}
	}
	s := &Service{db: db, stock: st, cfg: cfg, redis: followup.Redis{Stock: st, Log: cfg.Logger}, orders: cfg.Writer}
	// The embedded default contracts its SQLite at every start (app), and
	// migrate contracts a new database: its keys are all in
	// idempotency_keys.
	s.contracted.Store(db.Dialector.Name() == "sqlite")
	if s.orders == nil {
		s.orders, s.owned = groupcommit.New(db), true
	}
	s.sales = sale.Pipeline{Writer: s.orders, Redis: s.redis}
	s.limits = limits{db: db, now: cfg.Now, m: &sync.Map{}}
	return s
}

// Close closes the group commit's own database connections if the Service
// made it (Config.Writer unset); call it after the last request, before
// closing the database.
func (s *Service) Close() error {
	if !s.owned {
		return nil
	}
	return s.orders.Close()
}

func (s *Service) now() time.Time { return s.cfg.Now().UTC().Truncate(time.Microsecond) }

// Holds is the service's hold policy (the default hold and the maximum).
func (s *Service) Holds() inventory.Holds {
	return inventory.Holds{Default: s.cfg.TTL, Max: s.cfg.MaxHold}
}

// Get returns the order with its items (projected first if only the
// lean sale recorded it).
func (s *Service) Get(ctx context.Context, id string) (*Order, error) {
	return readProjected(ctx, s, id, func() (*Order, error) { return s.get0(ctx, id) })
}

// get0 is Get on the projection as it stands.
func (s *Service) get0(ctx context.Context, id string) (*Order, error) {
	if err := inventory.ValidateOrderID("order id", id); err != nil {
		return nil, err
	}
	return s.get(s.db.WithContext(ctx), id, false)
}

func (s *Service) get(tx *gorm.DB, id string, forUpdate bool) (*Order, error) {
	return s.find(tx, forUpdate, "id = ?", id)
}

// find reads the order matching where, with its items.
func (s *Service) find(tx *gorm.DB, forUpdate bool, where string, args ...any) (*Order, error) {
	var o Order
	q := tx
	if forUpdate {
		q = q.Clauses(clause.Locking{Strength: "UPDATE"})
	}
	if err := q.Where(where, args...).Take(&o).Error; err != nil {
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return nil, inventory.ErrNotFound
		}
		return nil, err
	}
	if err := LoadItems(tx, &o); err != nil {
		return nil, err
	}
	return &o, nil
}

// Kind is what a buy takes its units from.
type Kind int

const (
	// Cart: each line's SKU. Redis counts no buyer; a SKU with a per-user
	// limit is counted by the database as it records the order.
	Cart Kind = iota
	// Seckill: one unit of one SKU, counted against the SKU's per-user
	// limit (if it has one) by the same Redis call that admits it. The
	// route takes no Idempotency-Key.
	Seckill
	// CampaignBuy: one unit of a campaign's pool, within its window and
	// its per-user limit.
	CampaignBuy
)

// Buy is one request to buy, of any kind: the one entry point (Service.Buy)
// validates it once, admits it in Redis as its kind does, and writes it
// through the pipeline every kind shares (internal/sale).
type Buy struct {
	Kind Kind
	User string
	// Key is the Idempotency-Key ("" none): a retry with it answers the
	// first order, and a different body with it conflicts.
	Key string
	// Lines are a cart's lines, or a seckill's one line (its SKU, qty 1).
	Lines []inventory.Line
	// Campaign is a campaign buy's campaign.
	Campaign CampaignSale
	// Hold is how long the order holds its units (0: the default, or the
	// campaign's own), within the service's Holds.
	Hold time.Duration
	// Now is the node's clock for a campaign buy: Redis checks the window
	// against it (the database's clock decides as it records the sale).
	Now time.Time
}

// CampaignSale is what a campaign buy needs of its campaign: which pool,
// the per-user limit (0: none) and the hold its orders get (0: the
// service's default).
type CampaignSale struct {
	ID, SKU string
	Limit   int64
	Hold    time.Duration
}

// Buy places an order for b: Redis admits its units (a sold-out request
// never reaches the database), then the database records the order with
// its reservations in one commit through the group commit, and
// arbitrates. A seckill's per-user limit is the SKU's, read here (cached
// a few seconds: the database counts the limit again as it records the
// sale, so the Redis count is only its pre-filter). Order ids are random,
// never derived from request fields. Errors: inventory.ErrInvalidArgument,
// ErrInsufficientStock, ErrConflict (a buyer's limit, a key reused with
// another body), ErrNotStarted and ErrEnded (a campaign's window),
// ErrNotFound, ErrUnknownSKU, ErrUnavailable.
func (s *Service) Buy(ctx context.Context, b Buy) (*Order, error) {
	return s.buy(ctx, b, s.limits.of)
}

// Create is Buy of a cart for the default hold.
func (s *Service) Create(ctx context.Context, userID, idemKey string, lines []inventory.Line) (*Order, error) {
	return s.CreateHold(ctx, userID, idemKey, lines, 0)
}

// CreateHold is Buy of a cart. A replay answers the first order whatever
// hold it asks for.
func (s *Service) CreateHold(ctx context.Context, userID, idemKey string, lines []inventory.Line, hold time.Duration) (*Order, error) {
	return s.Buy(ctx, Buy{Kind: Cart, User: userID, Key: idemKey, Lines: lines, Hold: hold})
}

// Seckill is SeckillHold for the default hold.
func (s *Service) Seckill(ctx context.Context, userID, sku string, limit int64) (*Order, error) {
	return s.SeckillHold(ctx, userID, sku, limit, 0)
}

// SeckillHold is Buy of a seckill under the per-user limit the caller
// read (limit > 0; 0: none), instead of the SKU's as Buy reads it: for
// tests and tools that set the limit they buy under.
func (s *Service) SeckillHold(ctx context.Context, userID, sku string, limit int64, hold time.Duration) (*Order, error) {
	return s.buy(ctx, Buy{Kind: Seckill, User: userID, Lines: []inventory.Line{{SKU: sku, Qty: 1}}, Hold: hold},
		func(context.Context, string) (int64, error) { return limit, nil })
}

// BuyCampaign is Buy of one unit of campaign c at now.
func (s *Service) BuyCampaign(ctx context.Context, userID, idemKey string, c CampaignSale, now time.Time) (*Order, error) {
	return s.Buy(ctx, Buy{Kind: CampaignBuy, User: userID, Key: idemKey, Campaign: c, Now: now})
}

// buy is Buy with a seckill's limit read by limit.
func (s *Service) buy(ctx context.Context, b Buy, limit func(ctx context.Context, sku string) (int64, error)) (*Order, error) {
	if err := inventory.ValidateUserID(b.User); err != nil {
		return nil, err
	}
	if err := inventory.ValidateIdempotencyKey(b.Key); err != nil {
		return nil, err
	}
	hold := b.Hold
	if b.Kind == CampaignBuy && hold == 0 {
		hold = b.Campaign.Hold
	}
	hold, err := s.Holds().For(hold)
	if err != nil {
		return nil, err
	}
	lines := b.Lines
	switch b.Kind {
	case CampaignBuy:
		lines = []inventory.Line{{SKU: b.Campaign.SKU, Qty: 1}}
	case Seckill:
		if len(lines) != 1 || lines[0].Qty != 1 {
			return nil, inventory.Invalidf("a seckill buys one unit of one SKU")
		}
		if b.Key != "" {
			return nil, inventory.Invalidf("a seckill takes no Idempotency-Key")
		}
		fallthrough
	default:
		if lines, err = s.stock.NormaliseCart(lines); err != nil {
			return nil, err
		}
	}
	if b.Key != "" {
		if o, err := s.byIdempotencyKey(ctx, b.User, b.Key); err == nil {
			return sameOrder(o, lines)
		} else if !errors.Is(err, inventory.ErrNotFound) {
			return nil, err
		}
	}
	var adm sale.Admitted
	var results []int64 // what Redis had left after admitting each line
	var campaign *string
	switch b.Kind {
	case CampaignBuy:
		c := b.Campaign
		pool := stock.Campaign{ID: c.ID, SKU: c.SKU}
		var buyer *stock.Buyer
		if c.Limit > 0 {
			buyer = &stock.Buyer{User: b.User, Limit: c.Limit}
		}
		a, err := s.stock.AdmitCampaign(ctx, pool, 1, buyer, b.Now)
		if errors.Is(err, inventory.ErrOverLimit) {
			return nil, fmt.Errorf("%w: buyer %s reached the limit of %d in campaign %s", inventory.ErrConflict, b.User, c.Limit, c.ID)
		}
		if err != nil {
			return nil, err
		}
		adm, results, campaign = sale.Campaign{Pool: pool, Qty: 1, Adm: a, Buyer: buyer}, []int64{a.Remaining}, &c.ID
	case Seckill:
		sku := lines[0].SKU
		l, err := limit(ctx, sku)
		if err != nil {
			return nil, err
		}
		if l > 0 {
			a, err := s.stock.AdmitBuyer(ctx, sku, 1, stock.Buyer{User: b.User, Limit: l})
			if errors.Is(err, inventory.ErrOverLimit) {
				return nil, arbiter.OverLimitError{SKU: sku, User: b.User, Limit: l}
			}
			if err != nil {
				return nil, err
			}
			adm, results = sale.Buyer{Line: lines[0], Adm: a, Buyer: b.User}, []int64{a.Remaining}
			break
		}
		fallthrough // no limit: admitted as a cart of one line
	default:
		a, err := s.stock.AdmitCart(ctx, lines)
		if err != nil {
			return nil, err
		}
		adm = sale.Lines{Lines: lines, Adm: a, Buyer: b.User}
		for _, x := range a {
			results = append(results, x.Remaining)
		}
	}
	return s.write(ctx, b, lines, results, hold, campaign, adm)
}

// write records the order of lines that adm admitted for b, holding them
// for hold (its reservations drawn from campaign's pool; nil: from their
// SKUs), through the pipeline every buy shares: on success Redis is
// settled to what the database recorded; on failure the pipeline puts
// Redis right, and a duplicate of b's key answers the first order.
func (s *Service) write(ctx context.Context, b Buy, lines []inventory.Line, results []int64, hold time.Duration,
	campaign *string, adm sale.Admitted) (*Order, error) {
	id := uuid.Must(uuid.NewV7()).String()
	now := s.now()
	o := &Order{ID: id, UserID: b.User, Status: Pending, ReservationToken: id, ExpiresAt: now.Add(hold), CreatedAt: now, UpdatedAt: now}
	if b.Key != "" {
		o.IdempotencyKey = &b.Key
	}
	req := &groupcommit.Request{Buyer: b.User, Lean: s.cfg.Lean && (campaign == nil || s.cfg.LeanCampaigns)}
	if !req.Lean {
		req.Records = append(req.Records, orderRecord(o))
	}
	if b.Key != "" { // either way, what makes a retry with the key a duplicate
		req.Records = append(req.Records, keyRecord(o))
	}
	for i, l := range lines {
		o.Items = append(o.Items, Item{OrderID: id, SKU: l.SKU, Qty: l.Qty})
		req.Rows = append(req.Rows, arbiter.Reservation{Token: id, SKU: l.SKU, OrderID: &o.ID, Qty: l.Qty, State: arbiter.Held,
			Result: results[i], ExpiresAt: o.ExpiresAt, CreatedAt: now, UpdatedAt: now, CampaignID: campaign})
	}
	sl := sale.Sale[*Order]{Token: id, Request: req, Admitted: adm,
		Written: func(map[string]arbiter.Fence) *Order {
			s.cfg.OnCreated(ctx, o)
			s.count(Pending)
			return o
		}}
	if b.Key != "" {
		sl.Duplicate = func(ctx context.Context) (*Order, error) { // a concurrent retry wrote it first
			winner, err := s.byIdempotencyKey(ctx, b.User, b.Key)
			if err != nil {
				return nil, err
			}
			return sameOrder(winner, lines)
		}
	}
	return sale.Write(ctx, s.sales, sl)
}

// byIdempotencyKey is the order userID made with key: the one
// idempotency_keys names (found through Get, so projected if only the lean
// sale recorded it), or, until the contract, one a release before
// migration 44 recorded with its key in its row alone.
func (s *Service) byIdempotencyKey(ctx context.Context, userID, key string) (*Order, error) {
	var ids []string
	if err := s.db.WithContext(ctx).Table("idempotency_keys").Where("user_id = ? AND idempotency_key = ?", userID, key).
		Pluck("order_id", &ids).Error; err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		var err error
		if ids, err = s.keyedBeforeTheKeys(ctx, userID, key); err != nil {
			return nil, err
		}
	}
	if len(ids) == 1 {
		return s.Get(ctx, ids[0])
	}
	return nil, fmt.Errorf("%w: no order of %s has Idempotency-Key %q", inventory.ErrNotFound, userID, key)
}

// keyedBeforeTheKeys is the order a release before idempotency_keys made
// with key, read through orders_idempotency, the index the contract drops
// after copying every such key into idempotency_keys (migrations'
// contract step 1). On MySQL the read names that index, so once it is
// gone the read fails at once instead of scanning orders, and this node
// stops reading it: every key is in idempotency_keys from then on.
// SQLite is contracted from the start (NewService).
func (s *Service) keyedBeforeTheKeys(ctx context.Context, userID, key string) ([]string, error) {
	if s.contracted.Load() {
		return nil, nil
	}
	var ids []string
	err := s.db.WithContext(ctx).Raw("SELECT id FROM orders FORCE INDEX (orders_idempotency) WHERE user_id = ? AND idempotency_key = ?", userID, key).Scan(&ids).Error
	if me := (*mysql.MySQLError)(nil); errors.As(err, &me) && me.Number == erKeyDoesNotExist {
		s.contracted.Store(true)
		s.cfg.Logger.Info("orders: the contract dropped orders_idempotency; Idempotency-Keys are read from idempotency_keys alone")
		return nil, nil
	}
	return ids, err
}

// erKeyDoesNotExist is MySQL's error for an index hint naming no index
// (ER_KEY_DOES_NOT_EXITS).
const erKeyDoesNotExist = 1176

// sameOrder answers an idempotent replay: the stored order if the request
// asked for the same lines, a conflict otherwise.
func sameOrder(o *Order, lines []inventory.Line) (*Order, error) {
	if !slices.Equal(o.Lines(), lines) {
		return nil, fmt.Errorf("%w: Idempotency-Key was used for a different order", inventory.ErrConflict)
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
	if errors.Is(err, inventory.ErrConflict) || errors.Is(err, inventory.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// close moves a PENDING order to to and releases its reservations in the same
// transaction: the conditional transition picks one winner, so a cancel and
// a timeout racing on two nodes give the units back once.
func (s *Service) close(ctx context.Context, id string, to Status, cond func(*gorm.DB) *gorm.DB) (*Order, error) {
	return projected(ctx, s, id, func() (*Order, error) { return s.close0(ctx, id, to, cond) })
}

// close0 is close on the projection as it stands.
func (s *Service) close0(ctx context.Context, id string, to Status, cond func(*gorm.DB) *gorm.DB) (*Order, error) {
	if err := inventory.ValidateOrderID("order id", id); err != nil {
		return nil, err
	}
	var won bool
	var rel arbiter.Freed
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
		o, err := s.get(tx, id, false)
		if err != nil || !won {
			return o, err
		}
		rel, err = arbiter.In(tx).Release(o.ReservationToken, "")
		return o, err
	})
	if err != nil {
		return nil, err
	}
	if !won {
		return o, fmt.Errorf("%w: order %s is %s", inventory.ErrConflict, id, o.Status)
	}
	s.redis.Apply(ctx, rel.Changes) // the units, and the buyers' counts given back
	s.redis.ApplyCampaigns(ctx, rel.Campaigns, rel.CampaignQuotas)
	s.afterClose(o, to)
	s.count(to)
	if to == Cancelled {
		s.cfg.OnFinished(ctx, o)
	}
	if to == Expired {
		s.cfg.OnExpired(s.now().Sub(o.ExpiresAt))
	}
	return o, nil
}

// Extend moves the deadline of PENDING order id to by from now (never
// earlier than it is), for its buyer userID ("" for an admin), in one
// conditional UPDATE: the order must be PENDING, its deadline not passed,
// and the new one within the maximum hold counted from its creation. An
// extension racing the timeout is decided by the order's row: the expiry
// (expires_at <= now) and the extension (expires_at > now) cannot both
// win, so a released hold is never revived. With an idempotency key, a
// retry answers the order as the first call left it. The answer is read
// after the UPDATE; with Config.MultiStatements both go as one text, so an
// extension, a refusal and a replay each cost one round trip. Errors:
// ErrInvalidArgument, ErrNotFound, ErrForbidden (another buyer's order),
// ErrConflict (not PENDING, past its deadline, past the maximum).
func (s *Service) Extend(ctx context.Context, id, userID, idemKey string, by time.Duration) (*Order, error) {
	o, err := readProjected(ctx, s, id, func() (*Order, error) { return s.extend0(ctx, id, userID, idemKey, by) })
	if errors.Is(err, errRaced) { // projected between the UPDATE and the read: once more
		return s.extend0(ctx, id, userID, idemKey, by)
	}
	return o, err
}

// extend0 is Extend on the projection as it stands.
func (s *Service) extend0(ctx context.Context, id, userID, idemKey string, by time.Duration) (*Order, error) {
	if err := inventory.ValidateOrderID("order id", id); err != nil {
		return nil, err
	}
	if userID != "" {
		if err := inventory.ValidateUserID(userID); err != nil {
			return nil, err
		}
	}
	if err := inventory.ValidateIdempotencyKey(idemKey); err != nil {
		return nil, err
	}
	if by < inventory.MinHold || by > s.cfg.MaxHold {
		return nil, inventory.Invalidf("seconds must be between %d and %d", int64(inventory.MinHold/time.Second), int64(s.cfg.MaxHold/time.Second))
	}
	now := s.now()
	until := now.Add(by)
	extend := s.extendThenRead
	if s.cfg.MultiStatements != nil {
		extend = s.extendOneTrip
	}
	o, moved, err := extend(ctx, id, userID, idemKey, now, until)
	if err != nil {
		return nil, err
	}
	if moved {
		s.cfg.OnExtended(ctx, id, until)
		return o, nil
	}
	return o, s.whyNotExtended(o, userID, idemKey, now, until)
}

// extendThenRead is Extend's conditional UPDATE, then the read of the
// order as it left it (or as it stands, when it changed nothing), with its
// lines: three round trips (SQLite, or no Config.MultiStatements). It
// reports whether the UPDATE moved the deadline.
func (s *Service) extendThenRead(ctx context.Context, id, userID, idemKey string, now, until time.Time) (*Order, bool, error) {
	set := map[string]any{"expires_at": until, "updated_at": now, "extend_key": nil}
	q := s.db.WithContext(ctx).Session(&gorm.Session{SkipDefaultTransaction: true}).Model(&Order{}).
		Where("id = ? AND status = ? AND expires_at > ? AND expires_at < ? AND created_at >= ?",
			id, Pending, now, until, until.Add(-s.cfg.MaxHold))
	if userID != "" {
		q = q.Where("user_id = ?", userID)
	}
	if idemKey != "" {
		set["extend_key"] = idemKey
		q = q.Where("(extend_key IS NULL OR extend_key <> ?)", idemKey)
	}
	res := q.Updates(set)
	if res.Error != nil {
		return nil, false, res.Error
	}
	// As the projection stands: an order only the lean sale recorded is
	// not found here, and Extend projects it and runs again.
	o, err := s.get0(ctx, id)
	if err != nil {
		return nil, false, err
	}
	return o, res.RowsAffected == 1, nil
}

// whyNotExtended says why Extend changed nothing, from the order as it is
// now: nil when the answer is the order as it stands (a replay of the same
// key, or a deadline already later than asked).
func (s *Service) whyNotExtended(o *Order, userID, idemKey string, now, until time.Time) error {
	switch {
	case userID != "" && o.UserID != userID:
		return fmt.Errorf("%w: the order belongs to another buyer", inventory.ErrForbidden)
	case o.Status != Pending:
		return fmt.Errorf("%w: order %s is %s", inventory.ErrConflict, o.ID, o.Status)
	case idemKey != "" && o.ExtendKey != nil && *o.ExtendKey == idemKey:
		return nil // a replay: the deadline its first call set (or a later one)
	case !o.ExpiresAt.After(now):
		return fmt.Errorf("%w: order %s's hold ended at %s", inventory.ErrConflict, o.ID, o.ExpiresAt.Format(time.RFC3339))
	case !o.ExpiresAt.Before(until):
		return nil // it holds at least that long already
	case !o.CreatedAt.Before(until.Add(-s.cfg.MaxHold)):
		// Nothing refuses it: the UPDATE missed an order whose projection
		// (the lean sale's) was written before the read.
		return errRaced
	}
	return fmt.Errorf("%w: a hold can last at most %s from the order's creation (%s)", inventory.ErrConflict,
		s.cfg.MaxHold, o.CreatedAt.Add(s.cfg.MaxHold).Format(time.RFC3339))
}

// errRaced is an extension that nothing refused: run it again (a conflict
// if it happens twice).
var errRaced = fmt.Errorf("%w: the order changed during its extension; retry", inventory.ErrConflict)

// Pay records a successful payment: idempotent by payment id. A PENDING order
// becomes PAID: its reservations turn COMMITTED and one DEDUCT outbox row per
// line is written, in one transaction. An EXPIRED order re-reserves its lines
// in the database if the stock is still there (PAID) and otherwise becomes
// REFUND_REQUIRED; a CANCELLED order (the buyer cancelled) becomes
// REFUND_REQUIRED.
func (s *Service) Pay(ctx context.Context, id, paymentID string) (*Order, error) {
	return projected(ctx, s, id, func() (*Order, error) { return s.pay0(ctx, id, paymentID) })
}

// pay0 is Pay on the projection as it stands.
func (s *Service) pay0(ctx context.Context, id, paymentID string) (*Order, error) {
	if err := inventory.ValidateOrderID("order id", id); err != nil {
		return nil, err
	}
	if err := inventory.ValidatePaymentID(paymentID); err != nil {
		return nil, err
	}
	var chs []inventory.Change
	var before Status // what this call found, to count only a transition it made
	o, err := s.inTx(ctx, func(tx *gorm.DB) (*Order, error) {
		chs = nil
		o, done, err := s.lockForPayment(tx, id, paymentID, &before)
		if done || err != nil {
			return o, err
		}
		switch o.Status {
		case Pending:
			return s.markPaid(tx, o, paymentID, o.ReservationToken)
		case Expired:
			// The order's row lock serialises deliveries of one callback: only
			// one of them reserves again.
			token := o.ID + ".late"
			fences, err := s.reserveLate(tx, o, token)
			if err != nil {
				return nil, err // refused: rolled back; REFUND_REQUIRED below
			}
			chs = arbiter.Changes(lineQty(o), fences, -1)
			for i := range chs {
				if fences[chs[i].SKU].Limit > 0 { // counted against the buyer's limit again
					chs[i].Buyers = map[string]int64{o.UserID: -chs[i].Delta}
				}
			}
			return s.markPaid(tx, o, paymentID, token)
		case Cancelled:
			return s.refundRequired(tx, o, paymentID)
		}
		return nil, fmt.Errorf("%w: order %s is %s", inventory.ErrConflict, id, o.Status)
	})
	var refused arbiter.RefusedError
	var overLimit arbiter.OverLimitError
	if errors.As(err, &refused) || errors.As(err, &overLimit) {
		o, err = s.inTx(ctx, func(tx *gorm.DB) (*Order, error) {
			o, done, err := s.lockForPayment(tx, id, paymentID, &before)
			if done || err != nil {
				return o, err
			}
			if o.Status != Expired {
				return nil, fmt.Errorf("%w: order %s is %s", inventory.ErrConflict, id, o.Status)
			}
			return s.refundRequired(tx, o, paymentID)
		})
	}
	if err != nil {
		return nil, err
	}
	if o.Status != before {
		s.count(o.Status)
		if before == Pending {
			s.cfg.OnFinished(ctx, o)
		}
	}
	s.redis.Apply(ctx, chs)
	s.cfg.OnOutbox()
	return o, nil
}

// reserveLate reserves an expired order's lines again in the database alone,
// as COMMITTED reservations under token (Redis follows through Apply),
// counting them against the buyer's per-user limits again: refused
// (arbiter.RefusedError, arbiter.OverLimitError) when the stock or the limit is gone.
func (s *Service) reserveLate(tx *gorm.DB, o *Order, token string) (map[string]arbiter.Fence, error) {
	now := s.now()
	holds := make([]arbiter.Hold, len(o.Items))
	for i, it := range o.Items {
		holds[i] = arbiter.Hold{Buyer: o.UserID, Row: arbiter.Reservation{Token: token, SKU: it.SKU, OrderID: &o.ID, Qty: it.Qty,
			State: arbiter.Committed, ExpiresAt: o.ExpiresAt, CreatedAt: now, UpdatedAt: now}}
	}
	return arbiter.In(tx).Reserve(holds)
}

func lineQty(o *Order) map[string]int64 {
	out := make(map[string]int64, len(o.Items))
	for _, it := range o.Items {
		out[it.SKU] += it.Qty
	}
	return out
}

func (s *Service) refundRequired(tx *gorm.DB, o *Order, paymentID string) (*Order, error) {
	if err := s.recordPayment(tx, o, RefundRequired, map[string]any{"payment_id": paymentID, "paid_at": s.now()}); err != nil {
		return nil, err
	}
	return s.get(tx, o.ID, false)
}

// recordPayment moves o from its current status to to, with set (the
// payment's fields), conditionally.
func (s *Service) recordPayment(tx *gorm.DB, o *Order, to Status, set map[string]any) error {
	ok, err := s.transition(tx, o.ID, to, []Status{o.Status}, set)
	switch {
	case arbiter.IsDuplicate(err):
		return fmt.Errorf("%w: payment %s belongs to another order", inventory.ErrConflict, set["payment_id"])
	case err != nil:
		return err
	case !ok:
		return fmt.Errorf("%w: order %s changed concurrently", inventory.ErrConflict, o.ID)
	}
	return nil
}

// lockForPayment reads order id under its row lock, notes the status it
// found in before, and says whether a replayed callback is answered already
// (done, with the order or the conflict).
func (s *Service) lockForPayment(tx *gorm.DB, id, paymentID string, before *Status) (*Order, bool, error) {
	o, err := s.get(tx, id, true)
	if err != nil {
		return nil, true, err
	}
	*before = o.Status
	done, err := paidAlready(o, paymentID)
	return o, done, err
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
	return true, fmt.Errorf("%w: order %s was paid by another payment", inventory.ErrConflict, o.ID)
}

// markPaid moves o to PAID under token, commits token's held reservations
// (a late payment's are committed already) and writes the DEDUCT outbox rows,
// in tx.
func (s *Service) markPaid(tx *gorm.DB, o *Order, paymentID, token string) (*Order, error) {
	now := s.now()
	if err := s.recordPayment(tx, o, Paid, map[string]any{
		"payment_id": paymentID, "paid_at": now, "reservation_token": token,
	}); err != nil {
		return nil, err
	}
	commit := arbiter.In(tx).Commit
	if o.Status != Pending {
		commit = arbiter.In(tx).QueueDeducts // a late payment's reservations were made COMMITTED
	}
	if err := commit(token, o.Lines()); err != nil {
		return nil, err
	}
	o.Status, o.PaymentID, o.PaidAt, o.ReservationToken, o.UpdatedAt = Paid, &paymentID, &now, token, now
	return o, nil
}

// Refund moves a PAID order to REFUNDED and writes RESTORE outbox rows: the
// units come back to on_hand (and then to Redis) when the ordered consumer
// applies them, after their deduction. A REFUND_REQUIRED order (it never took
// stock) just becomes REFUNDED.
func (s *Service) Refund(ctx context.Context, id string) (*Order, error) {
	return projected(ctx, s, id, func() (*Order, error) { return s.refund0(ctx, id) })
}

// refund0 is Refund on the projection as it stands.
func (s *Service) refund0(ctx context.Context, id string) (*Order, error) {
	if err := inventory.ValidateOrderID("order id", id); err != nil {
		return nil, err
	}
	o, err := s.inTx(ctx, func(tx *gorm.DB) (*Order, error) {
		o, err := s.get(tx, id, true)
		if err != nil {
			return nil, err
		}
		if o.Status != Paid && o.Status != RefundRequired {
			return nil, fmt.Errorf("%w: order %s is %s", inventory.ErrConflict, id, o.Status)
		}
		if _, err := s.transition(tx, id, Refunded, []Status{o.Status}, nil); err != nil {
			return nil, err
		}
		if o.Status == Paid {
			if err := arbiter.In(tx).Refund(o.ReservationToken, o.Lines()); err != nil {
				return nil, err
			}
		}
		o.Status = Refunded
		return o, nil
	})
	if err != nil {
		return nil, err
	}
	s.count(Refunded)
	s.cfg.OnOutbox()
	return o, nil
}

// inTx runs fn in a transaction, retrying a few times on deadlock.
func (s *Service) inTx(ctx context.Context, fn func(tx *gorm.DB) (*Order, error)) (*Order, error) {
	return arbiter.RetryDeadlock(ctx, func() (*Order, error) {
		var out *Order
		err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			o, err := fn(tx)
			out = o
			return err
		})
		return out, err
	})
}

// Deadline is when order id expires, and whether it is PENDING (false also
// when there is no such order): what the delay queue needs to requeue an
// order claimed early.
func (s *Service) Deadline(ctx context.Context, id string) (time.Time, bool, error) {
	o, err := s.Get(ctx, id)
	if errors.Is(err, inventory.ErrNotFound) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, err
	}
	return o.ExpiresAt, o.Status == Pending, nil
}

// ExpiredIDs lists up to limit PENDING orders past their deadline, the
// earliest first: what the sweep expires.
func (s *Service) ExpiredIDs(ctx context.Context, limit int) ([]string, error) {
	// The lean holds past their deadline the projector has not written:
	// the sweep must not depend on it.
	if err := arbiter.Transact(ctx, s.db, func(tx *gorm.DB) error {
		_, err := arbiter.In(tx).ProjectExpired(s.now(), limit, limit)
		return err
	}); err != nil {
		return nil, err
	}
	var ids []string
	err := s.db.WithContext(ctx).Model(&Order{}).Where("status = ? AND expires_at <= ?", Pending, s.now()).
		Order("expires_at").Limit(limit).Pluck("id", &ids).Error
	return ids, err
}

var orderColumns = []string{"id", "user_id", "idempotency_key", "status", "reservation_token", "payment_id",
	"expires_at", "paid_at", "created_at", "updated_at"}

// orderRecord is o's row as the group commit writes it (record sets its
// times), its SQL written by the arbiter's InsertRows rather than
// reflected by GORM. An order's lines are not written apart: they are its reservations
// (LoadItems).
// keyRecord is the row of o's Idempotency-Key.
func keyRecord(o *Order) *groupcommit.Record {
	return &groupcommit.Record{Table: "idempotency_keys", Columns: keyColumns, Values: []any{o.UserID, *o.IdempotencyKey, o.ID, o.CreatedAt}}
}

var keyColumns = []string{"user_id", "idempotency_key", "order_id", "created_at"}

func orderRecord(o *Order) *groupcommit.Record {
	return &groupcommit.Record{Table: "orders", Columns: orderColumns, Values: []any{o.ID, o.UserID, o.IdempotencyKey,
		o.Status, o.ReservationToken, o.PaymentID, o.ExpiresAt, o.PaidAt, o.CreatedAt, o.UpdatedAt}}
}
