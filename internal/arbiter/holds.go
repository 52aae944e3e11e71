package arbiter

import (
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"
)

// The lean sale (issue 43, docs/design.md "The lean sale"): a hold the sale
// records lean is one row of holds, written once and never changed, and
// no orders, stock_reservations or RESERVE movement row in the sale's
// commit. Those are its projection, written after it by the projector
// (ProjectBacklog) or by the first path that needs the hold (ProjectHold),
// either way idempotently; every change after the sale happens on the
// projection, as before.

// holdKey is the primary key of a hold's row: an order's id as its
// UUIDv7's 16 bytes (line numbers its lines), or for a token's hold the
// first 16 bytes of SHA-256 of its SKU and key ("t." + the client's
// token), whose name is stored in the row and compared on every lookup.
// ok is false for an id that is not a UUID (no order of the lean sale has
// it).
func holdKey(r Reservation) (id holdID, ok bool) {
	if r.OrderID != nil {
		u, err := uuid.Parse(*r.OrderID)
		if err != nil {
			return nil, false
		}
		return holdID(u[:]), true
	}
	return tokenHoldID(r.SKU, r.Token), true
}

func tokenHoldID(sku, token string) holdID {
	h := sha256.Sum256([]byte(sku + "\x00" + token))
	return h[:16]
}

// holdID is a hold's 16-byte key as a statement's argument: one value
// (GORM would spread a bare []byte over as many placeholders).
type holdID []byte

func (k holdID) Value() (driver.Value, error) { return []byte(k), nil }

// SKUID is a SKU's integer in holds' (sku_id, seq) index: the first 8
// bytes of SHA-256 of its name. Two SKUs may share one; every reader of
// the index filters on the name too.
func SKUID(sku string) int64 {
	h := sha256.Sum256([]byte(sku))
	return int64(binary.BigEndian.Uint64(h[:8]))
}

// PoolID is a campaign's integer in holds' (sku_id, seq) index: its
// holds are numbered by the campaign's own hold_seq, not by its SKU's
// positions, so they have a range of their own (SKUID of the pool's
// token, which no SKU has: ":" is in none). Readers filter on the
// campaign too.
func PoolID(campaign string) int64 { return SKUID(CampaignToken(campaign)) }

var holdColumns = []string{"id", "line", "sku_id", "seq", "sku", "qty", "result", "name", "buyer", "quota", "campaign_id", "deadline", "created_at"}

// leanHold is a hold to write as a row of holds: row is its reservation
// as Reserve counted it (Buyer set: the buyer's quota counts it, and its
// release gives it back), seq its place in its SKU's movements or, for a
// campaign's sale, in its campaign's holds.
type leanHold struct {
	Hold
	row Reservation
	seq int64
}

// insertHolds writes the lean holds of a sale in one statement.
func (a Arbiter) insertHolds(holds []leanHold) error {
	if len(holds) == 0 {
		return nil
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	args := make([]any, 0, len(holds)*len(holdColumns))
	for i, h := range holds {
		r := h.Row
		id, ok := holdKey(r)
		if !ok {
			return fmt.Errorf("arbiter: a lean hold of order %q, which is not a UUID", *r.OrderID)
		}
		var name, buyer *string
		if r.OrderID == nil {
			name = &holds[i].Row.Token
		}
		if h.Buyer != "" {
			buyer = &holds[i].Buyer
		}
		place := SKUID(r.SKU)
		if r.CampaignID != nil {
			place = PoolID(*r.CampaignID)
		}
		args = append(args, id, h.Line, place, h.seq, r.SKU, r.Qty, r.Result, name, buyer,
			h.row.Buyer != nil, r.CampaignID, r.ExpiresAt, stamp(r.CreatedAt, now))
	}
	return a.insertRows("holds", holdColumns, args)
}

// movedOrHeld numbers a sale's RESERVE movements (moves[k] is the
// reservation of holds[plainHold[k]]) and writes the classic ones; the
// lean ones are returned at their positions, for insertHolds.
func (a Arbiter) movedOrHeld(holds []Hold, rows []Reservation, moves []Movement, plainHold []int, last positions) ([]leanHold, error) {
	if err := numberMovements(moves, last); err != nil {
		return nil, err
	}
	var classic []Movement
	var lean []leanHold
	for k, m := range moves {
		i := plainHold[k]
		if holds[i].Lean {
			lean = append(lean, leanHold{Hold: holds[i], row: rows[i], seq: m.Position})
		} else {
			classic = append(classic, m)
		}
	}
	if len(classic) > 0 {
		if err := a.insertNumbered(classic); err != nil {
			return nil, err
		}
	}
	return lean, nil
}

// heldRow is one row of holds as the projection reads it.
type heldRow struct {
	id       []byte
	line     int
	seq      int64
	sku      string
	qty      int64
	result   int64
	name     sql.NullString
	buyer    sql.NullString
	quota    bool
	campaign sql.NullString
	deadline time.Time
	created  time.Time
}

const heldSelect = `SELECT id, line, seq, sku, qty, result, name, buyer, quota, campaign_id, deadline, created_at FROM holds `

func scanHeld(out *[]heldRow) func(*sql.Rows) error {
	return func(rs *sql.Rows) error {
		var h heldRow
		if err := rs.Scan(&h.id, &h.line, &h.seq, &h.sku, &h.qty, &h.result, &h.name, &h.buyer, &h.quota, &h.campaign, &h.deadline, &h.created); err != nil {
			return err
		}
		*out = append(*out, h)
		return nil
	}
}

// token is the reservation token a held row is projected under: the
// order's id, or the token's key.
func (h heldRow) token() (string, bool) {
	if h.name.Valid {
		return h.name.String, false
	}
	u, err := uuid.FromBytes(h.id)
	if err != nil {
		return "", false
	}
	return u.String(), true
}

// ProjectHold writes the projection of the hold of an order (id, an
// order's id) or of a token's hold (sku and the token's key), if it has a
// row in holds and no projection yet; found reports the row. The path
// that reads or changes one order or token calls it when the projection
// lacks the hold, so a client reads its own write at once after a 201.
func (a Arbiter) ProjectHold(orderID, sku, token string) (found bool, err error) {
	var rows []heldRow
	if orderID != "" {
		u, perr := uuid.Parse(orderID)
		if perr != nil {
			return false, nil
		}
		err = a.query(scanHeld(&rows), heldSelect+`WHERE id = ? ORDER BY line`, holdID(u[:]))
	} else {
		err = a.query(scanHeld(&rows), heldSelect+`WHERE id = ? AND line = 0`, tokenHoldID(sku, token))
		if len(rows) == 1 && (rows[0].name.String != token || rows[0].sku != sku) {
			return false, fmt.Errorf("arbiter: token %q of %s and token %q of %s share a hold key", token, sku, rows[0].name.String, rows[0].sku)
		}
	}
	if err != nil || len(rows) == 0 {
		return false, err
	}
	return true, a.projectWhole(rows) // every line of the order: read by its key
}

// Backlog bounds one projector round (ProjectBacklog).
type Backlog struct {
	// SKUs, PerSKU and Holds: up to PerSKU holds of each of up to SKUs
	// SKUs (and as many campaigns), and up to Holds in all, so a round's
	// transaction (and the locks a transition projecting one of its holds
	// waits for) stays short however far behind the projector is.
	SKUs, PerSKU, Holds int
	// After and AfterCampaign are where the round starts: the SKUs (the
	// campaigns) with a backlog are taken in name order from the first
	// after it, round robin, so none starves behind busier ones.
	// ProjectBacklog returns the next ones.
	After, AfterCampaign string
	// Seen, if not nil, is given each hold's created_at (the projection's
	// lag is measured from it).
	Seen func(created time.Time)
}

// Projected is what one projector round did (ProjectBacklog).
type Projected struct {
	// N is how many holds it read; Next and NextCampaign are where the
	// next round starts (Backlog.After, AfterCampaign); More says a bound
	// left holds for it (the next round need not wait).
	N                  int
	Next, NextCampaign string
	More               bool
	// Cursors are the SKUs' and campaigns' cursors to move once the round
	// committed (MoveCursors).
	Cursors []Cursor
}

// Cursor is the projection cursor of a SKU (Campaign false) or of a
// campaign's holds (ID its id) moved from From to To; Done, for a
// campaign, says no hold of it can follow (its pool was released when
// the round read it, and the round projected up to its last change).
type Cursor struct {
	ID             string
	Campaign, Done bool
	From, To       int64
}

// BacklogSQL counts the SKUs and the campaigns whose holds are not all
// projected (a campaign's pool changed past its cursor): 0 once the
// projector caught up. For tests and tools that read the projection
// straight from the database; portable, not for a hot path.
const BacklogSQL = `SELECT (SELECT COUNT(*) FROM skus WHERE holds_dirty = 1) + (SELECT COUNT(*) FROM ` + campaignPool +
	` WHERE ` + poolChanged + `)`

// ProjectBacklog projects the holds of the SKUs and the campaigns whose
// holds are not all projected (holds_dirty), within b's bounds, each one's
// in seq order: what the one-node projector runs. It does not move their
// cursors: a SKU's is on the SKU's row, the hot row every sale updates,
// and a round that waited for one of them in the sales' queue would
// hold, all that time, the locks of the rows it wrote, which the
// payments and cancels of those very orders wait for (a campaign's row
// is its sales' first lock alike). MoveCursors moves them after the
// round committed; a round whose cursors never moved (its node died in
// between) is projected again, harmlessly.
func (a Arbiter) ProjectBacklog(b Backlog) (Projected, error) {
	p := Projected{Next: b.After, NextCampaign: b.AfterCampaign}
	whole := map[string]bool{} // orders this round wrote or found written: a cart's other SKUs skip them
	for _, campaigns := range []bool{false, true} {
		after, next := b.After, &p.Next
		if campaigns {
			after, next = b.AfterCampaign, &p.NextCampaign
		}
		todo, err := a.dirty(campaigns, b.SKUs, after)
		if err == nil {
			err = a.projectTurns(todo, b, &p, next, whole)
		}
		if err != nil {
			return Projected{Next: b.After, NextCampaign: b.AfterCampaign}, err
		}
	}
	return p, nil
}

// projectTurns gives each of todo (SKUs or campaigns with a backlog, in
// name order) its turn of a round, within b's bounds, adding to p, and
// sets next to where the next round of their kind starts.
func (a Arbiter) projectTurns(todo []cursorRow, b Backlog, p *Projected, next *string, whole map[string]bool) error {
	// A full page of SKUs may have more after it. A live campaign is
	// dirty with nothing to do, so a full page of campaigns says so only
	// when one of them had work (else an idle projector with many live
	// campaigns would never pause).
	if len(todo) == b.SKUs && slices.ContainsFunc(todo, func(d cursorRow) bool { return !d.campaign || d.holdSeq > d.projected }) {
		p.More = true
	}
	bounded := false // the round stopped on its bound of holds before every one had its turn
	for _, d := range todo {
		if d.campaign && d.holdSeq <= d.projected { // its pool has not changed past the cursor: no read
			if d.ended {
				p.Cursors = append(p.Cursors, Cursor{ID: d.id, Campaign: true, Done: true, From: d.projected, To: d.projected})
			}
			*next = d.id
			continue
		}
		limit := min(b.PerSKU, b.Holds-p.N)
		if limit <= 0 {
			p.More, bounded = true, true
			break
		}
		rows, err := a.backlog(d, d.projected, limit)
		if err != nil {
			return err
		}
		p.N += len(rows)
		if err := a.project(rows, whole); err != nil {
			return err
		}
		if b.Seen != nil {
			for _, h := range rows {
				b.Seen(h.created)
			}
		}
		// All of them up to the hold_seq this transaction reads, when
		// fewer than limit came back (a hold_seq commits with its holds,
		// and both reads are of one snapshot); else up to the last.
		to := d.holdSeq
		if len(rows) == limit {
			to, p.More = rows[len(rows)-1].seq, true
		}
		done := d.ended && to == d.holdSeq
		p.Cursors = append(p.Cursors, Cursor{ID: d.id, Campaign: d.campaign, Done: done, From: d.projected, To: to})
		*next = d.id
	}
	if len(todo) < b.SKUs && !bounded {
		*next = "" // every one with a backlog had its turn: from the start again
	}
	return nil
}

// MoveCursors moves the projection cursors of a round that committed,
// outside any transaction, each in a statement of its own (a SKU's or campaign's row lock is held
// for that statement alone), the SKUs' then the campaigns', in name
// order. A cursor another round moved meanwhile is left where it is. The
// flag stays set while holds past the cursor remain (a sale that
// committed since, or more than a round's bound).
func (a Arbiter) MoveCursors(cs []Cursor) error {
	cs = slices.Clone(cs)
	slices.SortFunc(cs, func(x, y Cursor) int {
		if x.Campaign != y.Campaign {
			if x.Campaign {
				return 1
			}
			return -1
		}
		return strings.Compare(x.ID, y.ID)
	})
	for _, c := range cs {
		q, args := `UPDATE skus SET projected_seq = ?, holds_dirty = CASE WHEN hold_seq > ? THEN 1 ELSE 0 END
			WHERE sku = ? AND projected_seq = ?`, []any{c.To, c.To, c.ID, c.From}
		if c.Campaign { // a campaign stays dirty while its pool can sell
			q, args = `UPDATE campaigns SET projected_seq = ?, holds_dirty = ? WHERE id = ? AND projected_seq = ?`, []any{c.To, !c.Done, c.ID, c.From}
		}
		// Its own transaction, run again if a deadlock ended it (a
		// statement alone holds no other lock, but the retry costs
		// nothing): a sale or a give-back of the campaign locks its row
		// first, and may be waiting behind this.
		if _, err := RetryDeadlock(a.ctx, func() (int64, error) { return a.exec(q, args...) }); err != nil {
			return err
		}
	}
	return nil
}

// cursorRow is the projection cursor of a SKU's (or a campaign's) holds
// (projected), as the projector reads it with what its holds are numbered
// up to (holdSeq): a SKU's from skus, a campaign's from campaignCursors,
// whose holdSeq is its pool's change counter and ended that its pool is
// released (nothing can sell after). Its holds past the cursor (past)
// are its backlog; dirty reads the ones that may have one.
type cursorRow struct {
	id                 string
	campaign, ended    bool
	projected, holdSeq int64
}

// dirty reads up to n SKUs (campaigns) whose holds are not all projected,
// in name order from the first after after, then from the first.
func (a Arbiter) dirty(campaigns bool, n int, after string) ([]cursorRow, error) {
	var todo []cursorRow
	scan := scanCursor(campaigns, &todo)
	key := "sku"
	q := `SELECT sku, projected_seq, hold_seq, 1 FROM skus WHERE holds_dirty = 1 AND sku`
	if campaigns {
		key, q = "c.id", campaignCursors+` WHERE c.holds_dirty = 1 AND c.id`
	}
	if err := a.query(scan, q+` > ? ORDER BY `+key+` LIMIT ?`, after, n); err != nil || len(todo) == n || after == "" {
		return todo, err
	}
	// Round the end: the first ones, up to after included (after itself
	// had its turn last round: it comes again only after every other).
	err := a.query(scan, q+` <= ? ORDER BY `+key+` LIMIT ?`, after, n-len(todo))
	return todo, err
}

// scanCursor appends each row to out: a SKU's (a campaign's, if
// campaign) id, cursor, holdSeq and whether its holds can still grow (a
// SKU's always can; a campaign's while its pool is HELD).
func scanCursor(campaign bool, out *[]cursorRow) func(*sql.Rows) error {
	return func(rs *sql.Rows) error {
		d := cursorRow{campaign: campaign}
		var held bool
		if err := rs.Scan(&d.id, &d.projected, &d.holdSeq, &held); err != nil {
			return err
		}
		d.ended = !held
		*out = append(*out, d)
		return nil
	}
}

// backlog reads up to limit of d's holds past seq after, in seq order.
func (a Arbiter) backlog(d cursorRow, after int64, limit int) ([]heldRow, error) {
	var rows []heldRow
	q, args := d.past(after)
	err := a.query(scanHeld(&rows), heldSelect+q+` ORDER BY seq LIMIT ?`, append(args, limit)...)
	return rows, err
}

// past is the WHERE clause of holds that selects d's holds past seq
// after: a SKU's range of holds' (sku_id, seq) index, or a campaign's,
// each filtered on its name (two may share an integer).
func (d cursorRow) past(after int64) (string, []any) {
	if d.campaign {
		return `WHERE sku_id = ? AND seq > ? AND campaign_id = ?`, []any{PoolID(d.id), after, d.id}
	}
	return `WHERE sku_id = ? AND seq > ? AND sku = ? AND campaign_id IS NULL`, []any{SKUID(d.id), after, d.id}
}

// ProjectSKU projects every hold of sku past its cursor, in the
// transaction that holds the SKU's row lock (no sale of it can commit
// meanwhile): what counts the SKU's live reservations (FixReserved)
// calls first. Its campaigns' holds are not numbered by it: Live counts
// those that are not projected.
func (a Arbiter) ProjectSKU(sku string) error {
	var after []int64
	if err := a.query(func(rs *sql.Rows) error {
		var p int64
		err := rs.Scan(&p)
		after = append(after, p)
		return err
	}, `SELECT projected_seq FROM skus WHERE sku = ? AND holds_dirty = 1`, sku); err != nil || len(after) == 0 {
		return err
	}
	rows, err := a.backlog(cursorRow{id: sku}, after[0], 1<<30)
	if err != nil {
		return err
	}
	return a.project(rows, nil)
}

// campaignPool is campaigns (c), each with its pool's reservation (r,
// all NULL for a campaign that has none), found by the pool's token on
// its primary key: the one spelling of that join, for both dialects
// (SQLite has CONCAT since 3.44, and the embedded one is newer) and for
// BacklogSQL, which knows neither.
const campaignPool = `campaigns c LEFT JOIN stock_reservations r ON r.token = CONCAT('c:', c.id)`

// poolChanged is the condition on campaignPool's rows that c may have
// holds with no projection: it is dirty and its pool changed past its
// cursor (its holds are numbered by its pool's changes: when the pool
// did not change past the cursor, no hold is past it).
const poolChanged = `c.holds_dirty = 1 AND r.result > c.projected_seq`

// campaignCursors selects campaigns (c) with their projection cursor,
// their pool's change counter and whether the pool is HELD (scanCursor).
const campaignCursors = `SELECT c.id, c.projected_seq, COALESCE(r.result, 0), COALESCE(r.state = 'HELD', 0) FROM ` + campaignPool

// Live is what sku's live reservations hold (HELD and COMMITTED), read
// from one snapshot (the caller's transaction): the projection's, and its
// campaigns' holds that have none yet. A campaign's sale moves units from
// its pool to its hold without touching the SKU's row, so a count under
// the SKU's row lock still sees campaign sales commit; counted from one
// snapshot, each is counted once, in the pool or as its hold. Call
// ProjectSKU first: the SKU's own holds are counted from the projection.
func (a Arbiter) Live(sku string) (int64, error) {
	var live int64
	if err := a.query(func(rs *sql.Rows) error { return rs.Scan(&live) },
		`SELECT COALESCE(SUM(qty), 0) FROM stock_reservations WHERE sku = ? AND state IN ('HELD', 'COMMITTED')`, sku); err != nil {
		return 0, err
	}
	var campaigns []cursorRow
	if err := a.query(scanCursor(true, &campaigns), campaignCursors+` WHERE c.sku = ? AND `+poolChanged, sku); err != nil {
		return 0, err
	}
	for _, d := range campaigns {
		n, err := a.unprojected(d)
		if err != nil {
			return 0, err
		}
		live += n
	}
	return live, nil
}

// ProjectExpired projects the holds past their deadline at now of up to
// skus SKUs (and as many campaigns) with a backlog, up to limit each, so
// the sweep finds them in the projection whether the projector runs or
// not. The cursors stay where they are (the projector writes them again,
// harmlessly). It returns how many it projected.
func (a Arbiter) ProjectExpired(now time.Time, skus, limit int) (int, error) {
	n := 0
	for _, campaigns := range []bool{false, true} {
		todo, err := a.dirty(campaigns, skus, "")
		if err != nil {
			return n, err
		}
		for _, d := range todo {
			if d.campaign && d.holdSeq <= d.projected {
				continue // its pool has not changed past the cursor
			}
			// Page past the holds projected already (by an earlier pass, or
			// the transition that expired them): while the projector is down
			// the cursor stays, and a first page alone would be the same
			// holds at every pass, never the ones after them.
			after := d.projected
			for page := 0; page < expiredPages; page++ {
				var rows []heldRow
				q, args := d.past(after)
				if err := a.query(scanHeld(&rows), heldSelect+q+` AND deadline <= ? ORDER BY seq LIMIT ?`, append(args, now, limit)...); err != nil {
					return n, err
				}
				if err := a.project(rows, nil); err != nil {
					return n, err
				}
				n += len(rows)
				if len(rows) < limit {
					break
				}
				after = rows[len(rows)-1].seq
			}
		}
	}
	return n, nil
}

// expiredPages bounds the pages of a SKU's expired holds one sweep pass
// reads (ProjectExpired), so a pass stays bounded however long the
// projector has been down.
const expiredPages = 50

// project writes the projection of the holds in rows whose projection
// is not written yet: each order whole, its lines on other SKUs (or past
// a round's bound) read and written with it, so no reader ever finds an
// order with some of its lines, and no cancel releases some of them. An
// order whose row exists is left alone: its projection was written whole
// by one transaction (a payment right after its sale projects it first,
// and rewriting it would only lock its rows again, against that very
// payment). whole, if not nil, names the orders known to be projected
// whole already (skipped without a read), and is given those this call
// wrote or found.
func (a Arbiter) project(rows []heldRow, whole map[string]bool) error {
	rows = slices.Clone(rows) // the caller's rows stay as they are (their seqs move the cursor)
	if whole != nil {
		rows = slices.DeleteFunc(rows, func(h heldRow) bool {
			token, isOrder := h.token()
			return isOrder && whole[token]
		})
	}
	if len(rows) == 0 {
		return nil
	}
	rows, err := a.wholeOrders(rows)
	if err != nil {
		return err
	}
	var ids []any
	asked := map[string]bool{}
	for _, h := range rows {
		if token, isOrder := h.token(); isOrder && !asked[token] {
			asked[token] = true
			ids = append(ids, token)
		}
	}
	if len(ids) > 0 {
		have := map[string]bool{}
		if err := a.query(func(rs *sql.Rows) error {
			var id string
			err := rs.Scan(&id)
			have[id] = true
			return err
		}, `SELECT id FROM orders WHERE id IN (?`+strings.Repeat(", ?", len(ids)-1)+`)`, ids...); err != nil {
			return err
		}
		rows = slices.DeleteFunc(rows, func(h heldRow) bool {
			token, isOrder := h.token()
			return isOrder && have[token]
		})
		if whole != nil {
			for _, id := range ids {
				whole[id.(string)] = true
			}
		}
	}
	return a.projectWhole(rows)
}

// projectWhole writes the projection of rows, every line of each order
// among them: for an order's line its order row (once per order), its
// reservation and its RESERVE movement at the hold's seq; for a token's
// hold its reservation and movement. Every insert leaves an existing row
// alone, so projecting twice (the projector and a transition, or a
// projector that died before its cursor moved) is harmless.
func (a Arbiter) projectWhole(rows []heldRow) error {
	var orders, reservations, movements []any
	seen := map[string]bool{}
	for _, h := range rows {
		if h.qty == 0 { // a release's tombstone (Tombstone): projected as it was written
			continue
		}
		token, isOrder := h.token()
		if token == "" {
			return fmt.Errorf("arbiter: a hold with neither a UUID nor a name")
		}
		var orderID, buyer *string
		ref := tokenRef(token)
		if isOrder {
			orderID = &token
			ref = token
			if !seen[token] {
				seen[token] = true
				var user string
				if h.buyer.Valid {
					user = h.buyer.String
				}
				orders = append(orders, token, user, "PENDING", token, h.deadline, h.created, h.created)
			}
		}
		if h.quota && h.buyer.Valid { // its release gives the buyer's quota back
			buyer = &h.buyer.String
		}
		var campaign *string
		if h.campaign.Valid {
			campaign = &h.campaign.String
		}
		reservations = append(reservations, token, h.sku, orderID, buyer, h.qty, Held, h.result, h.deadline, h.created, h.created, campaign)
		if campaign == nil { // a campaign's sale moves units from its pool: the SKU's reserved did not move
			movements = append(movements, h.sku, h.seq, MoveReserve, 0, h.qty, "", ref, h.created)
		}
	}
	if err := a.insertOnce("orders", []string{"id", "user_id", "status", "reservation_token", "expires_at", "created_at", "updated_at"}, orders); err != nil {
		return err
	}
	if err := a.insertOnce("stock_reservations", campaignReservationColumns, reservations); err != nil {
		return err
	}
	return a.insertOnce("stock_movements", movementColumns, movements)
}

// wholeOrders is rows with every line of each order among them (one
// read of the orders' keys).
func (a Arbiter) wholeOrders(rows []heldRow) ([]heldRow, error) {
	type key struct {
		id   string
		line int
	}
	have := map[key]bool{}
	var ids []any
	for _, h := range rows {
		have[key{string(h.id), h.line}] = true
		if !h.name.Valid && !have[key{string(h.id), -1}] {
			have[key{string(h.id), -1}] = true
			ids = append(ids, holdID(h.id))
		}
	}
	if len(ids) == 0 {
		return rows, nil
	}
	var all []heldRow
	if err := a.query(scanHeld(&all), heldSelect+`WHERE id IN (?`+strings.Repeat(", ?", len(ids)-1)+`)`, ids...); err != nil {
		return nil, err
	}
	for _, h := range all {
		if !have[key{string(h.id), h.line}] {
			rows = append(rows, h)
		}
	}
	return rows, nil
}

// insertOnce is insertRows whose rows that exist already (by any unique
// key) are left as they are.
func (a Arbiter) insertOnce(table string, cols []string, args []any) error {
	if len(args) == 0 {
		return nil
	}
	one := "(" + strings.Repeat("?, ", len(cols)-1) + "?)"
	vals := strings.Repeat(one+", ", len(args)/len(cols)-1) + one
	q := "INSERT INTO " + table + " (" + strings.Join(cols, ", ") + ") VALUES " + vals
	if a.dialect == "sqlite" {
		q += " ON CONFLICT DO NOTHING"
	} else {
		q += " ON DUPLICATE KEY UPDATE " + cols[0] + " = " + cols[0]
	}
	_, err := a.exec(q, args...)
	return err
}

// PruneHolds deletes the held rows of up to limit orders past after (in
// key order, which is creation order: order ids are UUIDv7) whose
// deadline is before t and whose projection is written, and returns how
// many rows it deleted and where the next call starts (nil: no more). A
// projected order's hold is needed no more: its order, reservations and
// movement answer every read and transition, the order's id is never
// sold again, and a reader of the holds past a cursor (the projector,
// the sweep, reconcile's unprojected units) skips a projected hold
// anyway. A token's hold stays: its key is what refuses a replay of the
// token that Redis forgot (Tombstone's too). Retention runs it with t an
// hour before now.
func PruneHolds(db *gorm.DB, t time.Time, after []byte, limit int) (int64, []byte, error) {
	// An order's id is a UUIDv7: its first 48 bits are the Unix
	// milliseconds of its sale, which came before its deadline, so no hold
	// past the id of t's millisecond can be due: the walk ends there, not
	// at the table's end.
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(t.UnixMilli()))
	before := make([]byte, 16)
	copy(before, ms[2:])
	var rows []struct{ ID []byte }
	if err := db.Raw(`SELECT h.id FROM holds h WHERE h.id > ? AND h.id < ? AND h.name IS NULL AND h.deadline < ?
		AND EXISTS (SELECT 1 FROM stock_reservations r WHERE r.token = `+holdToken+` AND r.sku = h.sku)
		ORDER BY h.id LIMIT ?`, holdID(append([]byte{}, after...)), holdID(before), t, limit).Scan(&rows).Error; err != nil {
		return 0, after, err
	}
	if len(rows) == 0 {
		return 0, nil, nil
	}
	ids := make([]any, len(rows)) // a cart's lines repeat its id: IN takes it once
	for i, r := range rows {
		ids[i] = holdID(r.ID)
	}
	// Every line of each: an order is projected whole, in one transaction.
	res := db.Exec(`DELETE FROM holds WHERE name IS NULL AND id IN (`+placeholders(len(ids))+`)`, ids...)
	next := rows[len(rows)-1].ID
	if len(rows) < limit {
		next = nil
	}
	return res.RowsAffected, next, res.Error
}
