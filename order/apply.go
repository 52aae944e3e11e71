package order

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/acme/inventory/mq"
	"github.com/acme/inventory/stock"
)

// Applier is the mq.Handler that applies stock operations to the database
// exactly once in effect: every (token, SKU, op) gets a unique ledger row (and
// its stock movement) in the same transaction as the SKU's UPDATE, so a
// redelivered or duplicated message finds its row and changes nothing.
// Consecutive operations of one SKU in a delivery are merged into one UPDATE.
//
// DEDUCT turns a COMMITTED reservation SOLD and takes its units from on_hand
// and reserved together (available does not move). RESTORE (a refund) adds
// the units back to on_hand, only after its DEDUCT applied, and then to
// Redis. Anything else (no committed reservation, a restore without its
// deduction, an unknown SKU) is recorded in stock_anomalies, not applied, not
// dropped.
type Applier struct {
	db  *gorm.DB
	log *slog.Logger
	// OnApplied is told the changes of available units a delivery committed
	// (restores), to bring them into Redis. Its ctx is not cancelled by the
	// consumer stopping.
	OnApplied func(ctx context.Context, chs []stock.Change)
	// beforeCommit, in tests, runs inside the transaction after the UPDATEs;
	// an error rolls everything back, as a crash would.
	beforeCommit func() error

	Applied   atomic.Int64 // operations applied
	Duplicate atomic.Int64 // operations found already applied
	Anomalies atomic.Int64 // operations recorded as anomalies
	Malformed atomic.Int64 // messages that could not be decoded
}

func NewApplier(db *gorm.DB, log *slog.Logger) *Applier {
	if log == nil {
		log = slog.Default()
	}
	return &Applier{db: db, log: log, OnApplied: func(context.Context, []stock.Change) {}}
}

// LedgerRow is one applied operation.
type LedgerRow struct {
	ID    int64  `gorm:"primaryKey"`
	Token string `gorm:"column:token"`
	SKU   string `gorm:"column:sku"`
	Op    Op     `gorm:"column:op"`
	Qty   int64  `gorm:"column:qty"`
}

func (LedgerRow) TableName() string { return "stock_ledger" }

// AnomalyRow is an operation the applier refused.
type AnomalyRow struct {
	ID     int64  `gorm:"primaryKey"`
	Token  string `gorm:"column:token"`
	SKU    string `gorm:"column:sku"`
	Op     Op     `gorm:"column:op"`
	Qty    int64  `gorm:"column:qty"`
	OnHand int64  `gorm:"column:on_hand"`
	Reason string `gorm:"column:reason"`
}

func (AnomalyRow) TableName() string { return "stock_anomalies" }

type opKey struct {
	token, sku string
	op         Op
}

// Handle applies one delivery (consecutive messages of one queue) in one
// transaction.
func (a *Applier) Handle(ctx context.Context, msgs []mq.Message) error {
	bySKU := map[string][]StockMessage{}
	var skus []string
	for _, m := range msgs {
		var sm StockMessage
		if err := json.Unmarshal(m.Body, &sm); err != nil || sm.Qty <= 0 || stock.ValidateSKU(sm.SKU) != nil ||
			(sm.Op != OpDeduct && sm.Op != OpRestore) || sm.Token == "" {
			// Not ours to apply and impossible to retry into sense: report it loudly.
			a.Malformed.Add(1)
			a.log.Error("apply: malformed stock message skipped", "id", m.ID, "key", m.Key)
			continue
		}
		if _, ok := bySKU[sm.SKU]; !ok {
			skus = append(skus, sm.SKU)
		}
		bySKU[sm.SKU] = append(bySKU[sm.SKU], sm)
	}
	if len(skus) == 0 {
		return nil
	}
	slices.Sort(skus) // lock rows in one order: no deadlock between appliers

	var applied, dup int64
	var recorded []AnomalyRow
	var chs []stock.Change
	_, err := retryDeadlock(func() (struct{}, error) {
		applied, dup, recorded, chs = 0, 0, nil, nil
		return struct{}{}, a.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			var rows []struct {
				SKU    string `gorm:"column:sku"`
				OnHand int64
			}
			if err := tx.Table("skus").Select("sku, on_hand").Where("sku IN ?", skus).Order("sku").
				Clauses(clause.Locking{Strength: "UPDATE"}).Scan(&rows).Error; err != nil {
				return err
			}
			onHand := map[string]int64{}
			for _, r := range rows {
				onHand[r.SKU] = r.OnHand
			}
			done, err := a.seen(tx, skus, bySKU)
			if err != nil {
				return err
			}
			var ledger []LedgerRow
			var moves []Movement
			var anomaly []AnomalyRow
			restored := map[string]int64{}
			for _, sku := range skus {
				oh, known := onHand[sku]
				committed, err := committedQty(tx, sku, bySKU[sku])
				if err != nil {
					return err
				}
				var sold []string
				var deducted, back int64
				for _, sm := range bySKU[sku] {
					k := opKey{sm.Token, sku, sm.Op}
					if done[k] {
						dup++
						continue
					}
					done[k] = true
					reason := ""
					switch {
					case !known:
						reason = "unknown sku"
					case sm.Op == OpDeduct && committed[sm.Token] != sm.Qty:
						reason = "no committed reservation of this quantity"
					case sm.Op == OpRestore && !deductedOnce(done, sm.Token, sku):
						reason = "restore without its deduction"
					}
					if reason != "" {
						anomaly = append(anomaly, AnomalyRow{Token: sm.Token, SKU: sku, Op: sm.Op, Qty: sm.Qty, OnHand: oh, Reason: reason})
						done[opKey{sm.Token, sku, "X" + sm.Op}] = true // an anomaly, not an application
						continue
					}
					if sm.Op == OpDeduct {
						sold = append(sold, sm.Token)
						delete(committed, sm.Token)
						deducted += sm.Qty
					} else {
						back += sm.Qty
					}
					ledger = append(ledger, LedgerRow{Token: sm.Token, SKU: sku, Op: sm.Op, Qty: sm.Qty})
					moves = append(moves, appliedMovement(sku, oh, sm))
				}
				if err := applySKU(tx, sku, oh, sold, deducted, back); err != nil {
					return err
				}
				if back > 0 && oh != stock.Unlimited {
					restored[sku] = back
				}
			}
			if len(ledger) > 0 {
				if err := tx.Create(&ledger).Error; err != nil {
					return err
				}
			}
			if err := insertMovements(tx, moves); err != nil {
				return err
			}
			if len(anomaly) > 0 {
				if err := tx.Clauses(clause.OnConflict{DoNothing: true}).Create(&anomaly).Error; err != nil {
					return err
				}
			}
			if err := markApplied(tx, skus, bySKU); err != nil {
				return err
			}
			if len(restored) > 0 {
				marks, err := readMarks(tx, sortedKeys(restored))
				if err != nil {
					return err
				}
				chs = changes(restored, marks, 1)
			}
			if a.beforeCommit != nil {
				if err := a.beforeCommit(); err != nil {
					return err
				}
			}
			applied, recorded = int64(len(ledger)), anomaly
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
	for _, an := range recorded {
		a.log.Error("apply: stock anomaly recorded", "token", an.Token, "sku", an.SKU, "op", an.Op,
			"qty", an.Qty, "on_hand", an.OnHand, "reason", an.Reason)
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
// duplicate or anomaly: each is handled) as applied, so the sync backlog is
// read from the unapplied rows alone. One UPDATE per delivery.
func markApplied(tx *gorm.DB, skus []string, bySKU map[string][]StockMessage) error {
	var keys [][]any
	for _, sku := range skus {
		for _, sm := range bySKU[sku] {
			keys = append(keys, []any{sm.Token, sm.SKU, sm.Op})
		}
	}
	return tx.Exec(`UPDATE stock_outbox SET applied_at = ? WHERE applied_at IS NULL AND (token, sku, op) IN ?`,
		time.Now().UTC(), keys).Error
}

// appliedMovement is the movement of one applied operation, as applySKU
// moves the SKU: a sale takes qty from on_hand and reserved, a refund gives
// qty back to on_hand; an unlimited SKU's on_hand (-1) does not move.
func appliedMovement(sku string, onHand int64, sm StockMessage) Movement {
	m := Movement{SKU: sku, Kind: MoveSale, OnHandDelta: -sm.Qty, ReservedDelta: -sm.Qty, Reference: tokenRef(sm.Token)}
	if sm.Op == OpRestore {
		m.Kind, m.OnHandDelta, m.ReservedDelta = MoveRefund, sm.Qty, 0
	}
	if onHand == stock.Unlimited {
		m.OnHandDelta = 0
	}
	return m
}

// deductedOnce reports whether token's DEDUCT of sku is applied (in the
// ledger, or earlier in this delivery) and not an anomaly.
func deductedOnce(done map[opKey]bool, token, sku string) bool {
	return done[opKey{token, sku, OpDeduct}] && !done[opKey{token, sku, "X" + OpDeduct}]
}

// committedQty returns the qty of the COMMITTED reservations of sku among the
// delivery's DEDUCT tokens. Read under the SKU's row lock: only an applier
// (holding it) moves a reservation out of COMMITTED.
func committedQty(tx *gorm.DB, sku string, msgs []StockMessage) (map[string]int64, error) {
	var tokens []string
	for _, sm := range msgs {
		if sm.Op == OpDeduct {
			tokens = append(tokens, sm.Token)
		}
	}
	out := map[string]int64{}
	if len(tokens) == 0 {
		return out, nil
	}
	// By primary key only: with the state in the WHERE, MariaDB picks the
	// (sku, state) prefix and walks every committed row of a hot SKU.
	var rows []Reservation
	if err := tx.Where("token IN ? AND sku = ?", tokens, sku).Find(&rows).Error; err != nil {
		return nil, err
	}
	for _, r := range rows {
		if r.State == Committed {
			out[r.Token] = r.Qty
		}
	}
	return out, nil
}

// applySKU writes one SKU's merged effect: the sold reservations turn SOLD,
// on_hand and reserved lose what was deducted, on_hand gains what was
// restored (an unlimited SKU's on_hand stays -1).
func applySKU(tx *gorm.DB, sku string, onHand int64, sold []string, deducted, back int64) error {
	if len(sold) > 0 {
		res := tx.Model(&Reservation{}).Where("token IN ? AND sku = ? AND state = ?", sold, sku, Committed).Update("state", Sold)
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected != int64(len(sold)) {
			return fmt.Errorf("apply: %s: %d of %d reservations turned SOLD", sku, res.RowsAffected, len(sold))
		}
	}
	if deducted == 0 && back == 0 {
		return nil
	}
	if onHand == stock.Unlimited {
		return tx.Exec(`UPDATE skus SET reserved = reserved - ? WHERE sku = ?`, deducted, sku).Error
	}
	return tx.Exec(`UPDATE skus SET on_hand = on_hand - ? + ?, reserved = reserved - ?, seq = seq + ? WHERE sku = ?`,
		deducted, back, deducted, min(back, 1), sku).Error
}

// seen returns the operations of this delivery already in the ledger, and
// those recorded as anomalies (keyed "X" + op), read under the SKU row locks
// so no other applier adds any.
func (a *Applier) seen(tx *gorm.DB, skus []string, bySKU map[string][]StockMessage) (map[opKey]bool, error) {
	var tokens []string
	for _, sku := range skus {
		for _, sm := range bySKU[sku] {
			tokens = append(tokens, sm.Token)
		}
	}
	done := map[opKey]bool{}
	for _, table := range []string{"stock_ledger", "stock_anomalies"} {
		var rows []struct {
			Token string `gorm:"column:token"`
			SKU   string `gorm:"column:sku"`
			Op    Op
		}
		if err := tx.Raw(`SELECT token, sku, op FROM `+table+` WHERE sku IN ? AND token IN ?`, skus, tokens).
			Scan(&rows).Error; err != nil {
			return nil, err
		}
		for _, r := range rows {
			done[opKey{r.Token, r.SKU, r.Op}] = true
			if table == "stock_anomalies" {
				done[opKey{r.Token, r.SKU, "X" + r.Op}] = true
			}
		}
	}
	return done, nil
}
