package arbiter

import (
	"time"

	"gorm.io/gorm"

	"github.com/acme/inventory"
)

// Outbox is the stock outbox (table stock_outbox): the stock operations a
// committed transition promises the ordered consumer. The arbiter queues
// them in the transaction of the transition (Commit, QueueDeducts, Refund);
// the relay reads the unsent ones and marks them sent; the applier marks
// them applied in the transaction that applies them; health checks and
// metrics count them; retention prunes the applied ones. Every statement on
// the table is a method here, so what a row's columns mean is decided in
// one place. Its queries read the live rows (unsent, unapplied) on their
// indexes, however long the history.
type Outbox struct{ db *gorm.DB }

// OutboxOf is the outbox through db: a transaction (the arbiter's, the
// applier's) or the pool, with its context.
func OutboxOf(db *gorm.DB) Outbox { return Outbox{db: db} }

// queue writes one row per line of token, for op.
func (o Outbox) queue(token string, lines []inventory.Line, op Op) error {
	rows := make([]OutboxRow, len(lines))
	for i, l := range lines {
		rows[i] = OutboxRow{Token: token, SKU: l.SKU, Op: op, Qty: l.Qty}
	}
	return o.db.Create(&rows).Error
}

// Unsent reads up to limit rows not yet sent, in id order, leaving out the
// SKUs of skip (the relay's held-back SKUs).
func (o Outbox) Unsent(skip []string, limit int) ([]OutboxRow, error) {
	q := o.db.Where("sent_at IS NULL")
	if len(skip) > 0 {
		q = q.Where("sku NOT IN ?", skip)
	}
	var rows []OutboxRow
	err := q.Order("id").Limit(limit).Find(&rows).Error
	return rows, err
}

// MarkSent records the rows ids as published at at.
func (o Outbox) MarkSent(ids []int64, at time.Time) error {
	return o.db.Model(&OutboxRow{}).Where("id IN ?", ids).Update("sent_at", at).Error
}

// MarkApplied records every operation of msgs as handled (applied,
// duplicate or anomaly) at at, in one UPDATE, so the sync's backlog is read
// from the unapplied rows alone. Call it in the transaction that applies
// them.
func (o Outbox) MarkApplied(msgs []StockMessage, at time.Time) error {
	if len(msgs) == 0 {
		return nil
	}
	keys := make([][]any, len(msgs))
	for i, sm := range msgs {
		keys[i] = []any{sm.Token, sm.SKU, sm.Op}
	}
	return o.db.Exec(`UPDATE stock_outbox SET applied_at = ? WHERE applied_at IS NULL AND (token, sku, op) IN ?`,
		at, keys).Error
}

// BacklogQuery is Backlog's statement (its plan is checked on the real
// database: it reads the unapplied rows only).
const BacklogQuery = `SELECT COUNT(*) AS n, MIN(created_at) AS oldest FROM stock_outbox WHERE applied_at IS NULL`

// Backlog is how many operations are not applied yet, and when the oldest
// of them was written (nil: none).
func (o Outbox) Backlog() (n int64, oldest *time.Time, err error) {
	var b struct {
		N      int64
		Oldest *time.Time
	}
	err = o.db.Raw(BacklogQuery).Scan(&b).Error
	return b.N, b.Oldest, err
}

// UnsentBefore counts the rows written before t and not sent yet.
func (o Outbox) UnsentBefore(t time.Time) (int64, error) {
	var n int64
	err := o.db.Raw(`SELECT COUNT(*) FROM stock_outbox WHERE sent_at IS NULL AND created_at < ?`, t).Scan(&n).Error
	return n, err
}

// UnappliedBefore counts the rows written before t and not applied yet.
func (o Outbox) UnappliedBefore(t time.Time) (int64, error) {
	var n int64
	err := o.db.Raw(`SELECT COUNT(*) FROM stock_outbox WHERE applied_at IS NULL AND created_at < ?`, t).Scan(&n).Error
	return n, err
}

// OutboxCounts are the outbox's rows by progress.
type OutboxCounts struct {
	Sent, Unsent, Unapplied int64
}

// Counts counts the rows sent, not sent and not applied. It reads the whole
// table (sent rows are history): for tests and fault runs, not for a
// service's health.
func (o Outbox) Counts() (OutboxCounts, error) {
	var c OutboxCounts
	err := o.db.Raw(`SELECT
		(SELECT COUNT(*) FROM stock_outbox WHERE sent_at IS NOT NULL) AS sent,
		(SELECT COUNT(*) FROM stock_outbox WHERE sent_at IS NULL) AS unsent,
		(SELECT COUNT(*) FROM stock_outbox WHERE applied_at IS NULL) AS unapplied`).Scan(&c).Error
	return c, err
}

// Unsettled counts the rows the consumer has not handled yet: neither in
// the ledger (applied, once) nor recorded as an anomaly.
func (o Outbox) Unsettled() (int64, error) {
	var n int64
	err := o.db.Raw(`SELECT COUNT(*) FROM stock_outbox ob
		LEFT JOIN stock_ledger l ON l.token = ob.token AND l.sku = ob.sku AND l.op = ob.op
		LEFT JOIN stock_anomalies a ON a.token = ob.token AND a.sku = ob.sku AND a.op = ob.op
		WHERE l.id IS NULL AND a.id IS NULL`).Scan(&n).Error
	return n, err
}

// Rows reads every row, in id order (tests).
func (o Outbox) Rows() ([]OutboxRow, error) {
	var rows []OutboxRow
	err := o.db.Order("id").Find(&rows).Error
	return rows, err
}

// PruneApplied deletes up to limit rows applied before t (applied implies
// delivered, even if the relay stopped before it marked the row sent: it
// would only have sent it again) and returns how many.
func (o Outbox) PruneApplied(t time.Time, limit int) (int64, error) {
	return deleteIDs(o.db, "stock_outbox", `SELECT id FROM stock_outbox WHERE applied_at < ? ORDER BY id LIMIT ?`, t, limit)
}
