package stocksync

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/mq"
)

// Applier is the mq.Handler that applies stock operations to the database
// exactly once in effect. Whether an operation was applied is read from the
// reservation's state, which retention never prunes: a DEDUCT turns a
// COMMITTED reservation SOLD, a RESTORE (a refund) turns a SOLD one RESTORED,
// each under a conditional UPDATE in the transaction of the SKU's UPDATE, so
// a redelivered or duplicated message, however late, finds the state already
// moved and changes nothing. Each application also writes a ledger row and a
// stock movement (the audit trail; retention prunes both).
// Consecutive operations of one SKU in a delivery are merged into one UPDATE.
//
// DEDUCT takes the units from on_hand and reserved together (available does
// not move). RESTORE adds them back to on_hand, and then to Redis. Anything
// else (no committed reservation of that quantity, a restore of a
// reservation never sold, an unknown SKU, a message that cannot be decoded)
// is recorded in stock_anomalies, not applied, not dropped, and reconcile
// reports it.
type Applier struct {
	db  *gorm.DB
	log *slog.Logger
	// OnApplied is told the changes of available units a delivery committed
	// (restores), to bring them into Redis. Its ctx is not cancelled by the
	// consumer stopping.
	OnApplied func(ctx context.Context, chs []inventory.Change)
	// BeforeCommit, for fault-injection tests, runs inside the transaction after the UPDATEs;
	// an error rolls everything back, as a crash would.
	BeforeCommit func() error

	Applied   atomic.Int64 // operations applied
	Duplicate atomic.Int64 // operations found already applied
	Anomalies atomic.Int64 // operations recorded as anomalies
	Malformed atomic.Int64 // messages that could not be decoded
}

func NewApplier(db *gorm.DB, log *slog.Logger) *Applier {
	if log == nil {
		log = slog.Default()
	}
	return &Applier{db: db, log: log, OnApplied: func(context.Context, []inventory.Change) {}}
}

// decode reads one message as a stock operation, or says why it cannot be
// one.
func decode(m mq.Message) (arbiter.StockMessage, string) {
	var sm arbiter.StockMessage
	switch err := json.Unmarshal(m.Body, &sm); {
	case err != nil:
		return sm, "not a JSON stock operation"
	case sm.Op != arbiter.OpDeduct && sm.Op != arbiter.OpRestore:
		return sm, "unknown op"
	case sm.Qty <= 0:
		return sm, "qty is not positive"
	case inventory.ValidateSKU(sm.SKU) != nil:
		return sm, "invalid sku"
	case sm.Token == "" || len(sm.Token) > maxTokenLen:
		return sm, "invalid token"
	}
	return sm, ""
}

// maxTokenLen is the longest reservation token a row holds.
const maxTokenLen = 140

// malformed is the anomaly row of a message that is no stock operation:
// keyed by a digest of its body (a redelivery is recorded once), under its
// queue key when that names a SKU, with the reason and the body's start.
func malformed(m mq.Message, why string) arbiter.AnomalyRow {
	sum := sha256.Sum256(m.Body)
	sku := m.Key
	if inventory.ValidateSKU(sku) != nil {
		sku = ""
	}
	body := m.Body[:min(len(m.Body), 96)]
	reason := fmt.Sprintf("malformed: %s; message %.40q; body %s", why, m.ID, strconv.QuoteToASCII(string(body)))
	return arbiter.AnomalyRow{Token: "malformed:" + hex.EncodeToString(sum[:20]), SKU: sku, Op: arbiter.OpMalformed, Reason: reason[:min(len(reason), 255)]}
}

// Handle applies one delivery (consecutive messages of one queue) in one
// transaction.
func (a *Applier) Handle(ctx context.Context, msgs []mq.Message) error {
	bySKU := map[string][]arbiter.StockMessage{}
	var skus []string
	var bad []arbiter.AnomalyRow
	for _, m := range msgs {
		sm, why := decode(m)
		if why != "" {
			bad = append(bad, malformed(m, why))
			continue
		}
		if _, ok := bySKU[sm.SKU]; !ok {
			skus = append(skus, sm.SKU)
		}
		bySKU[sm.SKU] = append(bySKU[sm.SKU], sm)
	}
	if len(skus) == 0 && len(bad) == 0 {
		return nil
	}
	slices.Sort(skus) // lock rows in one order: no deadlock between appliers

	var applied, dup int64
	var recorded []arbiter.AnomalyRow
	var chs []inventory.Change
	_, err := arbiter.RetryDeadlock(ctx, func() (struct{}, error) {
		applied, dup, recorded, chs = 0, 0, nil, nil
		return struct{}{}, a.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			d, err := arbiter.In(tx).Settle(skus, bySKU)
			if err != nil {
				return err
			}
			if err := markApplied(tx, skus, bySKU); err != nil {
				return err
			}
			if anomalies := append(d.Anomalies, bad...); len(anomalies) > 0 {
				if err := tx.Clauses(clause.OnConflict{DoNothing: true}).Create(&anomalies).Error; err != nil {
					return err
				}
			}
			if a.BeforeCommit != nil {
				if err := a.BeforeCommit(); err != nil {
					return err
				}
			}
			applied, dup, recorded, chs = d.Applied, d.Duplicate, d.Anomalies, d.Changes
			return nil
		})
	})
	if err != nil {
		if ctx.Err() == nil {
			a.log.Warn("apply: delivery failed; it will be redelivered", "messages", len(msgs), "err", err)
		}
		return err
	}
	a.Applied.Add(applied)
	a.Duplicate.Add(dup)
	a.Anomalies.Add(int64(len(recorded)))
	a.Malformed.Add(int64(len(bad)))
	for _, an := range recorded {
		a.log.Error("apply: stock anomaly recorded", "token", an.Token, "sku", an.SKU, "op", an.Op,
			"qty", an.Qty, "on_hand", an.OnHand, "reason", an.Reason)
	}
	for _, an := range bad {
		a.log.Error("apply: malformed stock message recorded as an anomaly", "key", an.SKU, "reason", an.Reason)
	}
	if len(chs) > 0 {
		// The delivery is committed: its follow-up into Redis must not be cut
		// short by the consumer's shutdown cancelling ctx (Redis would stay
		// below the database until the next realign).
		a.OnApplied(context.WithoutCancel(ctx), chs)
	}
	return nil
}

// markApplied stamps the outbox rows of the delivery's operations (applied,
// duplicate or anomaly: each is handled) as applied, in one UPDATE.
func markApplied(tx *gorm.DB, skus []string, bySKU map[string][]arbiter.StockMessage) error {
	var msgs []arbiter.StockMessage
	for _, sku := range skus {
		msgs = append(msgs, bySKU[sku]...)
	}
	return arbiter.OutboxOf(tx).MarkApplied(msgs, time.Now().UTC())
}
