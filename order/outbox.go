package order

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/acme/inventory/mq"
	"github.com/acme/inventory/stock"
)

// OutboxRow is a stock operation waiting to be published; written in the
// transaction of the order transition that causes it.
type OutboxRow struct {
	ID        int64      `gorm:"primaryKey"`
	Token     string     `gorm:"column:token"` // the reservation's token
	SKU       string     `gorm:"column:sku"`
	Op        Op         `gorm:"column:op"`
	Qty       int64      `gorm:"column:qty"`
	CreatedAt time.Time  `gorm:"column:created_at;autoCreateTime:false;default:CURRENT_TIMESTAMP(6)"`
	SentAt    *time.Time `gorm:"column:sent_at"`
}

func (OutboxRow) TableName() string { return "stock_outbox" }

// StockMessage is the body of one message on the ordered topic (key = SKU):
// an operation on the reservation (Token, SKU).
type StockMessage struct {
	Token string `json:"token"`
	SKU   string `json:"sku"`
	Op    Op     `json:"op"`
	Qty   int64  `json:"qty"`
}

// RelayConfig tunes a Relay.
type RelayConfig struct {
	// Interval between polls when nothing wakes the relay. Default 200ms.
	Interval time.Duration
	// Batch bounds the rows read per round. Default 200.
	Batch int
	// LockTTL is the single-runner lock's expiry (renewed while running). Default 10s.
	LockTTL time.Duration
	Logger  *slog.Logger
	// afterSend, in tests, runs after each send and before the row is marked
	// sent; an error stops the round there, as a crash would.
	afterSend func(row OutboxRow) error
}

// Relay publishes outbox rows in id order to the ordered topic, on one node at
// a time (a distributed lock, renewed while it runs). A crash between the send
// and marking the row sent sends it again later: the consumer's ledger makes
// that harmless. A row is never sent before its transaction commits.
type Relay struct {
	db       *gorm.DB
	producer mq.Producer
	locker   *stock.Locker
	cfg      RelayConfig
	wake     chan struct{}
	run      runner

	// Sent counts the messages this relay published.
	Sent atomic.Int64
}

const relayLockKey = "inv:{relay}:lock"

func NewRelay(db *gorm.DB, p mq.Producer, locker *stock.Locker, cfg RelayConfig) *Relay {
	if cfg.Interval <= 0 {
		cfg.Interval = 200 * time.Millisecond
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 200
	}
	if cfg.LockTTL <= 0 {
		cfg.LockTTL = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Relay{db: db, producer: p, locker: locker, cfg: cfg, wake: make(chan struct{}, 1)}
}

// Wake makes the relay look at the outbox now (after a commit).
func (r *Relay) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Start runs the relay until Stop; a second Start is a no-op.
func (r *Relay) Start(ctx context.Context) { r.run.start(ctx, r.loop) }

// Stop ends the relay and waits for it; safe before Start and twice.
func (r *Relay) Stop() { r.run.stop() }

func (r *Relay) loop(ctx context.Context) {
	for ctx.Err() == nil {
		lock, err := r.locker.Obtain(ctx, relayLockKey, r.cfg.LockTTL, 0)
		if err != nil {
			if !errors.Is(err, stock.ErrLockNotObtained) && ctx.Err() == nil {
				r.cfg.Logger.Warn("relay: lock", "err", err)
			}
			r.sleep(ctx, r.cfg.LockTTL/2+rand.N(r.cfg.LockTTL/4)) // another node relays
			continue
		}
		r.lead(ctx, lock)
		_ = lock.Release(context.WithoutCancel(ctx))
	}
}

// lead relays while this node holds the lock.
func (r *Relay) lead(ctx context.Context, lock *stock.Lock) {
	lost, stop := lock.KeepAlive(ctx, r.cfg.LockTTL)
	defer stop()
	backoff := r.cfg.Interval
	for {
		select {
		case <-lost:
			r.cfg.Logger.Warn("relay: lost the lock; another node takes over")
			return
		default:
		}
		n, err := r.RelayOnce(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			r.cfg.Logger.Warn("relay: round failed", "err", err)
			backoff = min(2*backoff, 5*time.Second)
			r.sleep(ctx, backoff/2+rand.N(backoff/2))
			continue
		case n == r.cfg.Batch:
			continue // more waiting
		}
		backoff = r.cfg.Interval
		select {
		case <-ctx.Done():
			return
		case <-lost:
			return
		case <-r.wake:
		case <-time.After(r.cfg.Interval):
		}
	}
}

func (r *Relay) sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-r.wake:
	case <-time.After(d):
	}
}

// maxRun bounds the messages of one send request.
const maxRun = 128

// runsBySKU groups rows (in id order) by SKU, keeping id order within each
// SKU, in chunks of at most maxRun.
func runsBySKU(rows []OutboxRow) [][]OutboxRow {
	var order []string
	by := map[string][]OutboxRow{}
	for _, row := range rows {
		if _, ok := by[row.SKU]; !ok {
			order = append(order, row.SKU)
		}
		by[row.SKU] = append(by[row.SKU], row)
	}
	var runs [][]OutboxRow
	for _, sku := range order {
		for rs := by[sku]; len(rs) > 0; {
			n := min(len(rs), maxRun)
			runs = append(runs, rs[:n])
			rs = rs[n:]
		}
	}
	return runs
}

// RelayOnce sends up to one batch of unsent rows in id order and marks them
// sent; it returns how many it sent.
func (r *Relay) RelayOnce(ctx context.Context) (int, error) {
	var rows []OutboxRow
	if err := r.db.WithContext(ctx).Where("sent_at IS NULL").Order("id").Limit(r.cfg.Batch).Find(&rows).Error; err != nil {
		return 0, err
	}
	// One request per SKU run: rows of one SKU go out together, in id order,
	// on that SKU's queue. Rows of a SKU never pass each other: a SKU's rows
	// are sent in one request, and a failed send stops the round.
	sent := make([]int64, 0, len(rows))
	var serr error
	for _, run := range runsBySKU(rows) {
		msgs := make([]mq.Message, len(run))
		for i, row := range run {
			body, _ := json.Marshal(StockMessage{Token: row.Token, SKU: row.SKU, Op: row.Op, Qty: row.Qty})
			msgs[i] = mq.Message{Key: row.SKU, Body: body}
		}
		if serr = r.producer.Send(ctx, msgs...); serr != nil {
			break
		}
		if r.cfg.afterSend != nil {
			if serr = r.cfg.afterSend(run[0]); serr != nil {
				return len(sent), serr // "crash": the sent rows stay unmarked
			}
		}
		for _, row := range run {
			sent = append(sent, row.ID)
		}
		r.Sent.Add(int64(len(run)))
	}
	if len(sent) > 0 {
		if err := r.db.WithContext(ctx).Model(&OutboxRow{}).Where("id IN ?", sent).
			Update("sent_at", time.Now().UTC()).Error; err != nil {
			return 0, fmt.Errorf("relay: marking sent: %w", err)
		}
	}
	return len(sent), serr
}
