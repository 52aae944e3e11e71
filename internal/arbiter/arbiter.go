package arbiter

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/acme/inventory"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Arbiter is the one owner of every quantity change (docs/SPEC.md section
// 3): each statement that changes a SKU's on_hand or reserved, a
// reservation's state or a buyer's quota is a method here, and each method
// also writes the movements of what it changed, bumps the SKU's seq (what
// fences Redis's give-backs) and counts the buyers' quotas, so no caller can
// forget one. Callers say what happened (reserve, release, commit, sell,
// refund, restock, set) inside their transaction; the arbiter decides how.
//
// The database's own rules back it: reserved <= on_hand for every limited
// SKU (a CHECK), a reservation's key (token, sku), a quota's key (sku, user).
//
// Reserve, and what it calls, sends its statements through c (see Conn),
// so the group commit runs it past GORM (OnConn); the rest goes through
// GORM (tx).
type Arbiter struct {
	tx      *gorm.DB // nil on a Direct's
	c       Conn
	ctx     context.Context
	dialect string      // the database's: "mysql", "sqlite"
	known   *LimitCache // per-user limits a writer read before (nil: read them)
}

// In is the arbiter of the transaction tx: every change it makes commits or
// rolls back with tx.
func In(tx *gorm.DB) Arbiter {
	a := Arbiter{tx: tx, c: gormConn{tx}}
	if tx != nil {
		a.dialect = tx.Dialector.Name()
		if tx.Statement != nil {
			a.ctx = tx.Statement.Context
		}
	}
	return a
}

// Hold is one reservation to record, and the buyer it counts against if its
// SKU has a per-user limit ("" for none: the token API).
type Hold struct {
	Row   Reservation
	Buyer string
	// Lean records the hold as one row of holds (insertHolds) instead of
	// its reservation and RESERVE movement: its projection is written
	// after the commit. Line is its line in its order (0 for a token's).
	// A campaign's sale is numbered in its campaign's holds (PoolID).
	// Never for a late payment's re-reservation: a transition of an order
	// the projection has, written there as every transition is.
	Lean bool
	Line int
}

// Reserve records holds (HELD, or COMMITTED for a late payment's
// re-reservation): their rows, each buyer's quota under a conditional
// increment (OverLimitError past the SKU's limit), and last one conditional
// increment of reserved per SKU (RefusedError when on_hand - reserved cannot
// cover it, inventory.ErrUnknownSKU for no such SKU), so the SKU rows, hot in
// a flash sale, stay locked only until commit; then a RESERVE movement each,
// numbered by that UPDATE (a SKU's movement positions follow its changes'
// order). SKUs are locked in sorted order: concurrent writers never
// deadlock.
//
// A hold whose row names a campaign is a campaign sale: its units come from
// the campaign's pool (see takeFromPools: the window, by the database's
// clock, and the pool's units; CampaignRefusedError), not from the SKU's
// available units, and it counts against the campaign's per-user limit,
// not the SKU's. Its fence is keyed by CampaignToken(id).
func (a Arbiter) Reserve(holds []Hold) (map[string]Fence, error) {
	limits, checked, err := a.limits(holds)
	if err != nil {
		return nil, err
	}
	rows := make([]Reservation, len(holds))
	want := map[string]int64{}
	fromPool, skuOf := map[string]int64{}, map[string]string{}
	take := map[BuyerUnits]int64{}
	var plain []Reservation // the rows that move the SKU's reserved
	var plainHold []int     // their index in holds
	lean := map[string]bool{}
	leanPool := map[string]int64{} // a campaign's lean holds: their count
	for i, h := range holds {
		if h.Lean && h.Row.State != Held {
			return nil, fmt.Errorf("arbiter: a lean hold must be a HELD sale (%s of %s)", h.Row.Token, h.Row.SKU)
		}
		rows[i] = h.Row
		rows[i].Buyer = nil
		quota := h.Row.SKU
		if c := h.Row.CampaignID; c != nil {
			quota = CampaignToken(*c)
			fromPool[*c] += h.Row.Qty
			skuOf[*c] = h.Row.SKU
			if h.Lean {
				leanPool[*c]++
			}
		} else {
			want[h.Row.SKU] += h.Row.Qty
			plain = append(plain, rows[i])
			plainHold = append(plainHold, i)
			if h.Lean {
				lean[h.Row.SKU] = true
			}
		}
		if h.Buyer != "" && limits[quota] > 0 {
			rows[i].Buyer = &holds[i].Buyer
			take[BuyerUnits{SKU: quota, User: h.Buyer}] += h.Row.Qty
		}
	}
	classic := rows
	if len(lean)+len(leanPool) > 0 {
		classic = nil
		for i, r := range rows {
			if !holds[i].Lean {
				classic = append(classic, r)
			}
		}
	}
	if err := a.insertReservations(classic); err != nil {
		return nil, err
	}
	if err := a.takeQuotas(take, limits); err != nil {
		var over OverLimitError
		if errors.As(err, &over) {
			if limit, ok := checked[over.SKU]; ok { // counted under a limit known before: is it still the one?
				if _, stale := a.checkLimit(over.SKU, limit, true); stale != nil {
					return nil, stale
				}
			}
		}
		return nil, err
	}
	moves := reservationMovements(plain, MoveReserve, 1)
	count := movementCounts(moves)
	skus := sortedKeys(want)
	// The movements are numbered from the SKUs' rows as the UPDATEs left
	// them, under their locks, as every other change's: a SKU's positions
	// are then the order its changes committed in, and its history replays
	// through the levels it really had (a reservation waiting behind a
	// release is numbered after it).
	fences, last, err := a.takeStock(skus, want, count, checked, lean)
	if err != nil {
		return nil, err
	}
	var held []leanHold
	if len(lean) == 0 {
		err = a.moved(moves, last)
	} else {
		held, err = a.movedOrHeld(holds, rows, moves, plainHold, last)
	}
	if err != nil {
		return nil, err
	}
	for sku, f := range fences { // the buyers the SKUs' limits counted, for Redis's counts
		if limit := limits[sku]; limit > 0 {
			f.Limit = limit
			fences[sku] = f
		}
	}
	if len(fromPool) > 0 {
		pools, lastSeq, err := a.takeFromPools(fromPool, skuOf, leanPool)
		if err != nil {
			return nil, err
		}
		for id, f := range pools {
			fences[CampaignToken(id)] = f
		}
		for i, h := range holds { // a campaign's lean holds, numbered up to its pool's change counter in batch order
			if c := h.Row.CampaignID; c != nil && h.Lean {
				held = append(held, leanHold{Hold: h, row: rows[i], seq: lastSeq[*c] - leanPool[*c] + 1})
				leanPool[*c]--
			}
		}
	}
	if err := a.insertHolds(held); err != nil {
		return nil, err
	}
	return fences, nil
}

// limits reads the per-user limits of the SKUs that holds with a buyer
// name; SKUs without a limit are absent. One read, only when a buyer counts
// and the arbiter's LimitCache (if any) does not hold the SKU's limit;
// checked are the limits taken from the cache, which the SKUs' UPDATEs
// then check (takeStock).
func (a Arbiter) limits(holds []Hold) (limits, checked map[string]int64, err error) {
	var skus, campaigns []string
	for _, h := range holds {
		switch {
		case h.Buyer == "":
		case h.Row.CampaignID != nil:
			campaigns = append(campaigns, *h.Row.CampaignID)
		default:
			skus = append(skus, h.Row.SKU)
		}
	}
	limits, err = a.campaignLimits(campaigns)
	if err != nil || len(skus) == 0 {
		return limits, nil, err
	}
	slices.Sort(skus)
	skus = slices.Compact(skus)
	if limits == nil {
		limits = map[string]int64{}
	}
	var missed []string
	for _, sku := range skus {
		limit, ok := a.known.Get(sku)
		switch {
		case !ok:
			missed = append(missed, sku)
			continue
		case checked == nil:
			checked = map[string]int64{}
		}
		checked[sku] = limit
		if limit > 0 {
			limits[sku] = limit
		}
	}
	if len(missed) == 0 {
		return limits, checked, nil
	}
	if err := a.query(func(rows *sql.Rows) error {
		var sku string
		var limit int64
		if err := rows.Scan(&sku, &limit); err != nil {
			return err
		}
		a.known.set(sku, limit)
		if limit > 0 {
			limits[sku] = limit
		}
		return nil
	}, inList(`SELECT sku, per_user_limit FROM skus WHERE sku IN ?`, len(missed)), anys(missed)...); err != nil {
		return nil, nil, err
	}
	return limits, checked, nil
}

// takeStock is the SKUs' conditional UPDATEs (in sorted order: concurrent
// writers never deadlock on them), each taking want of on_hand - reserved
// and numbering count movements, and checking the limit of checked; it
// returns the SKUs' fences and positions as the UPDATEs left them, and
// writes the threshold events they crossed. On MySQL each UPDATE keeps
// what the fences and events need in user variables, read back in one
// statement that reads no table (the SKUs' rows are not read again);
// SQLite reads the rows (levelsAfter).
func (a Arbiter) takeStock(skus []string, want, count, checked map[string]int64, lean map[string]bool) (map[string]Fence, positions, error) {
	vars := a.dialect != "sqlite"
	for i, sku := range skus {
		args := []any{want[sku]}
		if lean[sku] {
			args = append(args, count[sku])
		}
		args = append(args, count[sku], sku, want[sku])
		limit, check := checked[sku]
		if check {
			args = append(args, limit)
		}
		n, err := a.exec(takeStockSQL(i, vars, check, lean[sku]), args...)
		if err != nil {
			return nil, nil, err
		}
		if n == 0 {
			return nil, nil, a.whyRefused(sku, limit, check)
		}
	}
	if !vars || len(skus) == 0 { // no SKU: a batch of campaign sales only, no read
		return a.levelsAfter(skus)
	}
	rows := make([]levelRow, len(skus))
	if err := a.query(func(rs *sql.Rows) error {
		dest := make([]any, 0, 8*len(skus))
		for i, sku := range skus {
			r := &rows[i]
			r.SKU = sku
			dest = append(dest, &r.Seq, &r.RedisEpoch, &r.OnHand, &r.Reserved, &r.LowStockThreshold, &r.EventFlags, &r.EventSeq, &r.MovementPosition)
		}
		return rs.Scan(dest...)
	}, levelVarsSQL(len(skus))); err != nil {
		return nil, nil, err
	}
	return a.levels(rows)
}

// The statements of takeStock, built once per shape (the group commit
// sends them for every batch): the i-th SKU's UPDATE, on MySQL keeping
// what levels needs in user variables numbered i, with the limit's check
// or without; and the read of those variables for n SKUs, in levelRow's
// order (seq, epoch, on_hand, reserved, threshold, flags, event seq,
// position).
var takeStockSQLs, levelVarsSQLs sync.Map // [4]any{i, vars, check, lean} → string; n → string

// With lean, the UPDATE also marks the SKU's holds left to project: its
// last hold's seq is at most the last position the UPDATE numbers (set
// before movement_position moves, from its value before, alike on both
// databases).
func takeStockSQL(i int, vars, check, lean bool) string {
	k := [4]any{i, vars, check, lean}
	if q, ok := takeStockSQLs.Load(k); ok {
		return q.(string)
	}
	held := ""
	if lean {
		held = "holds_dirty = 1, hold_seq = movement_position + ?, "
	}
	q := `UPDATE skus SET reserved = reserved + ?, seq = seq + 1, level_dirty = 1, ` + held + `movement_position = movement_position + ?`
	if vars {
		q = fmt.Sprintf(`UPDATE skus SET reserved = (@r%[1]d := reserved + ?), seq = (@s%[1]d := seq + 1), level_dirty = 1, %[2]s
			movement_position = (@p%[1]d := movement_position + ?), redis_epoch = (@e%[1]d := redis_epoch), on_hand = (@o%[1]d := on_hand),
			low_stock_threshold = (@t%[1]d := low_stock_threshold), event_flags = (@f%[1]d := event_flags), event_seq = (@q%[1]d := event_seq)`, i, held)
	}
	q += ` WHERE sku = ? AND (on_hand = -1 OR on_hand - reserved >= ?)`
	if check {
		q += ` AND per_user_limit = ?`
	}
	takeStockSQLs.Store(k, q)
	return q
}

func levelVarsSQL(n int) string {
	if q, ok := levelVarsSQLs.Load(n); ok {
		return q.(string)
	}
	cols := make([]string, 0, 8*n)
	for i := range n {
		for _, v := range []string{"s", "e", "o", "r", "t", "f", "q", "p"} {
			cols = append(cols, fmt.Sprintf("@%s%d", v, i))
		}
	}
	q := `SELECT ` + strings.Join(cols, ", ")
	levelVarsSQLs.Store(n, q)
	return q
}

// whyRefused is the error of a SKU's UPDATE that changed nothing: no such
// SKU, a limit other than the one checked (checkLimit), or not enough
// stock.
func (a Arbiter) whyRefused(sku string, checked int64, check bool) error {
	found, err := a.checkLimit(sku, checked, check)
	switch {
	case err != nil:
		return err
	case !found:
		return inventory.UnknownSKU(sku)
	}
	return RefusedError{sku}
}

// checkLimit reads sku's per-user limit (found: the SKU exists) and, with
// check, returns the retryable error of a limit other than known, which
// the cache then learns: the transaction, counted under known, runs again.
func (a Arbiter) checkLimit(sku string, known int64, check bool) (found bool, err error) {
	var limit int64
	if err := a.query(func(rs *sql.Rows) error { found = true; return rs.Scan(&limit) },
		`SELECT per_user_limit FROM skus WHERE sku = ?`, sku); err != nil {
		return false, err
	}
	if found && check && limit != known {
		a.known.set(sku, limit)
		return true, limitChanged(sku, known, limit)
	}
	return found, nil
}

// takeQuotas counts each buyer's units, conditionally: OverLimitError when a
// buyer would pass the SKU's limit. One upsert per (SKU, buyer), in sorted
// order; the row is created at the first purchase.
func (a Arbiter) takeQuotas(take map[BuyerUnits]int64, limits map[string]int64) error {
	keys := make([]BuyerUnits, 0, len(take))
	for k := range take {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(x, y BuyerUnits) int {
		return strings.Compare(x.SKU+"\x00"+x.User, y.SKU+"\x00"+y.User)
	})
	upsert := `INSERT INTO buyer_quotas (sku, user_id, qty) VALUES (?, ?, ?)
		ON DUPLICATE KEY UPDATE qty = IF(qty + VALUES(qty) <= ?, qty + VALUES(qty), qty)`
	if a.dialect == "sqlite" {
		upsert = `INSERT INTO buyer_quotas (sku, user_id, qty) VALUES (?, ?, ?)
			ON CONFLICT (sku, user_id) DO UPDATE SET qty = qty + excluded.qty WHERE qty + excluded.qty <= ?`
	}
	for _, b := range keys {
		qty, limit := take[b], limits[b.SKU]
		if qty > limit {
			return OverLimitError{b.SKU, b.User, limit}
		}
		n, err := a.exec(upsert, b.SKU, b.User, qty, limit)
		if err != nil {
			return err
		}
		if n == 0 { // the row exists and stayed as it was
			return OverLimitError{b.SKU, b.User, limit}
		}
	}
	return nil
}

// Release releases token's HELD reservations (all its SKUs, or only sku):
// each turns RELEASED conditionally, so two releases racing give back once;
// reserved goes down by their units, a RELEASE movement each, and their
// buyers' quotas come back. A reservation that is not HELD is left alone.
func (a Arbiter) Release(token, sku string) (Freed, error) { return a.release(token, sku, time.Time{}) }

// ReleaseDue is Release of token's reservation of sku only if its deadline
// passed by now (the timeout sweep): an extension that committed first
// keeps the hold, whatever the sweep read before.
func (a Arbiter) ReleaseDue(token, sku string, now time.Time) (Freed, error) {
	return a.release(token, sku, now)
}

// Extend moves the deadline of token's HELD reservation of sku to until,
// conditionally: its deadline has not passed by now and is before until,
// it was created no earlier than earliest (the maximum hold), and key
// (when given) is not the key of the extension that moved it last. It
// reports whether the row changed; the caller reads why not. A released or
// expired hold is never revived: ReleaseDue and Extend decide on the same
// row, one of them first.
func (a Arbiter) Extend(token, sku string, now, until, earliest time.Time, key string) (bool, error) {
	set := map[string]any{"expires_at": until, "updated_at": now, "extend_key": nil}
	q := a.tx.Model(&Reservation{}).Where("token = ? AND sku = ? AND state = ? AND expires_at > ? AND expires_at < ? AND created_at >= ?",
		token, sku, Held, now, until, earliest)
	if key != "" {
		set["extend_key"] = key
		q = q.Where("(extend_key IS NULL OR extend_key <> ?)", key)
	}
	res := q.Updates(set)
	return res.RowsAffected == 1, res.Error
}

func (a Arbiter) release(token, sku string, due time.Time) (Freed, error) {
	// A campaign's pool (the end, the sweep at its deadline): the
	// campaign's row first, as a sale locks them (lockCampaigns); its
	// release writes campaign.ended there.
	if id, ok := strings.CutPrefix(token, CampaignToken("")); ok {
		if err := a.lockCampaigns([]string{id}); err != nil {
			return Freed{}, err
		}
	}
	// By primary key, locked: a campaign's pool changes its qty while it is
	// HELD (buyers' give-backs join it), so the qty given back must be the
	// one the update below releases, not a snapshot read before a
	// give-back committed (that unit would be stranded in reserved).
	q := a.tx.Model(&Reservation{}).Clauses(clause.Locking{Strength: "UPDATE"}).Where("token = ?", token)
	if sku != "" {
		q = q.Where("sku = ?", sku)
	}
	var rows []Reservation
	if err := q.Order("sku").Find(&rows).Error; err != nil {
		return Freed{}, err
	}
	give := map[string]int64{}
	var released, pools []Reservation
	for _, r := range rows {
		if r.State != Held {
			continue
		}
		cond := a.tx.Model(&Reservation{}).Where("token = ? AND sku = ? AND state = ?", r.Token, r.SKU, Held)
		if !due.IsZero() {
			cond = cond.Where("expires_at <= ?", due)
		}
		res := cond.Update("state", Released)
		if res.Error != nil {
			return Freed{}, res.Error
		}
		if res.RowsAffected == 1 && r.CampaignID != nil && r.Token == CampaignToken(*r.CampaignID) {
			pools = append(pools, r) // a campaign's end, sold out or not
		}
		if res.RowsAffected == 1 && r.Qty > 0 {
			give[r.SKU] += r.Qty
			released = append(released, r)
		}
	}
	toSKU, poolChs, err := a.returnToPools(released)
	if err != nil {
		return Freed{}, err
	}
	give = map[string]int64{}
	for _, r := range toSKU {
		give[r.SKU] += r.Qty
	}
	moves := reservationMovements(toSKU, MoveRelease, -1)
	count := movementCounts(moves)
	quotas, campQuotas, err := a.returnQuotas(released)
	if err != nil {
		return Freed{}, err
	}
	var ended []CampaignRef
	for _, p := range pools {
		ended = append(ended, CampaignRef{ID: *p.CampaignID, SKU: p.SKU})
	}
	if len(give) == 0 {
		return Freed{Units: give, Campaigns: poolChs, CampaignQuotas: campQuotas, Ended: ended}, a.poolsReleased(pools)
	}
	skus := sortedKeys(give)
	for _, sku := range skus {
		if err := a.tx.Exec(`UPDATE skus SET reserved = reserved - ?, seq = seq + 1, level_dirty = 1,
			movement_position = movement_position + ? WHERE sku = ?`, give[sku], count[sku], sku).Error; err != nil {
			return Freed{}, err
		}
	}
	if err := a.poolsReleased(pools); err != nil { // the end first, then what its units crossed
		return Freed{}, err
	}
	fences, last, err := a.levelsAfter(skus)
	if err != nil {
		return Freed{}, err
	}
	if err := a.moved(moves, last); err != nil {
		return Freed{}, err
	}
	chs := Changes(give, fences, 1)
	for i := range chs { // the buyers' counts, under the same seq: one transaction moved both
		for _, q := range quotas {
			if q.SKU == chs[i].SKU {
				if chs[i].Buyers == nil {
					chs[i].Buyers = map[string]int64{}
				}
				chs[i].Buyers[q.User] -= q.Qty
			}
		}
	}
	return Freed{Changes: chs, Units: give, Quotas: quotas, Campaigns: poolChs, CampaignQuotas: campQuotas, Ended: ended}, nil
}

// returnQuotas gives released reservations' units back to their buyers'
// quotas: a SKU's, or a campaign's for a campaign sale.
func (a Arbiter) returnQuotas(released []Reservation) (skus []BuyerUnits, campaigns []CampaignUnits, err error) {
	for _, r := range released {
		if r.Buyer == nil {
			continue
		}
		key := r.SKU
		if r.CampaignID != nil {
			key = CampaignToken(*r.CampaignID)
			campaigns = append(campaigns, CampaignUnits{ID: *r.CampaignID, SKU: r.SKU, User: *r.Buyer, Qty: r.Qty})
		} else {
			skus = append(skus, BuyerUnits{SKU: r.SKU, User: *r.Buyer, Qty: r.Qty})
		}
		if err := a.tx.Exec(`UPDATE buyer_quotas SET qty = qty - ? WHERE sku = ? AND user_id = ?`,
			r.Qty, key, *r.Buyer).Error; err != nil {
			return nil, nil, err
		}
	}
	return skus, campaigns, nil
}

// Tombstone records token as released for sku before it ever reserved (a
// Release that arrived first): a reservation under it later collides with
// the row and takes nothing.
//
// The lean sale's holds collide with it too: a row of holds under the
// token's key, of no units and no seq (the projector never reads it; its
// projection is this reservation). A lean hold that committed first makes
// this insert a duplicate, and the release runs again and finds it.
func (a Arbiter) Tombstone(token, sku string, r Reservation) error {
	r.Token, r.SKU, r.State, r.Qty = token, sku, Released, 0
	if err := a.tx.Create(&r).Error; err != nil {
		return err
	}
	var none *string
	return a.insertRows("holds", holdColumns, []any{tokenHoldID(sku, token), 0, SKUID(sku), 0, sku, 0, 0, token, none, false, none,
		r.ExpiresAt, r.CreatedAt})
}

// Commit turns token's HELD reservations of lines into a sale: COMMITTED,
// and one DEDUCT outbox row per line (the ordered consumer deducts on_hand
// through sell). Every line must have been HELD.
func (a Arbiter) Commit(token string, lines []inventory.Line) error {
	skus := make([]string, len(lines))
	for i, l := range lines {
		skus[i] = l.SKU
	}
	res := a.tx.Model(&Reservation{}).Where("token = ? AND sku IN ? AND state = ?", token, skus, Held).Update("state", Committed)
	if res.Error != nil {
		return res.Error
	}
	if res.RowsAffected != int64(len(lines)) {
		return fmt.Errorf("%w: %d of %d reservations of %s were held", inventory.ErrConflict, res.RowsAffected, len(lines), token)
	}
	return a.QueueDeducts(token, lines)
}

// QueueDeducts writes the DEDUCT outbox rows of committed reservations (a
// late payment's were reserved COMMITTED).
func (a Arbiter) QueueDeducts(token string, lines []inventory.Line) error {
	return OutboxOf(a.tx).queue(token, lines, OpDeduct)
}

// Refund promises token's sold lines back to on_hand: RESTORE outbox rows,
// which the ordered consumer applies (restore) after their deduction.
func (a Arbiter) Refund(token string, lines []inventory.Line) error {
	return OutboxOf(a.tx).queue(token, lines, OpRestore)
}

// Settle applies one delivery of the ordered consumer under the SKU rows'
// locks (taken in SKU order): each operation is decided by its
// reservation's state, which retention never prunes. A DEDUCT sells a
// COMMITTED reservation of its quantity (SOLD; on_hand and reserved lose
// the units), a RESTORE gives a SOLD one back (RESTORED; on_hand gains
// them); a duplicate finds the state moved and changes nothing; anything
// else is an anomaly for the caller to record. One UPDATE per SKU and per
// state change writes the merged effect, with a SALE or REFUND movement and
// a ledger row (audit) per operation. An operation recorded as an anomaly
// before is handled: skipped.
func (a Arbiter) Settle(skus []string, bySKU map[string][]StockMessage) (Delivery, error) {
	var d Delivery
	if len(skus) == 0 {
		return d, nil
	}
	var rows []struct {
		SKU              string `gorm:"column:sku"`
		OnHand           int64
		MovementPosition int64
	}
	if err := a.tx.Table("skus").Select("sku, on_hand, movement_position").Where("sku IN ?", skus).Order("sku").
		Clauses(clause.Locking{Strength: "UPDATE"}).Scan(&rows).Error; err != nil {
		return d, err
	}
	onHand := map[string]int64{}
	last := positions{} // each SKU's, from the row read under its lock, plus this delivery's movements
	for _, r := range rows {
		onHand[r.SKU] = r.OnHand
		last[r.SKU] = r.MovementPosition
	}
	recorded, err := a.recordedAnomalies(skus, bySKU)
	if err != nil {
		return d, err
	}
	var ledger []LedgerRow
	var moves []Movement
	var shipping shippingChanges // what a count's rebase reads of order lines (shipping.go)
	now := time.Now().UTC().Truncate(time.Microsecond)
	restored := map[string]int64{}
	for _, sku := range skus {
		oh, known := onHand[sku]
		states, err := a.reservationsOf(sku, bySKU[sku])
		if err != nil {
			return d, err
		}
		var sold, back []string
		var deducted, returned int64
		for _, sm := range bySKU[sku] {
			k := opKey{sm.Token, sku, sm.Op}
			if recorded[k] {
				d.Duplicate++ // recorded as an anomaly before: handled
				continue
			}
			res, ok := states[sm.Token]
			ok = ok && res.Qty == sm.Qty
			reason := ""
			switch {
			case !known:
				reason = "unknown sku"
			case sm.Op == OpDeduct && ok && (res.State == Sold || res.State == Restored),
				sm.Op == OpRestore && ok && res.State == Restored:
				d.Duplicate++
				continue
			case sm.Op == OpDeduct && !(ok && res.State == Committed):
				reason = "no committed reservation of this quantity"
			case sm.Op == OpRestore && !(ok && res.State == Sold):
				reason = "restore without its deduction"
			}
			if reason != "" {
				d.Anomalies = append(d.Anomalies, AnomalyRow{Token: sm.Token, SKU: sku, Op: sm.Op, Qty: sm.Qty, OnHand: oh, Reason: reason})
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
			m := appliedMovement(sku, oh, sm)
			m.CreatedAt = now
			moves = append(moves, m)
			if oh != inventory.Unlimited {
				shipping.add(res, sm.Op)
			}
		}
		if err := a.settleSKU(sku, oh, sold, back, deducted, returned, now); err != nil {
			return d, err
		}
		last[sku] += int64(len(sold) + len(back)) // a movement each, counted by settleSKU's UPDATE
		if returned > 0 && oh != inventory.Unlimited {
			restored[sku] = returned
		}
	}
	if len(ledger) > 0 {
		if err := a.tx.Clauses(clause.OnConflict{DoNothing: true}).Create(&ledger).Error; err != nil {
			return d, err
		}
	}
	if err := a.moved(moves, last); err != nil {
		return d, err
	}
	if err := a.recordShipping(shipping, now); err != nil {
		return d, err
	}
	if len(restored) > 0 {
		fences, err := a.fencesAfter(sortedKeys(restored))
		if err != nil {
			return d, err
		}
		d.Changes = Changes(restored, fences, 1)
	}
	d.Applied = int64(len(ledger))
	return d, nil
}

// reservationsOf returns the reservations of sku that msgs name, by token.
// Read under the SKU's row lock: only settle (holding it) moves a
// reservation out of COMMITTED or SOLD.
func (a Arbiter) reservationsOf(sku string, msgs []StockMessage) (map[string]Reservation, error) {
	tokens := make([]string, 0, len(msgs))
	for _, sm := range msgs {
		tokens = append(tokens, sm.Token)
	}
	// By primary key only: with the state in the WHERE, MariaDB picks the
	// (sku, state) prefix and walks every committed row of a hot SKU.
	var rows []Reservation
	if err := a.tx.Where("token IN ? AND sku = ?", tokens, sku).Find(&rows).Error; err != nil {
		return nil, err
	}
	out := make(map[string]Reservation, len(rows))
	for _, r := range rows {
		out[r.Token] = r
	}
	return out, nil
}

// settleSKU writes one SKU's merged effect: the sold reservations turn SOLD
// and the restored ones RESTORED (each conditionally, from the state read
// under the row lock), on_hand and reserved lose what was deducted, on_hand
// gains what was restored (an unlimited SKU's on_hand stays -1), and its
// movement_position counts a movement per reservation. A limited SKU's
// movements, stamped at, all move on_hand: the last is the SKU's last
// change of on_hand (on_hand_position and on_hand_moved_at, what a count's
// rebase starts from, counts.go), set before movement_position's term so
// that MySQL (which assigns left to right) and SQLite both add to the old
// value.
func (a Arbiter) settleSKU(sku string, onHand int64, sold, back []string, deducted, returned int64, at time.Time) error {
	for _, step := range []struct {
		tokens   []string
		from, to ResState
	}{{sold, Committed, Sold}, {back, Sold, Restored}} {
		if len(step.tokens) == 0 {
			continue
		}
		res := a.tx.Model(&Reservation{}).Where("token IN ? AND sku = ? AND state = ?", step.tokens, sku, step.from).Update("state", step.to)
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected != int64(len(step.tokens)) {
			return fmt.Errorf("apply: %s: %d of %d reservations turned %s", sku, res.RowsAffected, len(step.tokens), step.to)
		}
	}
	count := len(sold) + len(back)
	if count == 0 {
		return nil
	}
	if onHand == inventory.Unlimited {
		return a.tx.Exec(`UPDATE skus SET reserved = reserved - ?, level_dirty = 1, movement_position = movement_position + ? WHERE sku = ?`,
			deducted, count, sku).Error
	}
	return a.tx.Exec(`UPDATE skus SET on_hand = on_hand - ? + ?, reserved = reserved - ?, seq = seq + ?, level_dirty = 1,
		on_hand_position = movement_position + ?, on_hand_moved_at = ?, movement_position = movement_position + ? WHERE sku = ?`,
		deducted, returned, deducted, min(returned, 1), count, at, count, sku).Error
}

// appliedMovement is the movement of one applied operation, as settleSKU
// moves the SKU: a sale takes qty from on_hand and reserved, a refund gives
// qty back to on_hand; an unlimited SKU's on_hand (-1) does not move.
func appliedMovement(sku string, onHand int64, sm StockMessage) Movement {
	m := Movement{SKU: sku, Kind: MoveSale, OnHandDelta: -sm.Qty, ReservedDelta: -sm.Qty, Reference: tokenRef(sm.Token)}
	if sm.Op == OpRestore {
		m.Kind, m.OnHandDelta, m.ReservedDelta = MoveRefund, sm.Qty, 0
	}
	if onHand == inventory.Unlimited {
		m.OnHandDelta = 0
	}
	return m
}

// Settings are what an admin's put sets of a SKU.
type Settings struct {
	OnHand, PerUserLimit, LowStockThreshold int64
}

// Set creates sku or sets its on_hand (Unlimited allowed), per-user limit
// and low-stock threshold, read under the row lock: a conflict below what
// is reserved, a failed precondition when the SKU's version is not one of
// ifMatch (if any). A new SKU's history opens with its stock, and its
// thresholds start as its levels are (a SKU created empty is not announced
// sold out); a SET movement records a change of on_hand (none when only
// the settings move), and a change of on_hand or of the threshold that
// crosses one is announced.
//
// A SKU that does not exist yet is inserted without a locking read first:
// a locking read of a missing row locks the gap it would go in, and two
// creates that both hold the gap both wait for the other's to insert (a
// deadlock, which parallel catalog imports hit on every other request). An
// insert alone takes no gap lock; one that loses a race to insert the same
// SKU runs again (errInsertRaced) and finds the row.
func (a Arbiter) Set(sku string, s Settings, ifMatch []string) error {
	set := Movement{SKU: sku, Kind: MoveSet, OnHandDelta: s.OnHand}
	if len(ifMatch) == 0 {
		exists, err := SKUExists(a.tx, sku)
		if err != nil {
			return err
		}
		if !exists {
			// The SET movement is the SKU's first change of on_hand, and
			// its row says so (see settleSKU) with the movement's stamp.
			now := time.Now().UTC().Truncate(time.Microsecond)
			set.CreatedAt = now
			if err := a.tx.Exec(`INSERT INTO skus (sku, on_hand, per_user_limit, low_stock_threshold, event_flags, level_dirty,
				movement_position, on_hand_position, on_hand_moved_at) VALUES (?, ?, ?, ?, ?, 1, 1, 1, ?)`, sku, s.OnHand, s.PerUserLimit,
				s.LowStockThreshold, thresholdFlags(s.OnHand, 0, s.LowStockThreshold), now).Error; err != nil {
				if IsDuplicate(err) {
					return fmt.Errorf("%w: %w", errInsertRaced, err)
				}
				return err
			}
			return a.moved([]Movement{set}, positions{sku: 1})
		}
	}
	cur, err := a.lockSKU(sku, ifMatch)
	if err != nil {
		return err
	}
	if len(cur) == 0 { // deleted meanwhile, which nothing does: run again
		return errInsertRaced
	}
	if s.OnHand != inventory.Unlimited && s.OnHand < cur[0].Reserved {
		return fmt.Errorf("%w: %d units are reserved; stock cannot go to %d", inventory.ErrConflict, cur[0].Reserved, s.OnHand)
	}
	set.OnHandDelta = s.OnHand - cur[0].OnHand
	var count int64 // the SET movement, when on_hand moves
	args := []any{s.OnHand, s.OnHand, s.PerUserLimit, s.LowStockThreshold}
	moved := ""
	if set.OnHandDelta != 0 {
		count = 1
		// The SKU's last change of on_hand (see settleSKU), stamped under
		// the row lock as the movement is, before movement_position's term.
		set.CreatedAt = time.Now().UTC().Truncate(time.Microsecond)
		moved = "on_hand_position = movement_position + 1, on_hand_moved_at = ?, "
		args = append(args, set.CreatedAt)
	}
	if err := a.tx.Exec(`UPDATE skus SET level_dirty = CASE WHEN on_hand = ? THEN level_dirty ELSE 1 END,
		on_hand = ?, per_user_limit = ?, low_stock_threshold = ?, seq = seq + 1, `+moved+`movement_position = movement_position + ?
		WHERE sku = ?`, append(args, count, sku)...).Error; err != nil {
		return err
	}
	_, last, err := a.levelsAfter([]string{sku})
	if err != nil || count == 0 {
		return err
	}
	return a.moved([]Movement{set}, last)
}

// Restock adds delta to a limited SKU's on_hand (a restock, or a correction
// when negative), never below what is reserved, with its movement. With a
// reference it applies once per SKU: replay says a retry (the same delta)
// found it applied and nothing changed; another delta under the reference
// is a conflict. The record of references is never pruned. With ifMatch,
// the SKU's version must be one of them (checked after the reference, so a
// retry is answered as its first application was).
func (a Arbiter) Restock(sku string, delta int64, reason, reference string, ifMatch []string) (m map[string]Fence, replay bool, err error) {
	if reference != "" {
		if replay, err = a.referenceSeen(sku, delta, reason, reference); err != nil || replay {
			return nil, replay, err
		}
	}
	if len(ifMatch) > 0 {
		if _, err := a.lockSKU(sku, ifMatch); err != nil {
			return nil, false, err
		}
	}
	// The movement is the SKU's last change of on_hand (see settleSKU): the
	// row takes the movement's stamp, taken as the UPDATE that moves
	// on_hand (and waits for the row lock) is sent.
	now := time.Now().UTC().Truncate(time.Microsecond)
	res := a.tx.Exec(`UPDATE skus SET on_hand = on_hand + ?, seq = seq + 1, level_dirty = 1,
		on_hand_position = movement_position + 1, on_hand_moved_at = ?, movement_position = movement_position + 1
		WHERE sku = ? AND on_hand <> -1 AND on_hand + ? >= reserved AND on_hand + ? <= ?`,
		delta, now, sku, delta, delta, int64(MaxStock))
	if res.Error != nil {
		return nil, false, res.Error
	}
	if res.RowsAffected == 0 {
		return nil, false, a.whyNotRestocked(sku, delta)
	}
	kind := MoveRestock
	if delta < 0 {
		kind = MoveCorrection
	}
	m, last, err := a.levelsAfter([]string{sku})
	if err != nil {
		return nil, false, err
	}
	return m, false, a.moved([]Movement{{SKU: sku, Kind: kind, OnHandDelta: delta, Reason: reason, Reference: reference, CreatedAt: now}}, last)
}

// lockSKU reads sku's row under its lock (an empty slice: no such SKU) and
// checks it against ifMatch.
func (a Arbiter) lockSKU(sku string, ifMatch []string) ([]SKU, error) {
	var cur []SKU
	if err := a.tx.Clauses(clause.Locking{Strength: "UPDATE"}).Where("sku = ?", sku).Find(&cur).Error; err != nil {
		return nil, err
	}
	var rec *SKU
	if len(cur) == 1 {
		rec = &cur[0]
	}
	if !matches(rec, ifMatch) {
		if rec == nil {
			return nil, fmt.Errorf("%w: %s does not exist", inventory.ErrPrecondition, sku)
		}
		return nil, fmt.Errorf("%w: %s is at version %s now", inventory.ErrPrecondition, sku, rec.Version())
	}
	return cur, nil
}

// referenceSeen records (sku, reference) for an adjust of delta, or finds it
// recorded: a replay when with the same delta, a conflict with another. The
// row's key lock serialises adjusts racing under one reference.
func (a Arbiter) referenceSeen(sku string, delta int64, reason, reference string) (bool, error) {
	res := a.tx.Clauses(clause.OnConflict{DoNothing: true}).Create(&Adjustment{SKU: sku, Reference: reference, Delta: delta, Reason: reason})
	if res.Error != nil || res.RowsAffected == 1 {
		return false, res.Error
	}
	var first Adjustment
	if err := a.tx.Clauses(clause.Locking{Strength: "UPDATE"}).Take(&first, "sku = ? AND reference = ?", sku, reference).Error; err != nil {
		return false, err
	}
	if first.Delta != delta {
		return false, fmt.Errorf("%w: reference %q adjusted %s by %d already", inventory.ErrConflict, reference, sku, first.Delta)
	}
	return true, nil
}

func (a Arbiter) whyNotRestocked(sku string, delta int64) error {
	var cur []SKU
	if err := a.tx.Where("sku = ?", sku).Find(&cur).Error; err != nil {
		return err
	}
	switch {
	case len(cur) == 0:
		return inventory.UnknownSKU(sku)
	case cur[0].OnHand == inventory.Unlimited:
		return fmt.Errorf("%w: %s has unlimited stock; set a stock first", inventory.ErrConflict, sku)
	case cur[0].OnHand+delta > MaxStock:
		return fmt.Errorf("%w: stock would exceed %d", inventory.ErrInvalidArgument, int64(MaxStock))
	}
	return fmt.Errorf("%w: %d units are reserved; stock cannot go to %d", inventory.ErrConflict, cur[0].Reserved, cur[0].OnHand+delta)
}

// FixReserved sets sku's reserved to the sum of its live reservations in
// one UPDATE, under the row lock (refused by the CHECK if on_hand cannot
// cover it: that needs an operator), and records the repair as a CORRECTION
// of reserved. The same UPDATE counts the movement when reserved moves:
// movement_position's term comes before reserved's, so MySQL (which
// assigns left to right) and SQLite both compare the old value.
func (a Arbiter) FixReserved(sku string) error {
	var before, after []int64
	if err := a.tx.Model(&SKU{}).Clauses(clause.Locking{Strength: "UPDATE"}).Where("sku = ?", sku).
		Pluck("reserved", &before).Error; err != nil || len(before) == 0 {
		return err
	}
	// Under the row lock no sale of the SKU commits: its holds the lean
	// sale recorded are projected first, so the sum below counts them.
	// What still commits (a campaign's sale or give-back, a payment) does
	// not change the sum, read from one snapshot taken after the lock.
	if err := a.ProjectSKU(sku); err != nil {
		return err
	}
	live, err := a.Live(sku)
	if err != nil {
		return err
	}
	if err := a.tx.Exec(`UPDATE skus SET seq = seq + 1, level_dirty = 1,
		movement_position = movement_position + CASE WHEN reserved = ? THEN 0 ELSE 1 END,
		reserved = ? WHERE sku = ?`, live, live, sku).Error; err != nil {
		return err
	}
	if err := a.tx.Model(&SKU{}).Where("sku = ?", sku).Pluck("reserved", &after).Error; err != nil {
		return err
	}
	_, last, err := a.levelsAfter([]string{sku})
	if err != nil || after[0] == before[0] {
		return err
	}
	return a.moved([]Movement{{SKU: sku, Kind: MoveCorrection, ReservedDelta: after[0] - before[0],
		Reason: "reconcile: reserved set to the sum of live reservations"}}, last)
}

// NewEpoch numbers a new Redis initialisation of sku and returns the level
// Redis is to start from: on_hand - reserved (or Unlimited), the epoch, and
// the seq it reflects. The row stays locked until the caller commits, so no
// change of available slips between the read and the Redis write.
func (a Arbiter) NewEpoch(sku string) (inventory.Baseline, error) {
	epoch := 1 + rand.Int64N(1<<52) // exact in a Lua number
	if err := a.tx.Exec(`UPDATE skus SET redis_epoch = ? WHERE sku = ?`, epoch, sku).Error; err != nil {
		return inventory.Baseline{}, err
	}
	var rows []struct {
		OnHand, Reserved, Seq, PerUserLimit int64
	}
	if err := a.tx.Raw(`SELECT on_hand, reserved, seq, per_user_limit FROM skus WHERE sku = ?`, sku).Scan(&rows).Error; err != nil {
		return inventory.Baseline{}, err
	}
	if len(rows) == 0 {
		return inventory.Baseline{}, inventory.ErrUnknownSKU
	}
	lv := inventory.Baseline{Available: rows[0].OnHand - rows[0].Reserved, Epoch: epoch, Seq: rows[0].Seq}
	if rows[0].OnHand == inventory.Unlimited {
		lv.Available = inventory.Unlimited
	}
	if rows[0].PerUserLimit > 0 {
		buyers, err := a.Buyers(sku)
		if err != nil {
			return inventory.Baseline{}, err
		}
		lv.Buyers = buyers
	}
	return lv, nil
}

// Buyers reads what each buyer of sku holds or bought against its per-user
// limit (buyer_quotas), the counts above zero, user -> units. Every change
// of a count commits in a transaction that also bumps the SKU's seq under
// its row lock, so read with NewEpoch (under that lock) it is the counts as
// of the baseline's seq. Its cost is one row per such buyer.
func (a Arbiter) Buyers(sku string) (map[string]int64, error) {
	var rows []struct {
		UserID string `gorm:"column:user_id"`
		Qty    int64  `gorm:"column:qty"`
	}
	if err := a.tx.Raw(`SELECT user_id, qty FROM buyer_quotas WHERE sku = ? AND qty > 0`, sku).Scan(&rows).Error; err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(rows))
	for _, r := range rows {
		out[r.UserID] = r.Qty
	}
	return out, nil
}

// recordedAnomalies returns the delivery's operations already recorded as
// anomalies: handled, not to be recorded or applied again. Read under the
// SKU rows' locks, so no other applier records one meanwhile.
func (a Arbiter) recordedAnomalies(skus []string, bySKU map[string][]StockMessage) (map[opKey]bool, error) {
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
	if err := a.tx.Raw(`SELECT token, sku, op FROM stock_anomalies WHERE sku IN ? AND token IN ?`, skus, tokens).
		Scan(&rows).Error; err != nil {
		return nil, err
	}
	done := make(map[opKey]bool, len(rows))
	for _, r := range rows {
		done[opKey{r.Token, r.SKU, r.Op}] = true
	}
	return done, nil
}

// moved writes the movements of a change, in one multi-row INSERT, numbered
// up to last: each SKU's movement_position as the change's UPDATE left it.
func (a Arbiter) moved(ms []Movement, last positions) error { return a.insertMovements(ms, last) }
