package order

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"sync/atomic"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/acme/inventory/mq"
	"github.com/acme/inventory/stock"
)

// Applier is the mq.Handler that applies stock operations to skus.stock
// exactly once in effect: every (order, SKU, op) gets a unique ledger row in
// the same transaction as the stock UPDATE, so a redelivered or duplicated
// message finds its row and changes nothing. Consecutive operations of one SKU
// in a delivery are merged into one UPDATE. A DEDUCT that would take the
// stock below zero is recorded in stock_anomalies (and counted), not applied,
// not dropped.
type Applier struct {
	db  *gorm.DB
	log *slog.Logger
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
	return &Applier{db: db, log: log}
}

// LedgerRow is one applied operation.
type LedgerRow struct {
	ID      int64  `gorm:"primaryKey"`
	OrderID string `gorm:"column:order_id"`
	SKU     string `gorm:"column:sku"`
	Op      Op     `gorm:"column:op"`
	Qty     int64  `gorm:"column:qty"`
}

func (LedgerRow) TableName() string { return "stock_ledger" }

// AnomalyRow is an operation the applier refused.
type AnomalyRow struct {
	ID      int64  `gorm:"primaryKey"`
	OrderID string `gorm:"column:order_id"`
	SKU     string `gorm:"column:sku"`
	Op      Op     `gorm:"column:op"`
	Qty     int64  `gorm:"column:qty"`
	DBStock int64  `gorm:"column:db_stock"`
	Reason  string `gorm:"column:reason"`
}

func (AnomalyRow) TableName() string { return "stock_anomalies" }

type opKey struct {
	order, sku string
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
			(sm.Op != OpDeduct && sm.Op != OpRestore) || sm.OrderID == "" {
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
	_, err := retryDeadlock(func() (struct{}, error) {
		applied, dup, recorded = 0, 0, nil
		return struct{}{}, a.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			var rows []struct {
				SKU   string `gorm:"column:sku"`
				Stock int64
			}
			if err := tx.Table("skus").Select("sku, stock").Where("sku IN ?", skus).Order("sku").
				Clauses(clause.Locking{Strength: "UPDATE"}).Scan(&rows).Error; err != nil {
				return err
			}
			current := map[string]int64{}
			for _, r := range rows {
				current[r.SKU] = r.Stock
			}
			done, err := a.seen(tx, skus, bySKU)
			if err != nil {
				return err
			}
			var ledger []LedgerRow
			var anomaly []AnomalyRow
			for _, sku := range skus {
				st, known := current[sku]
				delta := int64(0)
				for _, sm := range bySKU[sku] {
					k := opKey{sm.OrderID, sku, sm.Op}
					if done[k] {
						dup++
						continue
					}
					done[k] = true
					switch {
					case !known:
						anomaly = append(anomaly, AnomalyRow{OrderID: sm.OrderID, SKU: sku, Op: sm.Op, Qty: sm.Qty, DBStock: 0, Reason: "unknown sku"})
						continue
					case st == stock.Unlimited:
					case sm.Op == OpRestore:
						delta += sm.Qty
					case st+delta < sm.Qty:
						anomaly = append(anomaly, AnomalyRow{OrderID: sm.OrderID, SKU: sku, Op: sm.Op, Qty: sm.Qty, DBStock: st + delta,
							Reason: "deduction would take database stock below zero"})
						continue
					default:
						delta -= sm.Qty
					}
					ledger = append(ledger, LedgerRow{OrderID: sm.OrderID, SKU: sku, Op: sm.Op, Qty: sm.Qty})
				}
				if delta != 0 {
					if err := tx.Exec(`UPDATE skus SET stock = stock + ? WHERE sku = ?`, delta, sku).Error; err != nil {
						return err
					}
				}
			}
			if len(ledger) > 0 {
				if err := tx.Create(&ledger).Error; err != nil {
					return err
				}
			}
			if len(anomaly) > 0 {
				if err := tx.Clauses(clause.OnConflict{DoNothing: true}).Create(&anomaly).Error; err != nil {
					return err
				}
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
		a.log.Error("apply: stock anomaly recorded", "order", an.OrderID, "sku", an.SKU, "op", an.Op,
			"qty", an.Qty, "db_stock", an.DBStock, "reason", an.Reason)
	}
	return nil
}

// seen returns the operations of this delivery already in the ledger or the
// anomalies (read under the SKU row locks, so no other applier adds any).
func (a *Applier) seen(tx *gorm.DB, skus []string, bySKU map[string][]StockMessage) (map[opKey]bool, error) {
	var orders []string
	for _, sku := range skus {
		for _, sm := range bySKU[sku] {
			orders = append(orders, sm.OrderID)
		}
	}
	done := map[opKey]bool{}
	for _, table := range []string{"stock_ledger", "stock_anomalies"} {
		var rows []struct {
			OrderID string `gorm:"column:order_id"`
			SKU     string `gorm:"column:sku"`
			Op      Op
		}
		if err := tx.Raw(`SELECT order_id, sku, op FROM `+table+` WHERE sku IN ? AND order_id IN ?`, skus, orders).
			Scan(&rows).Error; err != nil {
			return nil, err
		}
		for _, r := range rows {
			done[opKey{r.OrderID, r.SKU, r.Op}] = true
		}
	}
	return done, nil
}
