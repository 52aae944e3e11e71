package arbiter

import (
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/acme/inventory"
)

// A flash-sale campaign sells an allotment of one SKU within a window. Its
// unsold units are one reservation row of the SKU, the pool (token
// CampaignToken(id), HELD while the campaign runs, its qty what the
// campaign has left, its expires_at the end of the window), so the SKU's
// reserved counts them, regular sales can never take them, and the CHECK,
// reconcile and the movements' sums need nothing new:
//
//   - putting a campaign carves its allotment out of the SKU's available
//     units (a RESERVE movement of the pool); changing the allotment moves
//     the difference, never below what was sold and is held;
//   - a campaign sale moves a unit from the pool to the order's
//     reservation (a row naming the campaign), under one conditional UPDATE
//     of the pool per campaign per batch that the database's clock, not the
//     node's, lets through only within the window; the SKU's reserved does
//     not change;
//   - a campaign order released while the pool is HELD gives its units back
//     to the pool; after the end, to the SKU;
//   - the end releases the pool: the unsold rest returns to the SKU in one
//     RELEASE movement. The timeout sweep does it at ends_at (the pool is a
//     hold that expires then), EndCampaign at once.
//
// The pool's result column counts its changes (the seq that fences its
// Redis copy, as skus.seq fences a SKU's), campaigns.redis_epoch its Redis
// initialisations.

// CampaignToken is the token of campaign id's pool, and the key of its
// per-user limit in buyer_quotas. ":" is in no SKU and in no token the
// other namespaces make ("t." + a client token, order ids).
func CampaignToken(id string) string { return "c:" + id }

// Campaign is a campaign's record.
type Campaign struct {
	ID           string    `gorm:"primaryKey" json:"id"`
	SKU          string    `gorm:"column:sku" json:"sku"`
	Allotment    int64     `json:"allotment"`
	StartsAt     time.Time `json:"starts_at"`
	EndsAt       time.Time `json:"ends_at"`
	PerUserLimit int64     `json:"per_user_limit"`
	HoldSeconds  int64     `json:"hold_seconds"`
	RedisEpoch   int64     `json:"-"`
	Rev          int64     `json:"-"`
	CreatedAt    time.Time `json:"created_at"`
	UpdatedAt    time.Time `json:"updated_at"`
}

func (Campaign) TableName() string { return "campaigns" }

// Version is the campaign's entity tag (If-Match).
func (c Campaign) Version() string { return fmt.Sprintf("c%d", c.Rev) }

// CampaignChange is a change of a campaign pool's units the database
// committed, for its Redis copy: Delta at the pool's change counter Seq.
type CampaignChange struct {
	ID, SKU string
	Delta   int64
	Seq     int64
}

// CampaignRefusedError: the database refused a campaign sale; Err says why
// (inventory.ErrNotStarted, inventory.ErrEnded, inventory.ErrInsufficientStock,
// inventory.ErrNotFound).
type CampaignRefusedError struct {
	ID  string
	Err error
}

func (e CampaignRefusedError) Error() string {
	return fmt.Sprintf("campaign %s: the database refused the sale: %v", e.ID, e.Err)
}

func (e CampaignRefusedError) Unwrap() error { return e.Err }

// dbNow is the database's clock as SQL: the window of a campaign is decided
// by it, so a node whose clock runs fast cannot sell early. The embedded
// SQLite runs in the process: its clock is the node's.
func (a Arbiter) dbNow() (string, []any) {
	if a.dialect == "sqlite" {
		return "?", []any{time.Now().UTC()}
	}
	return "UTC_TIMESTAMP(6)", nil
}

// PutCampaign creates campaign c, or changes it to c (ifMatch: its version
// must be one of them, or "*" for any). Creating carves c.Allotment out of
// the SKU's available units (RefusedError when they cannot cover it).
// Refused with inventory.ErrConflict: another campaign of the SKU whose
// window overlaps; an allotment below what the campaign sold and holds; a
// change of the SKU; a change of a campaign that ended. The returned
// changes bring the SKU's Redis value along (nil when the allotment did not
// change); the caller writes the pool's Redis copy again from the database
// (its window may have changed too).
func (a Arbiter) PutCampaign(c Campaign, ifMatch []string, now time.Time) ([]inventory.Change, error) {
	var cur []Campaign
	if err := a.tx.Clauses(clause.Locking{Strength: "UPDATE"}).Where("id = ?", c.ID).Find(&cur).Error; err != nil {
		return nil, err
	}
	if len(ifMatch) > 0 && (len(cur) == 0 || !slices.Contains(ifMatch, AnyVersion) && !slices.Contains(ifMatch, cur[0].Version())) {
		return nil, fmt.Errorf("%w: campaign %s is not at the version If-Match names", inventory.ErrPrecondition, c.ID)
	}
	if len(cur) > 0 && cur[0].SKU != c.SKU {
		return nil, fmt.Errorf("%w: campaign %s sells %s; its SKU cannot change", inventory.ErrConflict, c.ID, cur[0].SKU)
	}
	var s []SKU
	if err := a.tx.Clauses(clause.Locking{Strength: "UPDATE"}).Where("sku = ?", c.SKU).Find(&s).Error; err != nil {
		return nil, err
	}
	if len(s) == 0 {
		return nil, inventory.UnknownSKU(c.SKU)
	}
	if s[0].OnHand == inventory.Unlimited {
		return nil, inventory.Invalidf("sku %s has unlimited stock: a campaign needs an allotment of a limited SKU", c.SKU)
	}
	var overlapping int64
	if err := a.tx.Model(&Campaign{}).Where("sku = ? AND id <> ? AND starts_at < ? AND ends_at > ?", c.SKU, c.ID, c.EndsAt, c.StartsAt).
		Count(&overlapping).Error; err != nil {
		return nil, err
	}
	if overlapping > 0 {
		return nil, fmt.Errorf("%w: another campaign of %s overlaps %s to %s", inventory.ErrConflict, c.SKU,
			c.StartsAt.Format(time.RFC3339), c.EndsAt.Format(time.RFC3339))
	}
	token := CampaignToken(c.ID)
	if len(cur) == 0 {
		c.CreatedAt, c.UpdatedAt, c.Rev = now, now, 1
		if err := a.tx.Create(&c).Error; err != nil {
			if IsDuplicate(err) {
				return nil, fmt.Errorf("%w: %w", errInsertRaced, err)
			}
			return nil, err
		}
		if s[0].Available() < c.Allotment {
			return nil, RefusedError{c.SKU}
		}
		row := Reservation{Token: token, SKU: c.SKU, Qty: c.Allotment, State: Held, ExpiresAt: c.EndsAt,
			CreatedAt: now, UpdatedAt: now, CampaignID: &c.ID}
		if err := a.insertReservations([]Reservation{row}); err != nil {
			return nil, err
		}
		return a.movePool(c.ID, c.SKU, c.Allotment, true)
	}
	old := cur[0]
	p, err := a.pool(c.ID)
	if err != nil {
		return nil, err
	}
	if p.State != Held {
		return nil, fmt.Errorf("%w: campaign %s has ended", inventory.ErrConflict, c.ID)
	}
	delta := c.Allotment - old.Allotment
	if p.Qty+delta < 0 {
		return nil, fmt.Errorf("%w: campaign %s sold and holds %d units; its allotment cannot go to %d",
			inventory.ErrConflict, c.ID, old.Allotment-p.Qty, c.Allotment)
	}
	if delta > 0 && s[0].Available() < delta {
		return nil, RefusedError{c.SKU}
	}
	if err := a.tx.Model(&Campaign{}).Where("id = ?", c.ID).Updates(map[string]any{
		"allotment": c.Allotment, "starts_at": c.StartsAt, "ends_at": c.EndsAt, "per_user_limit": c.PerUserLimit,
		"hold_seconds": c.HoldSeconds, "rev": gorm.Expr("rev + 1"), "updated_at": now,
	}).Error; err != nil {
		return nil, err
	}
	if err := a.tx.Model(&Reservation{}).Where("token = ? AND sku = ?", token, c.SKU).
		Update("expires_at", c.EndsAt).Error; err != nil {
		return nil, err
	}
	if delta == 0 {
		return nil, nil
	}
	return a.movePool(c.ID, c.SKU, delta, false)
}

// movePool moves delta units between sku's available units and the pool
// of campaign id (delta > 0: into the pool; the pool's row already holds
// them when created), with its movement, and returns the SKU's change
// for Redis (the caller writes the pool's Redis copy again whole).
func (a Arbiter) movePool(id, sku string, delta int64, created bool) ([]inventory.Change, error) {
	if err := a.tx.Exec(`UPDATE skus SET reserved = reserved + ?, seq = seq + 1, level_dirty = 1, movement_position = movement_position + 1
		WHERE sku = ?`, delta, sku).Error; err != nil {
		return nil, err
	}
	if !created {
		if err := a.tx.Exec(`UPDATE stock_reservations SET qty = qty + ?, result = result + 1 WHERE token = ? AND sku = ?`,
			delta, CampaignToken(id), sku).Error; err != nil {
			return nil, err
		}
	}
	kind := MoveReserve
	if delta < 0 {
		kind = MoveRelease
	}
	fences, last, err := a.levelsAfter([]string{sku})
	if err != nil {
		return nil, err
	}
	if err := a.moved([]Movement{{SKU: sku, Kind: kind, ReservedDelta: delta, Reference: tokenRef(CampaignToken(id))}}, last); err != nil {
		return nil, err
	}
	if !created { // a shrink to what is sold and held, or a growth from it
		p, err := a.poolAfter(id)
		if err != nil {
			return nil, err
		}
		if err := a.poolMoved(id, sku, p, false); err != nil {
			return nil, err
		}
	}
	return Changes(map[string]int64{sku: delta}, fences, -1), nil
}

// pool reads campaign id's pool row under a lock: its qty moves with every
// sale and give-back, and the caller decides on it.
func (a Arbiter) pool(id string) (Reservation, error) {
	var rows []Reservation
	if err := a.tx.Clauses(clause.Locking{Strength: "UPDATE"}).Where("token = ?", CampaignToken(id)).Find(&rows).Error; err != nil {
		return Reservation{}, err
	}
	if len(rows) != 1 {
		return Reservation{}, fmt.Errorf("%w: campaign %s has no pool", inventory.ErrNotFound, id)
	}
	return rows[0], nil
}

// takeFromPools moves want[id] units of each campaign's pool to its sales,
// each under one conditional UPDATE that the database's clock lets through
// only within the window: CampaignRefusedError otherwise. Campaigns in
// sorted order: concurrent writers never deadlock. The pool's change
// counter (result) moves by one, or by lean[id] when the campaign has
// that many lean holds among them: they are numbered by it, up to
// holdSeq[id] (the pool's row lock orders a campaign's sales).
//
// The UPDATE's check of the window locks the campaign's row exclusively
// (FOR UPDATE), before the pool's: MariaDB evaluates that subquery first.
// The sale that takes the last unit writes the row (campaign.sold_out);
// a shared lock upgraded then deadlocked with the other group commit's
// sale, which held it shared and waited for the pool, and with a
// give-back waiting to lock it. Sales of a campaign queue on its pool's
// row anyway; now they queue one row earlier, at no statement more.
func (a Arbiter) takeFromPools(want map[string]int64, skuOf map[string]string, lean map[string]int64) (fences map[string]Fence, holdSeq map[string]int64, err error) {
	now, args := a.dbNow()
	lock := " FOR UPDATE"
	if a.dialect == "sqlite" { // one connection, one writer: no row locks
		lock = ""
	}
	fences, holdSeq = make(map[string]Fence, len(want)), map[string]int64{}
	for _, id := range sortedKeys(want) {
		q := append([]any{want[id], max(lean[id], 1), CampaignToken(id), skuOf[id], want[id]}, args...)
		q = append(q, id)
		q = append(q, args...)
		n, err := a.exec(`UPDATE stock_reservations SET qty = qty - ?, result = result + ?
			WHERE token = ? AND sku = ? AND state = 'HELD' AND qty >= ? AND expires_at > `+now+`
			AND EXISTS (SELECT 1 FROM campaigns WHERE id = ? AND starts_at <= `+now+lock+`)`, q...)
		if err != nil {
			return nil, nil, err
		}
		if n == 0 {
			return nil, nil, a.whyNotSold(id, want[id])
		}
		p, err := a.poolAfter(id)
		if err != nil {
			return nil, nil, err
		}
		if err := a.poolMoved(id, skuOf[id], p, true); err != nil {
			return nil, nil, err
		}
		fences[id], holdSeq[id] = p.fence(), p.Seq
	}
	return fences, holdSeq, nil
}

// whyNotSold says why the pool of campaign id could not give qty units, by
// the database's clock.
func (a Arbiter) whyNotSold(id string, qty int64) error {
	now, args := a.dbNow()
	var st []struct {
		Early, Late bool
		Qty         int64
	}
	q := append(append([]any{}, args...), args...)
	q = append(q, CampaignToken(id))
	if err := a.query(func(rows *sql.Rows) error {
		var s struct {
			Early, Late bool
			Qty         int64
		}
		if err := rows.Scan(&s.Early, &s.Late, &s.Qty); err != nil {
			return err
		}
		st = append(st, s)
		return nil
	}, `SELECT c.starts_at > `+now+` AS early, (r.state <> 'HELD' OR r.expires_at <= `+now+`) AS late, r.qty
		FROM campaigns c JOIN stock_reservations r ON r.campaign_id = c.id WHERE r.token = ?`, q...); err != nil {
		return err
	}
	switch {
	case len(st) == 0:
		return CampaignRefusedError{id, fmt.Errorf("%w: no campaign %s", inventory.ErrNotFound, id)}
	case st[0].Early:
		return CampaignRefusedError{id, inventory.ErrNotStarted}
	case st[0].Late:
		return CampaignRefusedError{id, inventory.ErrEnded}
	}
	return CampaignRefusedError{id, fmt.Errorf("%w: campaign %s has %d left, not %d", inventory.ErrInsufficientStock, id, st[0].Qty, qty)}
}

// campaignLimits reads the per-user limits of the campaigns holds name
// with a buyer; campaigns without a limit are absent. Keyed by their quota
// key.
func (a Arbiter) campaignLimits(ids []string) (map[string]int64, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	out := map[string]int64{}
	if err := a.query(func(rows *sql.Rows) error {
		var id string
		var limit int64
		if err := rows.Scan(&id, &limit); err != nil {
			return err
		}
		out[CampaignToken(id)] = limit
		return nil
	}, inList("SELECT `id`,`per_user_limit` FROM `campaigns` WHERE id IN ? AND per_user_limit > 0", len(ids)), anys(ids)...); err != nil {
		return nil, err
	}
	return out, nil
}

// returnToPools gives released campaign sales back to their pools where
// the pool is still HELD, and returns those that found their campaign
// ended (they go back to the SKU) and the pools' changes. Their
// campaigns' rows are locked first (lockCampaigns).
func (a Arbiter) returnToPools(rows []Reservation) (toSKU []Reservation, chs []CampaignChange, err error) {
	var ids []string
	for _, r := range rows {
		if r.CampaignID != nil && r.Token != CampaignToken(*r.CampaignID) {
			ids = append(ids, *r.CampaignID)
		}
	}
	if err := a.lockCampaigns(ids); err != nil {
		return nil, nil, err
	}
	for _, r := range rows {
		if r.CampaignID == nil || r.Token == CampaignToken(*r.CampaignID) {
			toSKU = append(toSKU, r)
			continue
		}
		id := *r.CampaignID
		res := a.tx.Exec(`UPDATE stock_reservations SET qty = qty + ?, result = result + 1 WHERE token = ? AND state = 'HELD'`,
			r.Qty, CampaignToken(id))
		if res.Error != nil {
			return nil, nil, res.Error
		}
		if res.RowsAffected == 0 { // ended: the units go back to the SKU
			toSKU = append(toSKU, r)
			continue
		}
		p, err := a.poolAfter(id)
		if err != nil {
			return nil, nil, err
		}
		if err := a.poolMoved(id, r.SKU, p, false); err != nil {
			return nil, nil, err
		}
		chs = append(chs, CampaignChange{ID: id, SKU: r.SKU, Delta: r.Qty, Seq: p.Seq})
	}
	return toSKU, chs, nil
}

// lockCampaigns locks the rows of campaigns ids, in id order (one
// statement; none without ids), before a give-back touches their pools.
// A campaign's rows are locked campaign first, then pool, everywhere: a
// sale's pool UPDATE locks the campaign's row (the window it checks)
// before the pool's, and a give-back that lifts a sold-out pool writes
// the campaign's row (campaign.back_in_stock) after the pool's. Had the
// give-back locked the pool first, the two would deadlock at every
// sold-out/back crossing, the flash sale's hottest moment.
func (a Arbiter) lockCampaigns(ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	ids = slices.Clone(ids)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	var locked []string
	return a.tx.Model(&Campaign{}).Clauses(clause.Locking{Strength: "UPDATE"}).Where("id IN ?", ids).Order("id").
		Pluck("id", &locked).Error
}

// EndCampaign ends campaign id now (by the database's clock, if its window
// is still open): its window closes and its pool is released, the unsold
// rest returning to the SKU in one movement. Ending an ended campaign
// changes nothing.
func (a Arbiter) EndCampaign(id string, now time.Time) (Freed, error) {
	var c []Campaign
	if err := a.tx.Clauses(clause.Locking{Strength: "UPDATE"}).Where("id = ?", id).Find(&c).Error; err != nil {
		return Freed{}, err
	}
	if len(c) == 0 {
		return Freed{}, fmt.Errorf("%w: no campaign %s", inventory.ErrNotFound, id)
	}
	if c[0].EndsAt.After(now) {
		// A campaign ended before its opening keeps a window of a
		// millisecond before now (Redis keeps windows to the millisecond:
		// an empty one would not be written there, and Redis would go on
		// with the old).
		if err := a.tx.Model(&Campaign{}).Where("id = ?", id).Updates(map[string]any{
			"ends_at": now, "starts_at": gorm.Expr("CASE WHEN starts_at > ? THEN ? ELSE starts_at END", now.Add(-time.Millisecond), now.Add(-time.Millisecond)),
			"rev": gorm.Expr("rev + 1"), "updated_at": now,
		}).Error; err != nil {
			return Freed{}, err
		}
		if err := a.tx.Model(&Reservation{}).Where("token = ? AND state = ?", CampaignToken(id), Held).
			Update("expires_at", now).Error; err != nil {
			return Freed{}, err
		}
	}
	return a.Release(CampaignToken(id), "")
}

// CampaignCounts is where a campaign's allotment is: sold (paid, applied or
// not; refunds not counted back), held (unpaid orders), left (in the pool;
// what returned to the SKU once it ended), and whether the pool was
// released (ended).
type CampaignCounts struct {
	Sold, Held, Left int64
	Ended            bool
}

// CountCampaign reads campaign id's counts from one snapshot: the
// projection's, and the holds the lean sale recorded that have no
// projection yet (held: nothing changes a hold before its projection).
func CountCampaign(db *gorm.DB, id string) (CampaignCounts, error) {
	var out CampaignCounts
	err := db.Transaction(func(tx *gorm.DB) error {
		var rows []struct {
			State ResState
			Pool  bool
			Qty   int64
		}
		// The cursor of its holds, when the pool changed past it, comes
		// with the counts (state CURSOR): one statement when it did not.
		if err := tx.Raw(`SELECT state, token = ? AS pool, SUM(qty) AS qty FROM stock_reservations
			WHERE campaign_id = ? GROUP BY state, token = ?
			UNION ALL SELECT 'CURSOR', 0, c.projected_seq FROM `+campaignPool+` WHERE c.id = ? AND `+poolChanged,
			CampaignToken(id), id, CampaignToken(id), id).Scan(&rows).Error; err != nil {
			return err
		}
		out = CampaignCounts{}
		var cursor []int64
		for _, r := range rows {
			switch {
			case r.State == "CURSOR":
				cursor = append(cursor, r.Qty)
			case r.Pool:
				out.Left, out.Ended = r.Qty, r.State != Held
			case r.State == Held:
				out.Held += r.Qty
			case r.State == Committed, r.State == Sold, r.State == Restored:
				out.Sold += r.Qty
			}
		}
		if len(cursor) == 0 {
			return nil
		}
		unprojected, err := In(tx).unprojected(cursorRow{id: id, campaign: true, projected: cursor[0]})
		out.Held += unprojected
		return err
	})
	return out, err
}

// unprojected sums the units of d's holds past its cursor that have no
// projection (in the caller's snapshot), in one statement that reads of
// each hold its key and units alone: a hold is projected when a
// reservation has its token (holdToken), found on its primary key.
func (a Arbiter) unprojected(d cursorRow) (int64, error) {
	var n int64
	q, args := d.past(d.projected)
	err := a.query(func(rs *sql.Rows) error { return rs.Scan(&n) }, `SELECT COALESCE(SUM(h.qty), 0) FROM holds h `+q+
		` AND NOT EXISTS (SELECT 1 FROM stock_reservations r WHERE r.token = `+holdToken+`)`, args...)
	return n, err
}

// holdToken is heldRow.token in SQL for a row of holds (h), in both
// dialects: its name, or its id as a UUID's text (lower-case hex, dashed
// 8-4-4-4-12; SQLite has CONCAT_WS since 3.44).
const holdToken = `COALESCE(h.name, LOWER(CONCAT_WS('-', SUBSTR(HEX(h.id), 1, 8), SUBSTR(HEX(h.id), 9, 4),
	SUBSTR(HEX(h.id), 13, 4), SUBSTR(HEX(h.id), 17, 4), SUBSTR(HEX(h.id), 21))))`

// CampaignBaseline reads campaign id's pool for a Redis initialisation
// under the pool's row lock, with a new epoch: its units left, epoch, seq
// and window, and the buyers' counts against its per-user limit (those
// above zero; none without a limit), which every sale and release moves
// under the same lock with a bump of the pool's seq. inventory.ErrNotFound
// when there is none; inventory.ErrEnded, with nothing written, once the
// campaign has ended (its pool released, or its window closed by the
// database's clock): an ended campaign has nothing in Redis, and an
// initialisation must not write it there again.
func (a Arbiter) CampaignBaseline(id string) (Campaign, inventory.Baseline, error) {
	// The campaign's row first, then the pool's, as a sale locks them
	// (lockCampaigns): the new epoch is written to the campaign's row.
	var c Campaign
	if err := a.tx.Clauses(clause.Locking{Strength: "UPDATE"}).Take(&c, "id = ?", id).Error; err != nil {
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return Campaign{}, inventory.Baseline{}, fmt.Errorf("%w: no campaign %s", inventory.ErrNotFound, id)
		}
		return Campaign{}, inventory.Baseline{}, err
	}
	var p []Reservation
	if err := a.tx.Clauses(clause.Locking{Strength: "UPDATE"}).Where("token = ?", CampaignToken(id)).Find(&p).Error; err != nil {
		return Campaign{}, inventory.Baseline{}, err
	}
	if len(p) == 0 {
		return Campaign{}, inventory.Baseline{}, fmt.Errorf("%w: no campaign %s", inventory.ErrNotFound, id)
	}
	ended := p[0].State != Held
	if !ended {
		now, err := a.dbClock()
		if err != nil {
			return Campaign{}, inventory.Baseline{}, err
		}
		ended = !c.EndsAt.After(now)
	}
	if ended {
		return Campaign{}, inventory.Baseline{}, fmt.Errorf("%w: campaign %s", inventory.ErrEnded, id)
	}
	if err := a.tx.Model(&Campaign{}).Where("id = ?", id).Update("redis_epoch", gorm.Expr("redis_epoch + 1")).Error; err != nil {
		return Campaign{}, inventory.Baseline{}, err
	}
	if err := a.tx.Take(&c, "id = ?", id).Error; err != nil {
		return Campaign{}, inventory.Baseline{}, err
	}
	b := inventory.Baseline{Available: p[0].Qty, Epoch: c.RedisEpoch, Seq: p[0].Result}
	if c.PerUserLimit > 0 {
		var err error
		if b.Buyers, err = a.Buyers(CampaignToken(id)); err != nil {
			return Campaign{}, inventory.Baseline{}, err
		}
	}
	return c, b, nil
}
