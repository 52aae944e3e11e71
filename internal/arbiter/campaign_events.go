package arbiter

import (
	"database/sql"
	"time"

	"gorm.io/gorm"
)

// A campaign's events say what its window and its pool mean to a
// storefront: the sale opened, sold out, has units again, ended. They are
// rows of stock_events with campaign_id set, numbered in the SKU's seq
// stream (skus.event_seq, bumped under the SKU's row lock) so a receiver
// sees a SKU's and its campaigns' events in one order. The database
// decides each, as it does the SKUs' thresholds: campaigns.event_flags
// holds what the campaign announced, and every event is written by the
// conditional UPDATE of those flags that moves them, in the transaction
// that made it true. Whoever wins that UPDATE writes the event; a racer
// finds the flags moved and writes nothing; a transaction that rolls back
// takes its flags and its event with it.
//
//   - campaign.started: by the campaign's first sale (whose UPDATE of the
//     pool the database's clock let through), or by the events job
//     (AnnounceCampaigns) once the database's clock passes starts_at,
//     whichever is first. So it precedes every other event of the
//     campaign, and no node's clock can make it early. A campaign ended
//     before either saw it open has none.
//   - campaign.sold_out: by the transaction that takes the pool's last
//     units (a sale, or a put that shrinks the allotment to what is sold
//     and held), once per fall to zero.
//   - campaign.back_in_stock: by the transaction that gives units back to
//     a sold-out pool while the campaign runs (a campaign order cancelled
//     or expired, a put that grows the allotment); the next fall to zero
//     is announced again. A storefront needs it to reopen a sold-out sale's
//     page: those units never move the SKU's available, so no
//     sku.back_in_stock says so.
//   - campaign.ended: by the transaction that releases the pool (the end
//     route, EndCampaign, or the timeout sweep at the pool's deadline), or
//     by the events job once the database's clock passes ends_at,
//     whichever is first. Nothing of the campaign follows it.
//
// A sale that crosses nothing costs no statement more: the read of the
// pool's fence after its UPDATE, which it runs anyway, also takes the
// pool's units and the campaign's flags.

// The campaign events' names (docs/api.md lists them).
const (
	EventCampaignStarted     = "campaign.started"       // the database's clock opened the window
	EventCampaignSoldOut     = "campaign.sold_out"      // the pool fell to 0
	EventCampaignBackInStock = "campaign.back_in_stock" // the pool rose from 0 while the campaign runs
	EventCampaignEnded       = "campaign.ended"         // the window closed or the campaign was ended
)

// What a campaign's events announced (campaigns.event_flags).
const (
	campaignStarted = 1 // campaign.started announced
	campaignSoldOut = 2 // campaign.sold_out announced, not yet followed by campaign.back_in_stock
	campaignEnded   = 4 // campaign.ended announced: nothing follows
)

// campaignMove is a move of a campaign's flags that announces typ: it
// applies when flags&mask == want, and leaves flags&keep | set.
type campaignMove struct {
	typ        string
	mask, want int64
	keep, set  int64
}

const campaignAll = campaignStarted | campaignSoldOut | campaignEnded

var (
	moveStarted = campaignMove{EventCampaignStarted, campaignStarted | campaignEnded, 0, campaignAll, campaignStarted}
	moveSoldOut = campaignMove{EventCampaignSoldOut, campaignSoldOut | campaignEnded, 0, campaignAll, campaignSoldOut}
	moveBack    = campaignMove{EventCampaignBackInStock, campaignSoldOut | campaignEnded, campaignSoldOut, campaignAll &^ campaignSoldOut, 0}
	moveEnded   = campaignMove{EventCampaignEnded, campaignEnded, 0, campaignAll, campaignEnded}
)

// applies says whether m applies to a campaign whose flags are flags (as
// read; the UPDATE decides again).
func (m campaignMove) applies(flags int64) bool { return flags&m.mask == m.want }

// moveCampaign moves campaign id's flags by m if it applies and cond (an
// extra SQL condition, "" for none, with args) holds, in one conditional
// UPDATE, and reports whether it did.
func (a Arbiter) moveCampaign(id string, m campaignMove, cond string, args ...any) (bool, error) {
	q := `UPDATE campaigns SET event_flags = (event_flags & ?) | ? WHERE id = ? AND (event_flags & ?) = ?`
	if cond != "" {
		q += ` AND ` + cond
	}
	n, err := a.exec(q, append([]any{m.keep, m.set, id, m.mask, m.want}, args...)...)
	return n == 1, err
}

// announceCampaign moves campaign id's flags by each of moves that applies
// and writes the events of those that did, in that order, with the levels
// of its SKU as they are now.
func (a Arbiter) announceCampaign(id, sku string, at time.Time, moves ...campaignMove) error {
	var types []string
	for _, m := range moves {
		ok, err := a.moveCampaign(id, m, "")
		if err != nil {
			return err
		}
		if ok {
			types = append(types, m.typ)
		}
	}
	return a.campaignEvents(id, sku, at, types)
}

// campaignEvents writes events types of campaign id, next in its SKU's seq
// stream (under the SKU's row lock, taken here if the transaction does
// not hold it yet), with the SKU's levels as they are now.
func (a Arbiter) campaignEvents(id, sku string, at time.Time, types []string) error {
	if len(types) == 0 {
		return nil
	}
	if at.IsZero() {
		at = time.Now()
	}
	at = at.UTC().Truncate(time.Microsecond)
	if _, err := a.exec(`UPDATE skus SET event_seq = event_seq + ? WHERE sku = ?`, len(types), sku); err != nil {
		return err
	}
	var rows []levelRow
	if err := a.query(func(rs *sql.Rows) error {
		var r levelRow
		if err := rs.Scan(&r.SKU, &r.OnHand, &r.Reserved, &r.EventSeq); err != nil {
			return err
		}
		rows = append(rows, r)
		return nil
	}, `SELECT sku, on_hand, reserved, event_seq FROM skus WHERE sku = ?`, sku); err != nil || len(rows) == 0 {
		return err
	}
	r := rows[0]
	args := make([]any, 0, len(types)*len(eventColumns))
	for i, typ := range types {
		args = append(args, typ, sku, r.EventSeq-int64(len(types)-1-i), id, at, r.OnHand, r.Reserved, r.available())
	}
	return a.insertRows("stock_events", eventColumns, args)
}

// dbClock reads the database's clock (the embedded SQLite's is this
// process's): the clock that decides a campaign's window.
func (a Arbiter) dbClock() (time.Time, error) {
	if a.dialect == "sqlite" {
		return time.Now().UTC().Truncate(time.Microsecond), nil
	}
	var t time.Time
	err := a.tx.Raw(`SELECT UTC_TIMESTAMP(6)`).Row().Scan(&t)
	return t.UTC(), err
}

// AnnounceCampaigns writes campaign.started for up to limit campaigns the
// database's clock has opened, and campaign.ended for those whose window it
// has passed, where no sale, end or earlier round announced it, and
// returns how many events it wrote and how many campaigns it found due
// (limit: there may be more). Finding none costs one statement, answered
// from the flags' keys. Run it in a transaction, on one node at a time
// (the events job); a second runner, or a sale or an end racing it,
// finds the flags moved and writes nothing twice.
func (a Arbiter) AnnounceCampaigns(limit int) (events, due int, err error) {
	now, args := a.dbNow()
	var rows []struct {
		ID  string `gorm:"column:id"`
		SKU string `gorm:"column:sku"`
	}
	q := append(append(append([]any{}, args...), args...), limit)
	if err := a.tx.Raw(`SELECT id, sku FROM campaigns WHERE event_flags = 0 AND starts_at <= `+now+`
		UNION SELECT id, sku FROM campaigns WHERE event_flags IN (0, 1, 3) AND ends_at <= `+now+`
		ORDER BY id LIMIT ?`, q...).Scan(&rows).Error; err != nil || len(rows) == 0 {
		return 0, 0, err
	}
	at, err := a.dbClock() // read after the rows: what was due by the clock then still is
	if err != nil {
		return 0, 0, err
	}
	for _, c := range rows {
		var types []string
		for _, step := range []struct {
			m    campaignMove
			cond string
		}{{moveStarted, "starts_at <= ?"}, {moveEnded, "ends_at <= ?"}} {
			ok, err := a.moveCampaign(c.ID, step.m, step.cond, at)
			if err != nil {
				return events, len(rows), err
			}
			if ok {
				types = append(types, step.m.typ)
			}
		}
		if err := a.campaignEvents(c.ID, c.SKU, at, types); err != nil {
			return events, len(rows), err
		}
		events += len(types)
	}
	return events, len(rows), nil
}

// EndedCampaigns reads the campaigns whose end (ends_at: the window's
// close, or the moment the end route ended them) is in [from, to] and was
// announced (campaign.ended: the pool released, or the database's clock
// past ends_at), through the flags' index: what may still have keys in
// Redis that nothing needs.
func EndedCampaigns(db *gorm.DB, from, to time.Time) ([]CampaignRef, error) {
	var out []CampaignRef
	ended := []int64{campaignEnded, campaignEnded | campaignStarted, campaignEnded | campaignSoldOut, campaignAll}
	err := db.Raw(`SELECT id, sku FROM campaigns WHERE event_flags IN ? AND ends_at >= ? AND ends_at <= ? ORDER BY id`,
		ended, from.UTC(), to.UTC()).Scan(&out).Error
	return out, err
}

// poolState is campaign id's pool as a change of it left it: its fence,
// its units, and what the campaign's events announced.
type poolState struct {
	Seq   int64 `gorm:"column:seq"`
	Epoch int64 `gorm:"column:epoch"`
	Left  int64 `gorm:"column:pool_left"`
	Flags int64 `gorm:"column:flags"`
}

func (p poolState) fence() Fence { return Fence{Seq: p.Seq, Epoch: p.Epoch} }

// poolAfter reads campaign id's pool (the fence its Redis copy needs, and
// what its events need) in one statement.
func (a Arbiter) poolAfter(id string) (poolState, error) {
	var p poolState
	first := true // as GORM's Scan into a struct: the first row
	err := a.query(func(rows *sql.Rows) error {
		if !first {
			return nil
		}
		first = false
		return rows.Scan(&p.Seq, &p.Epoch, &p.Left, &p.Flags)
	},
		`SELECT r.result AS seq, c.redis_epoch AS epoch, r.qty AS pool_left, c.event_flags AS flags
		FROM stock_reservations r JOIN campaigns c ON c.id = r.campaign_id WHERE r.token = ?`, CampaignToken(id))
	return p, err
}

// poolMoved announces what a change of campaign id's pool (of sku) to p
// crossed: the first sale's opening, a fall to zero, a rise from it.
// Nothing when p crossed nothing (no statement).
func (a Arbiter) poolMoved(id, sku string, p poolState, sold bool) error {
	var moves []campaignMove
	if sold && moveStarted.applies(p.Flags) {
		moves = append(moves, moveStarted)
	}
	switch {
	case p.Left == 0 && moveSoldOut.applies(p.Flags):
		moves = append(moves, moveSoldOut)
	case p.Left > 0 && moveBack.applies(p.Flags):
		moves = append(moves, moveBack)
	}
	if len(moves) == 0 {
		return nil
	}
	return a.announceCampaign(id, sku, time.Time{}, moves...)
}

// poolsReleased announces the end of the campaigns whose pools a release
// released (the end route or the timeout sweep), with their SKUs' levels
// after the unsold rest returned.
func (a Arbiter) poolsReleased(pools []Reservation) error {
	for _, p := range pools {
		if err := a.announceCampaign(*p.CampaignID, p.SKU, time.Time{}, moveEnded); err != nil {
			return err
		}
	}
	return nil
}
