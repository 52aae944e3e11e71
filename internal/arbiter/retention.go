package arbiter

import (
	"cmp"
	"errors"
	"slices"
	"time"

	"gorm.io/gorm"
)

// What retention may prune of the arbiter's records, and how: applied
// outbox rows (Outbox.PruneApplied), ledger rows, and old movements folded
// into one opening balance per SKU, so a SKU's movements still sum to its
// on_hand and reserved. Nothing here decides whether an operation was
// already applied: that is the reservation's state, which is never pruned.

// OpeningReason marks the movement that stands for a SKU's folded history:
// a SET whose deltas are the sums of the movements it replaced.
const OpeningReason = "opening balance"

// ErrConcurrentFold: another run folded the same movements first (two
// nodes, or a lock lost mid-run): nothing of this batch was written.
var ErrConcurrentFold = errors.New("arbiter: movements folded concurrently")

// PruneLedger deletes up to limit ledger rows applied before t and returns
// how many. Exactly once never depends on them: a reservation's state says
// whether its operation was applied.
func PruneLedger(db *gorm.DB, t time.Time, limit int) (int64, error) {
	return deleteIDs(db, "stock_ledger", `SELECT id FROM stock_ledger WHERE applied_at < ? ORDER BY id LIMIT ?`, t, limit)
}

// deleteIDs deletes the rows of table that query (t, limit) selects. Ids
// are read first: MariaDB has no LIMIT in an IN subquery, and SQLite no
// DELETE ... LIMIT.
func deleteIDs(db *gorm.DB, table, query string, t time.Time, limit int) (int64, error) {
	var ids []int64
	if err := db.Raw(query, t, limit).Scan(&ids).Error; err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	res := db.Exec("DELETE FROM "+table+" WHERE id IN ?", ids)
	return res.RowsAffected, res.Error
}

// FoldMovements folds up to limit movements written before t (opening
// balances aside) into one opening balance per SKU, with the SKU's earlier
// opening balance, and returns how many it folded. Run it in a
// transaction: the deletes and the balance commit together. The balance
// takes the id and the position of the last movement it replaces, so a
// reader past that position has everything it sums, and the positions
// after it do not move.
func (a Arbiter) FoldMovements(t time.Time, limit int) (int64, error) {
	var old []Movement
	if err := a.tx.Where("created_at < ? AND NOT (kind = ? AND reason = ?)", t, MoveSet, OpeningReason).
		Order("id").Limit(limit).Find(&old).Error; err != nil {
		return 0, err
	}
	bySKU := map[string][]Movement{}
	var skus []string
	for _, m := range old {
		if _, ok := bySKU[m.SKU]; !ok {
			skus = append(skus, m.SKU)
		}
		bySKU[m.SKU] = append(bySKU[m.SKU], m)
	}
	for _, sku := range skus {
		ms := bySKU[sku]
		last := slices.MaxFunc(ms, func(x, y Movement) int { return cmp.Compare(x.Position, y.Position) })
		// The SKU's earlier opening balance folds in too.
		var opening []Movement
		if err := a.tx.Where("sku = ? AND position < ? AND kind = ? AND reason = ?", sku, last.Position, MoveSet, OpeningReason).
			Find(&opening).Error; err != nil {
			return 0, err
		}
		sum := Movement{ID: last.ID, SKU: sku, Position: last.Position, Kind: MoveSet, Reason: OpeningReason, CreatedAt: last.CreatedAt}
		ids := make([]int64, 0, len(ms)+len(opening))
		for _, m := range append(opening, ms...) {
			sum.OnHandDelta += m.OnHandDelta
			sum.ReservedDelta += m.ReservedDelta
			ids = append(ids, m.ID)
		}
		res := a.tx.Exec(`DELETE FROM stock_movements WHERE id IN ?`, ids)
		if res.Error != nil {
			return 0, res.Error
		}
		if res.RowsAffected != int64(len(ids)) {
			// Another run folded some of them first: summing them again
			// would count them twice.
			return 0, ErrConcurrentFold
		}
		if err := a.tx.Create(&sum).Error; err != nil {
			return 0, err
		}
	}
	return int64(len(old)), nil
}
