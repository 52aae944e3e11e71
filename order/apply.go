package order

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

	"github.com/acme/inventory/mq"
	"github.com/acme/inventory/stock"
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

// OpMalformed is the op of an anomaly recorded for a message that could not
// be decoded into a stock operation.
const OpMalformed Op = "MALFORMED"

// decode reads one message as a stock operation, or says why it cannot be
// one.
func decode(m mq.Message) (StockMessage, string) {
	var sm StockMessage
	switch err := json.Unmarshal(m.Body, &sm); {
	case err != nil:
		return sm, "not a JSON stock operation"
	case sm.Op != OpDeduct && sm.Op != OpRestore:
		return sm, "unknown op"
	case sm.Qty <= 0:
		return sm, "qty is not positive"
	case stock.ValidateSKU(sm.SKU) != nil:
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
func malformed(m mq.Message, why string) AnomalyRow {
	sum := sha256.Sum256(m.Body)
	sku := m.Key
	if stock.ValidateSKU(sku) != nil {
		sku = ""
	}
	body := m.Body[:min(len(m.Body), 96)]
	reason := fmt.Sprintf("malformed: %s; message %.40q; body %s", why, m.ID, strconv.QuoteToASCII(string(body)))
	return AnomalyRow{Token: "malformed:" + hex.EncodeToString(sum[:20]), SKU: sku, Op: OpMalformed, Reason: reason[:min(len(reason), 255)]}
}

// Handle applies one delivery (consecutive messages of one queue) in one
// transaction.
func (a *Applier) Handle(ctx context.Context, msgs []mq.Message) error {
	bySKU := map[string][]StockMessage{}
	var skus []string
	var bad []AnomalyRow
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
	var recorded []AnomalyRow
	var chs []stock.Change
	_, err := retryDeadlock(func() (struct{}, error) {
		applied, dup, recorded, chs = 0, 0, nil, nil
		return struct{}{}, a.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			d, err := a.apply(tx, skus, bySKU)
			if err != nil {
				return err
			}
			if anomalies := append(d.anomalies, bad...); len(anomalies) > 0 {
				if err := tx.Clauses(clause.OnConflict{DoNothing: true}).Create(&anomalies).Error; err != nil {
					return err
				}
			}
			if a.beforeCommit != nil {
				if err := a.beforeCommit(); err != nil {
					return err
				}
			}
			applied, dup, recorded, chs = d.applied, d.duplicate, d.anomalies, d.changes
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

// delivery is what one delivery's transaction did.
type delivery struct {
	applied, duplicate int64
	anomalies          []AnomalyRow
	changes            []stock.Change // restores, for Redis
}

// apply applies the well-formed operations of a delivery in tx: under the
// SKU rows' locks (taken in SKU order), each operation is decided by its
// reservation's state, then one UPDATE per SKU and per state change writes
// the merged effect.
func (a *Applier) apply(tx *gorm.DB, skus []string, bySKU map[string][]StockMessage) (delivery, error) {
	var d delivery
	if len(skus) == 0 {
		return d, nil
	}
	var rows []struct {
		SKU    string `gorm:"column:sku"`
		OnHand int64
	}
	if err := tx.Table("skus").Select("sku, on_hand").Where("sku IN ?", skus).Order("sku").
		Clauses(clause.Locking{Strength: "UPDATE"}).Scan(&rows).Error; err != nil {
		return d, err
	}
	onHand := map[string]int64{}
	for _, r := range rows {
		onHand[r.SKU] = r.OnHand
	}
	recorded, err := recordedAnomalies(tx, skus, bySKU)
	if err != nil {
		return d, err
	}
	var ledger []LedgerRow
	var moves []Movement
	restored := map[string]int64{}
	for _, sku := range skus {
		oh, known := onHand[sku]
		states, err := reservationsOf(tx, sku, bySKU[sku])
		if err != nil {
			return d, err
		}
		var sold, back []string
		var deducted, returned int64
		for _, sm := range bySKU[sku] {
			k := opKey{sm.Token, sku, sm.Op}
			if recorded[k] {
				d.duplicate++ // recorded as an anomaly before: handled
				continue
			}
			res, ok := states[sm.Token]
			reason := ""
			switch {
			case !known:
				reason = "unknown sku"
			case sm.Op == OpDeduct && ok && res.Qty == sm.Qty && (res.State == Sold || res.State == Restored):
				d.duplicate++
				continue
			case sm.Op == OpRestore && ok && res.Qty == sm.Qty && res.State == Restored:
				d.duplicate++
				continue
			case sm.Op == OpDeduct && !(ok && res.Qty == sm.Qty && res.State == Committed):
				reason = "no committed reservation of this quantity"
			case sm.Op == OpRestore && !(ok && res.Qty == sm.Qty && res.State == Sold):
				reason = "restore without its deduction"
			}
			if reason != "" {
				d.anomalies = append(d.anomalies, AnomalyRow{Token: sm.Token, SKU: sku, Op: sm.Op, Qty: sm.Qty, OnHand: oh, Reason: reason})
				recorded[k] = true
				continue
			}
			if sm.Op == OpDeduct {
				res.State = Sold
				sold = append(sold, sm.Token)
				deducted += sm.Qty
			} else {
				res.State = Restored
				back = append(back, sm.Token)
				returned += sm.Qty
			}
			states[sm.Token] = res
			ledger = append(ledger, LedgerRow{Token: sm.Token, SKU: sku, Op: sm.Op, Qty: sm.Qty})
			moves = append(moves, appliedMovement(sku, oh, sm))
		}
		if err := applySKU(tx, sku, oh, sold, back, deducted, returned); err != nil {
			return d, err
		}
		if returned > 0 && oh != stock.Unlimited {
			restored[sku] = returned
		}
	}
	if len(ledger) > 0 {
		if err := tx.Clauses(clause.OnConflict{DoNothing: true}).Create(&ledger).Error; err != nil {
			return d, err
		}
	}
	if err := insertMovements(tx, moves); err != nil {
		return d, err
	}
	if err := markApplied(tx, skus, bySKU); err != nil {
		return d, err
	}
	if len(restored) > 0 {
		marks, err := readMarks(tx, sortedKeys(restored))
		if err != nil {
			return d, err
		}
		d.changes = changes(restored, marks, 1)
	}
	d.applied = int64(len(ledger))
	return d, nil
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

// reservationsOf returns the reservations of sku that the delivery's
// operations name, by token. Read under the SKU's row lock: only an applier
// (holding it) moves a reservation out of COMMITTED or SOLD.
func reservationsOf(tx *gorm.DB, sku string, msgs []StockMessage) (map[string]Reservation, error) {
	tokens := make([]string, 0, len(msgs))
	for _, sm := range msgs {
		tokens = append(tokens, sm.Token)
	}
	// By primary key only: with the state in the WHERE, MariaDB picks the
	// (sku, state) prefix and walks every committed row of a hot SKU.
	var rows []Reservation
	if err := tx.Where("token IN ? AND sku = ?", tokens, sku).Find(&rows).Error; err != nil {
		return nil, err
	}
	out := make(map[string]Reservation, len(rows))
	for _, r := range rows {
		out[r.Token] = r
	}
	return out, nil
}

// applySKU writes one SKU's merged effect: the sold reservations turn SOLD
// and the restored ones RESTORED (each conditionally, from the state read
// under the row lock), on_hand and reserved lose what was deducted, on_hand
// gains what was restored (an unlimited SKU's on_hand stays -1).
func applySKU(tx *gorm.DB, sku string, onHand int64, sold, back []string, deducted, returned int64) error {
	for _, step := range []struct {
		tokens   []string
		from, to ResState
	}{{sold, Committed, Sold}, {back, Sold, Restored}} {
		if len(step.tokens) == 0 {
			continue
		}
		res := tx.Model(&Reservation{}).Where("token IN ? AND sku = ? AND state = ?", step.tokens, sku, step.from).Update("state", step.to)
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected != int64(len(step.tokens)) {
			return fmt.Errorf("apply: %s: %d of %d reservations turned %s", sku, res.RowsAffected, len(step.tokens), step.to)
		}
	}
	if deducted == 0 && returned == 0 {
		return nil
	}
	if onHand == stock.Unlimited {
		return tx.Exec(`UPDATE skus SET reserved = reserved - ? WHERE sku = ?`, deducted, sku).Error
	}
	return tx.Exec(`UPDATE skus SET on_hand = on_hand - ? + ?, reserved = reserved - ?, seq = seq + ? WHERE sku = ?`,
		deducted, returned, deducted, min(returned, 1), sku).Error
}

// recordedAnomalies returns the delivery's operations already recorded as
// anomalies: handled, not to be recorded or applied again.
func recordedAnomalies(tx *gorm.DB, skus []string, bySKU map[string][]StockMessage) (map[opKey]bool, error) {
	var tokens []string
	for _, sku := range skus {
		for _, sm := range bySKU[sku] {
			tokens = append(tokens, sm.Token)
		}
	}
	var rows []struct {
		Token string `gorm:"column:token"`
		SKU   string `gorm:"column:sku"`
		Op    Op
	}
	if err := tx.Raw(`SELECT token, sku, op FROM stock_anomalies WHERE sku IN ? AND token IN ?`, skus, tokens).
		Scan(&rows).Error; err != nil {
		return nil, err
	}
	done := make(map[opKey]bool, len(rows))
	for _, r := range rows {
		done[opKey{r.Token, r.SKU, r.Op}] = true
	}
	return done, nil
}
