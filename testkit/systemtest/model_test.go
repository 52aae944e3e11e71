package systemtest

// A model-based test of the stock protocol, in the spirit of TigerBeetle's
// VOPR and Jepsen's model checkers: a seeded random driver runs a long mix of
// operations against the real service (MariaDB and Redis through the rig)
// and against a plain in-memory reference model of docs/SPEC.md sections 3
// and 4, and after every step the two must agree on every SKU's quantities,
// the reservations and orders the step touched, every buyer's quota,
// Redis's available units and the stock events the step wrote (the
// threshold crossings and the campaigns' own events, read from the replay
// feed); at quiet points (the ordered sync drained) on everything. The
// model is written to the specification, not to the code.
//
// Replay a run with INVENTORY_MODEL_SEED=<seed>; INVENTORY_MODEL_OPS sets
// its length (default 10000; the long run uses 200000).
//
// The model is exact where the specification is. Where the specification
// lets Redis be wrong for a while (a rolled-back Redis hides units until it
// is realigned), the model accepts a refusal and follows what happened; it
// never accepts a sale the database should have refused.
//
// Layout: the universe of names; the model (mbModel: its state, and per
// operation what the service may answer and what then changed); the driver
// (mbDriver and the weighted table mbOps); the operations; the comparisons.
// The ordered sync is not left running: a drain relays the outbox and lets a
// consumer apply it, so every step ends at a quiet point and is compared.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/campaign"
	"github.com/acme/inventory/internal/catalog"
	"github.com/acme/inventory/internal/expiry"
	"github.com/acme/inventory/internal/maintenance"
	"github.com/acme/inventory/internal/tokens"
	"github.com/acme/inventory/mq"
	"github.com/acme/inventory/order"
	"github.com/acme/inventory/testkit/testrig"
)

// ---------------------------------------------------------------------------
// The universe: few names, small stock, so that sold-out, refusals, limits
// and collisions are frequent. Names that differ only in letter case are
// different names (docs/SPEC.md section 3, "Names are exact").

var (
	// mbNames are the SKU names the driver uses; "phone-x" and "hot" do not
	// exist until a put creates them.
	mbNames = []string{"PHONE-X", "phone-x", "HOT", "hot", "CAB", "FREE"}
	mbUsers = []string{"alice", "Alice", "bob", "BOB", "carol", "dave"}
	// mbTokens and mbIdem are the stems of client tokens and idempotency
	// keys; a generation number, moving on every few hundred steps, follows
	// (a token that was released stays released: fresh ones keep the token
	// API busy).
	mbTokens = []string{"Cart-", "cart-", "tk-", "TK-"}
	mbIdem   = []string{"K-", "k-", "key-"}
	// mbInitial is the catalog at the start: on_hand (-1 unlimited) and
	// per-user limit.
	mbInitial = []struct {
		sku           string
		onHand, limit int64
	}{{"PHONE-X", 6, 0}, {"HOT", 4, 2}, {"CAB", 8, 0}, {"FREE", inventory.Unlimited, 3}}
)

// mbHorizon is the retention horizon of the model run.
const mbHorizon = 24 * time.Hour

// mbMaxHold is the rig's maximum hold (the default): a hold may end at most
// this long after it was made.
const mbMaxHold = inventory.DefaultMaxHold

// mbRestored is what the model calls a SOLD reservation whose refund was
// applied. The database may name it RESTORED, or leave it SOLD.
const mbRestored arbiter.ResState = "RESTORED"

// ---------------------------------------------------------------------------
// The reference model.

type mbSKU struct {
	onHand, reserved, limit int64
	// threshold is the SKU's low_stock_threshold (0: none); lowSaid and
	// soldOutSaid are what its last stock events announced.
	threshold            int64
	lowSaid, soldOutSaid bool
}

// crossed is what the specification says a SKU at its levels has crossed:
// sold out at 0 available, low at or below its threshold (when it has
// one); an unlimited SKU neither.
func (s *mbSKU) crossed() (low, soldOut bool) {
	if !s.limited() {
		return false, false
	}
	return s.threshold > 0 && s.available() <= s.threshold, s.available() <= 0
}

// announce returns the events of the thresholds s crossed since its last
// ones (a fall past the low threshold before a fall to zero; a rise above
// it re-arms it silently) and records them as announced.
func (s *mbSKU) announce() []string {
	low, soldOut := s.crossed()
	var out []string
	if low && !s.lowSaid {
		out = append(out, arbiter.EventLowStock)
	}
	switch {
	case soldOut && !s.soldOutSaid:
		out = append(out, arbiter.EventSoldOut)
	case !soldOut && s.soldOutSaid:
		out = append(out, arbiter.EventBackInStock)
	}
	s.lowSaid, s.soldOutSaid = low, soldOut
	return out
}

func (s *mbSKU) limited() bool { return s.onHand != inventory.Unlimited }

func (s *mbSKU) available() int64 {
	if !s.limited() {
		return inventory.Unlimited
	}
	return s.onHand - s.reserved
}

// mbKey is a reservation's key: the database token ("t." + a client's token
// for the token API, an order id, or an order id + ".late") and the SKU.
type mbKey struct{ token, sku string }

type mbRes struct {
	qty     int64
	state   arbiter.ResState
	buyer   string // the buyer it counts against ("" none)
	order   string // "" for the token API
	expires time.Time
	result  int64 // what the first Reserve answered (token API)
	// created and extKey: when a token-API hold was made, and the
	// Idempotency-Key of the extension that moved it last.
	created time.Time
	extKey  string
	// campaign is the campaign whose pool a sale came from ("" none).
	campaign string
}

// mbCampaign is a campaign: its window (the database's clock and the node's
// decide it; see buyOutcomes), its limit, whether its pool was released
// (ended), and whether Redis's copy of its pool or buyers may be older than
// the database (a rollback; only a flush makes it exact again).
type mbCampaign struct {
	id, sku      string
	starts, ends time.Time
	limit        int64
	hold         time.Duration
	ended, stale bool
	// What its events announced: opened (by its first sale: no events
	// job runs here), sold out (not yet back), ended.
	startedSaid, soldOutSaid, endedSaid bool
}

type mbOrder struct {
	id, user, idem string
	lines          []inventory.Line
	status         order.Status
	token          string // the reservation token: id, or id + ".late"
	payment        string
	expires        time.Time
	created        time.Time
	extKey         string // the last extension's Idempotency-Key
}

type mbMsg struct {
	token, sku string
	op         arbiter.Op
	qty        int64
}

type mbQuota struct{ sku, user string }

type mbRef struct {
	sku, ref string
	delta    int64
}

type mbModel struct {
	skus      map[string]*mbSKU
	res       map[mbKey]*mbRes
	skusOf    map[string][]string // token -> the SKUs of its reservations
	tokenRes  []mbKey             // the token API's reservations, in creation order
	tokenHeld []mbKey             // those of them that may still be HELD
	orders    map[string]*mbOrder
	orderList []*mbOrder
	byStatus  map[order.Status][]*mbOrder // may hold orders that moved on (pruned when picked)
	byIdem    map[[2]string]*mbOrder
	payments  map[string]string // payment id -> order id
	payList   []string
	quota     map[mbQuota]int64
	outbox    []mbMsg // written, not yet applied
	applied   []mbMsg // applied by the ordered consumer
	refs      map[[2]string]int64
	refList   []mbRef
	anomalies int64
	// stale: Redis was rolled back for the SKU and may hide units (refuse
	// what the database would accept) until it is realigned.
	stale map[string]bool
	// staleQuota: the buyers pre-filter of the SKU was rolled back and may
	// count more than the database; only a key loss clears it.
	staleQuota map[string]bool
	// tokenKey: Redis surely remembers the token-API reservation, so a
	// replay goes to the database without Redis checking stock.
	tokenKey map[mbKey]bool
	// dirtyTokens and dirtyOrders are what the model changed since the
	// driver last compared.
	dirtyTokens, dirtyOrders map[string]bool
	campaigns                map[string]*mbCampaign
	campList                 []*mbCampaign
	// events are the campaign events the model wrote since the driver
	// last compared, by SKU ("type campaign"); the SKUs' threshold
	// events are added when it compares (announce).
	events map[string][]string
}

func newMBModel() *mbModel {
	return &mbModel{
		skus: map[string]*mbSKU{}, res: map[mbKey]*mbRes{}, skusOf: map[string][]string{},
		orders: map[string]*mbOrder{}, byStatus: map[order.Status][]*mbOrder{}, byIdem: map[[2]string]*mbOrder{},
		payments: map[string]string{}, quota: map[mbQuota]int64{}, refs: map[[2]string]int64{},
		stale: map[string]bool{}, staleQuota: map[string]bool{}, tokenKey: map[mbKey]bool{},
		dirtyTokens: map[string]bool{}, dirtyOrders: map[string]bool{}, campaigns: map[string]*mbCampaign{},
		events: map[string][]string{},
	}
}

// campaignEvent records event typ of c, on its SKU's stream.
func (m *mbModel) campaignEvent(c *mbCampaign, typ string) {
	m.events[c.sku] = append(m.events[c.sku], typ+" "+c.id)
}

func (m *mbModel) addRes(k mbKey, r *mbRes) {
	m.res[k] = r
	m.skusOf[k.token] = append(m.skusOf[k.token], k.sku)
	m.dirtyTokens[k.token] = true
	if r.order == "" {
		m.tokenRes = append(m.tokenRes, k)
	}
}

func (m *mbModel) setStatus(o *mbOrder, st order.Status) {
	o.status = st
	m.byStatus[st] = append(m.byStatus[st], o)
	m.dirtyOrders[o.id] = true
}

// overLimit says whether buyer would pass a per-user limit reserving lines.
func (m *mbModel) overLimit(buyer string, lines []inventory.Line) bool {
	for _, l := range lines {
		s := m.skus[l.SKU]
		if s != nil && s.limit > 0 && m.quota[mbQuota{l.SKU, buyer}]+l.Qty > s.limit {
			return true
		}
	}
	return false
}

// fits says whether the database can cover lines (on_hand - reserved).
func (m *mbModel) fits(lines []inventory.Line) bool {
	for _, l := range lines {
		if s := m.skus[l.SKU]; s.limited() && s.available() < l.Qty {
			return false
		}
	}
	return true
}

// orderOutcomes is what creating an order of lines (normalised) for buyer
// may answer. Redis admits line by line in SKU order (an unknown SKU, or a
// line Redis cannot cover, ends the admission); then the database counts
// the buyer's quotas and arbitrates the stock. A stale SKU may be refused by
// Redis, or over-admitted by it (the database refuses).
func (m *mbModel) orderOutcomes(buyer string, lines []inventory.Line) mbSet {
	out := mbSet{}
	short := false
	for _, l := range lines {
		s, ok := m.skus[l.SKU]
		if !ok {
			out["unknown"] = true
			return out
		}
		stale := m.stale[l.SKU]
		if stale {
			out["insufficient"] = true
		}
		if s.limited() && s.available() < l.Qty {
			if !stale {
				out["insufficient"] = true
				return out
			}
			short = true
		}
	}
	switch {
	case m.overLimit(buyer, lines):
		out["conflict"] = true
	case short:
		out["insufficient"] = true
	default:
		out["ok"] = true
	}
	return out
}

// seckillOutcomes is what a one-unit seckill of sku for user under the
// SKU's limit (> 0) may answer. Redis checks the buyer's count (a
// pre-filter never above the database's, unless rolled back) before the
// stock, so a buyer at the limit of a sold-out SKU may hear either refusal.
func (m *mbModel) seckillOutcomes(user, sku string) mbSet {
	s, ok := m.skus[sku]
	if !ok {
		return mbWant("unknown")
	}
	out := mbSet{}
	if m.stale[sku] {
		out["insufficient"] = true
	}
	if m.staleQuota[sku] {
		out["conflict"] = true
	}
	short := s.limited() && s.available() < 1
	switch {
	case m.overLimit(user, []inventory.Line{{SKU: sku, Qty: 1}}):
		out["conflict"] = true
		if short {
			out["insufficient"] = true
		}
	case short:
		out["insufficient"] = true
	default:
		out["ok"] = true
	}
	return out
}

// hold records reservations of lines under token in state, counting them
// against buyer where the SKU has a per-user limit.
func (m *mbModel) hold(token, orderID, buyer string, lines []inventory.Line, state arbiter.ResState, expires time.Time) {
	for _, l := range lines {
		s := m.skus[l.SKU]
		r := &mbRes{qty: l.Qty, state: state, order: orderID, expires: expires}
		if buyer != "" && s.limit > 0 {
			r.buyer = buyer
			m.quota[mbQuota{l.SKU, buyer}] += l.Qty
		}
		s.reserved += l.Qty
		m.addRes(mbKey{token, l.SKU}, r)
	}
}

// release gives back token's HELD reservations (of sku only, if set) and
// returns the units.
func (m *mbModel) release(token, sku string) int64 {
	var n int64
	for _, s := range m.skusOf[token] {
		r := m.res[mbKey{token, s}]
		if sku != "" && s != sku || r.state != arbiter.Held {
			continue
		}
		r.state = arbiter.Released
		m.dirtyTokens[token] = true
		quota := s
		if c := m.campaigns[r.campaign]; c != nil {
			quota = "c:" + c.id
			if p := m.pool(c); p.state == arbiter.Held { // back to the live campaign
				p.qty += r.qty
				m.dirtyTokens[mbPoolToken(c)] = true
				if c.soldOutSaid && !c.endedSaid {
					c.soldOutSaid = false
					m.campaignEvent(c, arbiter.EventCampaignBackInStock)
				}
			} else {
				m.skus[s].reserved -= r.qty
			}
		} else {
			m.skus[s].reserved -= r.qty
		}
		if r.buyer != "" {
			m.quota[mbQuota{quota, r.buyer}] -= r.qty
		}
		n += r.qty
	}
	return n
}

// commit turns token's HELD reservations of lines COMMITTED and promises
// their deduction.
func (m *mbModel) commit(token string, lines []inventory.Line) {
	for _, l := range lines {
		m.res[mbKey{token, l.SKU}].state = arbiter.Committed
	}
	m.dirtyTokens[token] = true
	m.promise(token, lines, arbiter.OpDeduct)
}

func (m *mbModel) promise(token string, lines []inventory.Line, op arbiter.Op) {
	for _, l := range lines {
		m.outbox = append(m.outbox, mbMsg{token, l.SKU, op, l.Qty})
	}
}

// lateFits says whether an expired order's late payment can reserve its
// lines again (stock and the buyer's limits).
func (m *mbModel) lateFits(o *mbOrder) bool {
	return !m.overLimit(o.user, o.lines) && m.fits(o.lines)
}

// drain applies every promised operation, in order, as the ordered
// consumer does: a DEDUCT sells a COMMITTED reservation (on_hand and
// reserved lose its units), a RESTORE gives a sold one back to on_hand,
// whatever its age. An unlimited SKU's on_hand stays -1.
func (m *mbModel) drain() error {
	for _, msg := range m.outbox {
		r := m.res[mbKey{msg.token, msg.sku}]
		s := m.skus[msg.sku]
		switch {
		case msg.op == arbiter.OpDeduct && r != nil && r.state == arbiter.Committed && r.qty == msg.qty:
			r.state = arbiter.Sold
			s.reserved -= msg.qty
			if s.limited() {
				s.onHand -= msg.qty
			}
		case msg.op == arbiter.OpRestore && r != nil && r.state == arbiter.Sold && r.qty == msg.qty:
			r.state = mbRestored
			if s.limited() {
				s.onHand += msg.qty
			}
		default:
			return fmt.Errorf("model: %+v has no reservation to apply to (%+v)", msg, r)
		}
		m.applied = append(m.applied, msg)
		m.dirtyTokens[msg.token] = true
	}
	m.outbox = nil
	return nil
}

// sweep expires every PENDING order and releases every HELD token-API
// reservation whose deadline is at or before now; it returns the orders
// expired.
func (m *mbModel) sweep(now time.Time) int {
	n := 0
	pending := m.byStatus[order.Pending][:0]
	for _, o := range m.byStatus[order.Pending] {
		switch {
		case o.status != order.Pending:
		case !o.expires.After(now):
			m.setStatus(o, order.Expired)
			m.release(o.id, "")
			n++
		default:
			pending = append(pending, o)
		}
	}
	m.byStatus[order.Pending] = pending
	held := m.tokenHeld[:0]
	for _, k := range m.tokenHeld {
		switch r := m.res[k]; {
		case r.state != arbiter.Held:
		case !r.expires.After(now):
			m.release(k.token, k.sku)
		default:
			held = append(held, k)
		}
	}
	m.tokenHeld = held
	for _, c := range m.campList {
		if p := m.pool(c); p.state == arbiter.Held && !p.expires.After(now) {
			m.endPool(c)
		}
	}
	return n
}

// mbPoolToken is campaign c's pool's token.
func mbPoolToken(c *mbCampaign) string { return "c:" + c.id }

func (m *mbModel) pool(c *mbCampaign) *mbRes { return m.res[mbKey{mbPoolToken(c), c.sku}] }

// endPool releases c's pool: the unsold rest returns to the SKU.
func (m *mbModel) endPool(c *mbCampaign) {
	p := m.pool(c)
	p.state = arbiter.Released
	m.skus[c.sku].reserved -= p.qty
	m.dirtyTokens[mbPoolToken(c)] = true
	c.ended = true
	if !c.endedSaid {
		c.endedSaid = true
		m.campaignEvent(c, arbiter.EventCampaignEnded)
	}
}

// putCampaignOutcome is what putting a new campaign id of sku answers.
func (m *mbModel) putCampaignOutcome(id, sku string, allotment int64, starts, ends time.Time) string {
	s := m.skus[sku]
	switch {
	case ends.Sub(starts) > 90*24*time.Hour: // a window of at most 90 days, checked first
		return "invalid"
	case s == nil:
		return "unknown"
	case !s.limited():
		return "invalid"
	}
	for _, c := range m.campList {
		if c.sku == sku && c.id != id && c.starts.Before(ends) && c.ends.After(starts) {
			return "conflict"
		}
	}
	if s.available() < allotment {
		return "insufficient"
	}
	return "ok"
}

func (m *mbModel) putCampaign(c *mbCampaign, allotment int64, now time.Time) {
	m.campaigns[c.id] = c
	m.campList = append(m.campList, c)
	m.skus[c.sku].reserved += allotment
	m.res[mbKey{mbPoolToken(c), c.sku}] = &mbRes{qty: allotment, state: arbiter.Held, expires: c.ends, created: now}
	m.skusOf[mbPoolToken(c)] = append(m.skusOf[mbPoolToken(c)], c.sku)
	m.dirtyTokens[mbPoolToken(c)] = true
}

// buyOutcomes is what a buy of one unit of c by user may answer at the
// node's time now, the database's clock reading real: Redis checks the
// window by the node's clock first, the database again by its own (a node
// ahead of it is refused there), then the buyer's campaign limit and the
// pool. A stale Redis may refuse what the database would accept, or admit
// what it refuses.
func (m *mbModel) buyOutcomes(c *mbCampaign, user string, now, real time.Time) mbSet {
	switch {
	case now.Before(c.starts):
		return mbWant("notstarted")
	case c.stale && (!now.Before(c.ends) || real.Before(c.starts)):
		// A rolled-back copy of the pool has the window it had before the
		// end: it may refuse from its old units or counts before the
		// database refuses by the window.
		return mbWant("ended", "notstarted", "insufficient", "conflict")
	case !now.Before(c.ends):
		return mbWant("ended")
	case real.Before(c.starts):
		return mbWant("notstarted")
	}
	out := mbSet{}
	switch {
	case c.limit > 0 && m.quota[mbQuota{"c:" + c.id, user}]+1 > c.limit:
		out["conflict"] = true
		if m.pool(c).qty < 1 { // Redis's count of the buyer may be lost: the pool refuses first
			out["insufficient"] = true
		}
	case m.pool(c).qty < 1:
		out["insufficient"] = true
	default:
		out["ok"] = true
	}
	if c.stale {
		out["insufficient"], out["conflict"] = true, true
	}
	return out
}

// bought records the order id of one unit of c the service sold to user.
func (m *mbModel) bought(c *mbCampaign, id, user string, created, expires time.Time) *mbOrder {
	lines := []inventory.Line{{SKU: c.sku, Qty: 1}}
	o := &mbOrder{id: id, user: user, lines: lines, token: id, created: created, expires: expires}
	m.orders[id] = o
	m.orderList = append(m.orderList, o)
	m.setStatus(o, order.Pending)
	r := &mbRes{qty: 1, state: arbiter.Held, order: id, expires: expires, campaign: c.id}
	if c.limit > 0 {
		r.buyer = user
		m.quota[mbQuota{"c:" + c.id, user}]++
	}
	m.addRes(mbKey{id, c.sku}, r)
	m.pool(c).qty--
	m.dirtyTokens[mbPoolToken(c)] = true
	if !c.startedSaid {
		c.startedSaid = true
		m.campaignEvent(c, arbiter.EventCampaignStarted)
	}
	if m.pool(c).qty == 0 && !c.soldOutSaid {
		c.soldOutSaid = true
		m.campaignEvent(c, arbiter.EventCampaignSoldOut)
	}
	return o
}

// endCampaign ends c at now: its window closes there (if later), its pool
// is released.
func (m *mbModel) endCampaign(c *mbCampaign, now time.Time) {
	if c.ends.After(now) {
		c.ends = now
		if c.starts.After(now.Add(-time.Millisecond)) {
			c.starts = now.Add(-time.Millisecond)
		}
		m.pool(c).expires = now
	}
	if m.pool(c).state == arbiter.Held {
		m.endPool(c)
	}
}

// selfCheck asserts the model's own invariant: reserved is the sum of the
// live reservations, and never above on_hand for a limited SKU.
func (m *mbModel) selfCheck() error {
	live := map[string]int64{}
	for k, r := range m.res {
		if r.state == arbiter.Held || r.state == arbiter.Committed {
			live[k.sku] += r.qty
		}
	}
	for name, s := range m.skus {
		if s.reserved != live[name] || s.limited() && s.reserved > s.onHand || s.reserved < 0 {
			return fmt.Errorf("model: %s has %+v, live reservations %d", name, *s, live[name])
		}
	}
	return nil
}

// ---------------------------------------------------------------------------
// The model's operations: each says what the service may answer (from the
// model's state alone) and, once the service answered, what changed.

// newOrder records an order the service created for user (an idempotency
// key, lines normalised), PENDING until expires.
func (m *mbModel) newOrder(id, user, key string, lines []inventory.Line, created, expires time.Time) *mbOrder {
	o := &mbOrder{id: id, user: user, idem: key, lines: lines, token: id, created: created, expires: expires}
	m.orders[id] = o
	m.orderList = append(m.orderList, o)
	m.setStatus(o, order.Pending)
	if key != "" {
		m.byIdem[[2]string{user, key}] = o
	}
	m.hold(id, id, user, lines, arbiter.Held, expires)
	return o
}

// createOutcomes is what Create may answer, and the order a retry of an
// idempotency key answers with (nil for a new order).
func (m *mbModel) createOutcomes(user, key string, lines []inventory.Line) (mbSet, *mbOrder) {
	prior := m.byIdem[[2]string{user, key}]
	switch {
	case key != "" && prior != nil && slices.Equal(prior.lines, lines):
		return mbWant("ok"), prior // a retry: the same order
	case key != "" && prior != nil:
		return mbWant("conflict"), nil // the key was used for another order
	}
	return m.orderOutcomes(user, lines), nil
}

// payOutcome is what a payment callback of o with payment id pid answers:
// its class, the order's status after it, and whether it re-reserves an
// expired order's lines (a late payment while the stock is there).
func (m *mbModel) payOutcome(o *mbOrder, pid string) (class string, status order.Status, late bool) {
	other, used := m.payments[pid]
	switch {
	case o.payment != "" && pid == o.payment:
		return "ok", o.status, false // a duplicate callback: the order as it is
	case o.payment != "", used && other != o.id:
		return "conflict", o.status, false // paid by another payment; another order's payment
	case o.status == order.Pending:
		return "ok", order.Paid, false
	case o.status == order.Expired && m.lateFits(o):
		return "ok", order.Paid, true
	case o.status == order.Expired, o.status == order.Cancelled:
		return "ok", order.RefundRequired, false
	}
	return "conflict", o.status, false
}

func (m *mbModel) pay(o *mbOrder, pid string, status order.Status, late bool) {
	if o.payment != "" {
		return
	}
	o.payment = pid
	m.payments[pid] = o.id
	m.payList = append(m.payList, pid)
	switch {
	case late:
		o.token = o.id + ".late"
		m.hold(o.token, o.id, o.user, o.lines, arbiter.Committed, o.expires)
		m.promise(o.token, o.lines, arbiter.OpDeduct)
	case status == order.Paid:
		m.commit(o.token, o.lines)
	}
	m.setStatus(o, status)
}

func (m *mbModel) cancelOutcome(o *mbOrder) string {
	if o.status == order.Pending {
		return "ok"
	}
	return "conflict"
}

func (m *mbModel) cancel(o *mbOrder) {
	m.setStatus(o, order.Cancelled)
	m.release(o.id, "")
}

func (m *mbModel) refundOutcome(o *mbOrder) string {
	if o.status == order.Paid || o.status == order.RefundRequired {
		return "ok"
	}
	return "conflict"
}

// refund promises a paid order's units back (a REFUND_REQUIRED order never
// took stock).
func (m *mbModel) refund(o *mbOrder) {
	if o.status == order.Paid {
		m.promise(o.token, o.lines, arbiter.OpRestore)
	}
	m.setStatus(o, order.Refunded)
}

// reserveOutcomes is what the token API's Reserve of qty under k may
// answer.
func (m *mbModel) reserveOutcomes(k mbKey, qty int64) mbSet {
	s, row := m.skus[k.sku], m.res[k]
	want := mbSet{}
	switch {
	case s == nil:
		want["unknown"] = true
	case row != nil:
		switch {
		case row.state == arbiter.Released:
			want["released"] = true
		case row.qty != qty:
			want["conflict"] = true
		default:
			want["ok"] = true // the first answer, taking nothing
		}
		// Redis remembers a token for a while (and not across a key loss):
		// a replay it does not recognise is admitted as new, and when Redis
		// cannot cover it, refused as insufficient_stock (a 409 too) before
		// the database answers.
		if m.stale[k.sku] || !m.tokenKey[k] && s.limited() && s.available() < qty {
			want["insufficient"] = true
		}
	case s.limited() && s.available() < qty:
		want["insufficient"] = true
	default:
		want["ok"] = true
		if m.stale[k.sku] {
			want["insufficient"] = true
		}
	}
	return want
}

// extendOutcome is what an extension of o's hold to until (at now, by
// user, "" for an admin, with key) answers, and whether it moves the
// deadline: the order's conditional UPDATE, then Extend's reading of why it
// did not apply.
func (m *mbModel) extendOutcome(o *mbOrder, user, key string, now, until time.Time) (string, bool) {
	switch {
	case user != "" && user != o.user:
		return "forbidden", false
	case o.status != order.Pending:
		return "conflict", false
	case o.expires.After(now) && o.expires.Before(until) && !until.After(o.created.Add(mbMaxHold)) && (key == "" || key != o.extKey):
		return "ok", true
	case key != "" && key == o.extKey, o.expires.After(now) && !o.expires.Before(until):
		return "ok", false // a replay, or a deadline already as late
	}
	return "conflict", false // past the deadline, or past the maximum hold
}

// extendHoldOutcome is extendOutcome for a token-API hold under k.
func (m *mbModel) extendHoldOutcome(k mbKey, key string, now, until time.Time) (string, bool) {
	switch r := m.res[k]; {
	case r == nil:
		return "notfound", false
	case r.state == arbiter.Released:
		return "released", false
	case r.state != arbiter.Held:
		return "conflict", false
	case r.expires.After(now) && r.expires.Before(until) && !until.After(r.created.Add(mbMaxHold)) && (key == "" || key != r.extKey):
		return "ok", true
	case key != "" && key == r.extKey, r.expires.After(now) && !r.expires.Before(until):
		return "ok", false
	}
	return "conflict", false
}

// reserve records a new token-API reservation that answered result.
func (m *mbModel) reserve(k mbKey, qty, result int64, created, expires time.Time) {
	s := m.skus[k.sku]
	m.addRes(k, &mbRes{qty: qty, state: arbiter.Held, created: created, expires: expires, result: result})
	m.tokenHeld = append(m.tokenHeld, k)
	s.reserved += qty
	m.tokenKey[k] = s.limited() && !m.stale[k.sku]
}

// commitOutcome is what CommitToken under k answers, with the units.
func (m *mbModel) commitOutcome(k mbKey) (string, int64) {
	switch row := m.res[k]; {
	case row == nil:
		return "notfound", 0
	case row.state == arbiter.Released:
		return "released", 0
	default:
		return "ok", row.qty // a replay of a commit answers the units again
	}
}

func (m *mbModel) commitToken(k mbKey) {
	if row := m.res[k]; row.state == arbiter.Held {
		m.commit(k.token, []inventory.Line{{SKU: k.sku, Qty: row.qty}})
	}
}

// releaseOutcome is what ReleaseToken under k answers, with the units.
func (m *mbModel) releaseOutcome(k mbKey) (string, int64) {
	switch row := m.res[k]; {
	case row == nil && m.skus[k.sku] == nil:
		return "unknown", 0
	case row == nil, row.state == arbiter.Released:
		return "ok", 0
	case row.state == arbiter.Held:
		return "ok", row.qty
	default:
		return "conflict", 0 // committed: a sale
	}
}

func (m *mbModel) releaseToken(k mbKey, now time.Time) {
	if m.res[k] == nil { // released before it reserved: nothing may reserve under it
		m.addRes(k, &mbRes{state: arbiter.Released, expires: now})
		return
	}
	m.release(k.token, k.sku)
}

// adjustOutcome is what an adjust of sku by delta under ref ("" none)
// answers, and whether it applies.
func (m *mbModel) adjustOutcome(sku string, delta int64, ref string) (string, bool) {
	s := m.skus[sku]
	first, seen := m.refs[[2]string{sku, ref}]
	switch {
	case ref != "" && seen && first == delta:
		return "ok", false // a retry: applied once
	case ref != "" && seen:
		return "conflict", false // another delta under the same reference
	case s == nil:
		return "unknown", false
	case !s.limited() || s.onHand+delta < s.reserved:
		return "conflict", false
	}
	return "ok", true
}

func (m *mbModel) adjust(sku string, delta int64, ref string) {
	m.skus[sku].onHand += delta
	if ref != "" {
		m.refs[[2]string{sku, ref}] = delta
		m.refList = append(m.refList, mbRef{sku, ref, delta})
	}
}

func (m *mbModel) putOutcome(sku string, onHand int64) string {
	if s := m.skus[sku]; s != nil && onHand != inventory.Unlimited && onHand < s.reserved {
		return "conflict"
	}
	return "ok"
}

// put creates sku or sets its stock, limit and low-stock threshold; Redis
// is realigned. A new SKU's thresholds start as its levels are: nothing
// crossed, nothing announced.
func (m *mbModel) put(sku string, onHand, limit, threshold int64) {
	s := m.skus[sku]
	if s == nil {
		s = &mbSKU{}
		m.skus[sku] = s
		defer s.announce()
	}
	s.onHand, s.limit, s.threshold = onHand, limit, threshold
	delete(m.stale, sku)
}

// ---------------------------------------------------------------------------
// Outcomes.

// mbSet is a set of outcome classes (see mbClass).
type mbSet map[string]bool

func mbWant(classes ...string) mbSet {
	s := mbSet{}
	for _, c := range classes {
		s[c] = true
	}
	return s
}

func (s mbSet) String() string {
	var out []string
	for c := range s {
		out = append(out, c)
	}
	sort.Strings(out)
	return "{" + strings.Join(out, ", ") + "}"
}

// mbClass names an answer the way the specification does.
func mbClass(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, inventory.ErrNotStarted):
		return "notstarted"
	case errors.Is(err, inventory.ErrEnded):
		return "ended"
	case errors.Is(err, inventory.ErrUnknownSKU):
		return "unknown"
	case errors.Is(err, tokens.ErrReleased):
		return "released"
	case errors.Is(err, inventory.ErrInsufficientStock):
		return "insufficient"
	case errors.Is(err, inventory.ErrConflict):
		return "conflict"
	case errors.Is(err, inventory.ErrForbidden):
		return "forbidden"
	case errors.Is(err, inventory.ErrNotFound):
		return "notfound"
	case errors.Is(err, inventory.ErrInvalidArgument):
		return "invalid"
	}
	return "error"
}

// mbNormalise merges a cart's repeated SKUs and sorts it by name, byte for
// byte, as an order stores its lines.
func mbNormalise(lines []inventory.Line) []inventory.Line {
	merged := map[string]int64{}
	for _, l := range lines {
		merged[l.SKU] += l.Qty
	}
	out := make([]inventory.Line, 0, len(merged))
	for sku, q := range merged {
		out = append(out, inventory.Line{SKU: sku, Qty: q})
	}
	slices.SortFunc(out, func(a, b inventory.Line) int { return strings.Compare(a.SKU, b.SKU) })
	return out
}

// mbSwapCase spells s with every letter's case swapped.
func mbSwapCase(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case 'a' <= c && c <= 'z':
			b[i] = c - 'a' + 'A'
		case 'A' <= c && c <= 'Z':
			b[i] = c - 'A' + 'a'
		}
	}
	return string(b)
}

// ---------------------------------------------------------------------------
// The driver.

type mbDriver struct {
	t     *testing.T
	ctx   context.Context
	r     *testrig.Rig
	cat   *catalog.Catalog
	mem   *mq.Memory
	tm    *expiry.Timeouts
	ret   *maintenance.Retention
	sqlDB *sql.DB
	m     *mbModel
	rng   *rand.Rand
	seed  uint64
	ops   int
	step  int

	recent []string // the last operations, for the failure report
	// What the step touched (besides what the model changed), compared
	// after it; anomalies: the step delivered stock messages.
	touchedTokens map[string]bool
	touchedOrders map[string]bool
	anomalies     bool

	// The replay feed as read so far: the last event id, and per SKU the
	// last seq and what its events and its campaigns' said last (the
	// order the model cannot see within a step of several transactions
	// is checked against these).
	lastEvent int64
	feed      map[string]*mbFeed

	snapshot  map[string]map[string]string // name -> Redis key -> DUMP
	counter   int                          // fresh names
	malformed []mq.Message
	stats     map[string]int
}

// mbOp is one kind of operation the driver picks, with its weight.
type mbOp struct {
	name   string
	weight int
	run    func(*mbDriver)
}

var mbOps = []mbOp{
	{"create", 14, (*mbDriver).create},
	{"cart", 7, (*mbDriver).cart},
	{"seckill", 10, (*mbDriver).seckill},
	{"reserve", 10, (*mbDriver).reserve},
	{"commit", 5, (*mbDriver).commit},
	{"release", 5, (*mbDriver).release},
	{"pay", 12, (*mbDriver).pay},
	{"cancel", 5, (*mbDriver).cancel},
	{"extend", 4, (*mbDriver).extend},
	{"extendHold", 3, (*mbDriver).extendHold},
	{"campaign", 2, (*mbDriver).putCampaign},
	{"buyCampaign", 8, (*mbDriver).buyCampaign},
	{"endCampaign", 1, (*mbDriver).endCampaign},
	{"refund", 5, (*mbDriver).refund},
	{"spelling", 1, (*mbDriver).otherSpelling},
	{"expire", 3, (*mbDriver).expire},
	{"retention", 1, (*mbDriver).retention},
	{"adjust", 6, (*mbDriver).adjust},
	{"put", 2, (*mbDriver).put},
	{"flush", 1, (*mbDriver).flush},
	{"snapshot", 1, (*mbDriver).takeSnapshot},
	{"rollback", 1, (*mbDriver).rollback},
	{"drain", 5, (*mbDriver).drainOp},
	{"redeliver", 2, (*mbDriver).redeliver},
	{"malformed", 1, (*mbDriver).malformedOp},
	{"quiet", 1, (*mbDriver).quietOp},
}

func mbEnvInt(t *testing.T, name string, def uint64) uint64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return n
}

// mbDefaultSeed is make test's seed: the suite runs the same 10,000
// operations every time (a failure in CI is a replayable bug, never luck);
// `make model` explores fresh seeds, longer.
const mbDefaultSeed = 20261123

// TestModel runs INVENTORY_MODEL_OPS (default 10000) random operations,
// seeded by INVENTORY_MODEL_SEED (default mbDefaultSeed), against the
// service and the model, and fails at the first step where they disagree.
func TestModel(t *testing.T) {
	seed := mbEnvInt(t, "INVENTORY_MODEL_SEED", mbDefaultSeed)
	ops := int(mbEnvInt(t, "INVENTORY_MODEL_OPS", 10000))
	t.Logf("seed %d, %d operations (replay with INVENTORY_MODEL_SEED=%d)", seed, ops, seed)

	d := newMBDriver(t, seed, ops)
	total := 0
	for _, op := range mbOps {
		total += op.weight
	}
	start := time.Now()
	deadline, hasDeadline := t.Deadline()
	for d.step = 1; d.step <= ops; d.step++ {
		if hasDeadline && d.step%100 == 0 && time.Until(deadline) < time.Minute {
			t.Fatalf("stopped after %d of %d operations (seed %d): go test's -timeout is too short for INVENTORY_MODEL_OPS; run the long model with -timeout 0",
				d.step, ops, seed)
		}
		n := d.rng.IntN(total)
		for _, op := range mbOps {
			if n -= op.weight; n < 0 {
				op.run(d)
				break
			}
		}
		d.check()
		if d.step%1000 == 0 {
			d.quiet(true)
		}
	}
	d.step = ops
	d.quiet(true)
	d.report(time.Since(start))
}

func newMBDriver(t *testing.T, seed uint64, ops int) *mbDriver {
	mem := mq.NewMemory(8)
	tr := testrig.Transport{
		Producer: mem.Producer(),
		Consumer: func(t testing.TB, h mq.Handler) mq.Consumer { return mem.Consumer(h, 32, 20*time.Millisecond) },
	}
	r := testrig.New(t, tr)
	tm, err := expiry.NewTimeouts(r.Orders, r.RDB, expiry.TimeoutConfig{Now: r.Clock.Now, Locker: r.Stock.Locker(), Holds: r.Tokens})
	if err != nil {
		t.Fatalf("timeouts: %v", err)
	}
	sqlDB, err := r.DB.DB()
	if err != nil {
		t.Fatalf("database: %v", err)
	}
	d := &mbDriver{
		t: t, ctx: context.Background(), r: r, cat: r.Catalog, mem: mem, tm: tm, sqlDB: sqlDB,
		ret: maintenance.NewRetention(r.DB, r.Stock.Locker(), maintenance.RetentionConfig{Horizon: mbHorizon, Now: r.Clock.Now}),
		m:   newMBModel(), rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), seed: seed, ops: ops,
		stats: map[string]int{}, touchedTokens: map[string]bool{}, touchedOrders: map[string]bool{},
		feed: map[string]*mbFeed{},
	}
	for _, s := range mbInitial {
		if _, err := d.cat.Put(d.ctx, s.sku, s.onHand, s.limit); err != nil {
			t.Fatalf("put %s: %v", s.sku, err)
		}
		d.m.put(s.sku, s.onHand, s.limit, 0)
	}
	return d
}

// ---------------------------------------------------------------------------
// Reporting.

func (d *mbDriver) note(format string, args ...any) {
	d.recent = append(d.recent, fmt.Sprintf("#%d %s", d.step, fmt.Sprintf(format, args...)))
	if len(d.recent) > 20 {
		d.recent = d.recent[len(d.recent)-20:]
	}
}

func (d *mbDriver) failf(format string, args ...any) {
	d.t.Helper()
	d.t.Fatalf("model disagrees with the service at step %d of %d: %s\nreplay with INVENTORY_MODEL_SEED=%d INVENTORY_MODEL_OPS=%d\nlast operations:\n  %s",
		d.step, d.ops, fmt.Sprintf(format, args...), d.seed, d.ops, strings.Join(d.recent, "\n  "))
}

// expect notes the operation with its answer and fails unless the answer's
// class is one the model allows.
func (d *mbDriver) expect(what string, err error, want mbSet) string {
	d.t.Helper()
	got := mbClass(err)
	d.note("%s -> %s", what, got)
	d.stats[strings.Fields(what)[0]+" "+got]++
	if !want[got] {
		d.failf("%s: the service answered %s (%v), the model allows %s", what, got, err, want)
	}
	return got
}

func (d *mbDriver) must(what string, err error) {
	d.t.Helper()
	if err != nil {
		d.note("%s -> error %v", what, err)
		d.failf("%s: %v", what, err)
	}
}

func (d *mbDriver) report(took time.Duration) {
	keys := make([]string, 0, len(d.stats))
	for k := range d.stats {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%d ", k, d.stats[k])
	}
	orders := map[order.Status]int{}
	for _, o := range d.m.orderList {
		orders[o.status]++
	}
	d.t.Logf("%d operations in %s (seed %d); orders %v; outcomes: %s", d.ops, took.Round(time.Millisecond), d.seed, orders, b.String())
	for _, name := range mbNames {
		if s := d.m.skus[name]; s != nil {
			d.t.Logf("%s: on_hand %d reserved %d limit %d", name, s.onHand, s.reserved, s.limit)
		}
	}
}

// ---------------------------------------------------------------------------
// Picking.

func (d *mbDriver) pick(from []string) string { return from[d.rng.IntN(len(from))] }

func (d *mbDriver) now() time.Time { return d.r.Clock.Now().UTC().Truncate(time.Microsecond) }

func (d *mbDriver) fresh(prefix string) string {
	d.counter++
	return fmt.Sprintf("%s-%d", prefix, d.counter)
}

// pickOrder picks an order in one of statuses (with probability 3/4 when
// there is one), or any order; nil if there is none.
func (d *mbDriver) pickOrder(statuses ...order.Status) *mbOrder {
	if len(d.m.orderList) == 0 {
		return nil
	}
	if len(statuses) > 0 && d.rng.IntN(4) != 0 {
		st := statuses[d.rng.IntN(len(statuses))]
		list := d.m.byStatus[st]
		for len(list) > 0 {
			i := d.rng.IntN(len(list))
			if list[i].status == st {
				d.m.byStatus[st] = list
				return list[i]
			}
			list[i] = list[len(list)-1]
			list = list[:len(list)-1]
		}
		d.m.byStatus[st] = list
	}
	return d.m.orderList[d.rng.IntN(len(d.m.orderList))]
}

// pickTokenKey picks a SKU and client token: often one that reserved
// lately (a replay), otherwise any of this generation.
func (d *mbDriver) pickTokenKey() (sku, token string) {
	if n := len(d.m.tokenRes); n > 0 && d.rng.IntN(5) < 2 {
		k := d.m.tokenRes[n-1-d.rng.IntN(min(n, 40))] // a recent one
		return k.sku, strings.TrimPrefix(k.token, "t.")
	}
	return d.pick(mbNames), d.pick(mbTokens) + strconv.Itoa(d.step/200)
}

func (d *mbDriver) touchOrder(o *mbOrder) {
	d.touchedOrders[o.id] = true
	d.touchedTokens[o.id] = true
	d.touchedTokens[o.id+".late"] = true
}

// ---------------------------------------------------------------------------
// Operations: orders.

func (d *mbDriver) create() {
	lines := []inventory.Line{{SKU: d.pick(mbNames), Qty: 1 + d.rng.Int64N(3)}}
	d.order("create", d.pick(mbUsers), d.pickIdem(), lines)
}

func (d *mbDriver) cart() {
	var lines []inventory.Line
	for n := 2 + d.rng.IntN(2); n > 0; n-- {
		lines = append(lines, inventory.Line{SKU: d.pick(mbNames), Qty: 1 + d.rng.Int64N(2)})
	}
	d.order("cart", d.pick(mbUsers), d.pickIdem(), lines)
}

func (d *mbDriver) pickIdem() string {
	if d.rng.IntN(5) < 3 {
		return ""
	}
	return d.pick(mbIdem) + strconv.Itoa(d.step/300)
}

func (d *mbDriver) order(what, user, key string, raw []inventory.Line) {
	lines := mbNormalise(raw)
	want, prior := d.m.createOutcomes(user, key, lines)
	hold := d.pickHold()
	o, err := d.r.Orders.CreateHold(d.ctx, user, key, raw, hold)
	if d.expect(fmt.Sprintf("%s user=%s key=%q %v hold=%s", what, user, key, lines, hold), err, want) != "ok" {
		return
	}
	if prior != nil {
		d.touchOrder(prior)
		if o.ID != prior.id {
			d.failf("a retry with key %q of %s answered order %s, not %s", key, user, o.ID, prior.id)
		}
		return
	}
	d.created(o, user, key, lines, hold)
}

// pickHold is a hold to ask for: mostly none (the default), else a short
// flash-sale hold, a long checkout one, or the longest allowed.
func (d *mbDriver) pickHold() time.Duration {
	switch n := d.rng.IntN(8); {
	case n < 5:
		return 0
	case n == 5:
		return 2 * time.Minute
	case n == 6:
		return 40 * time.Minute
	}
	return mbMaxHold
}

// created checks an order the service created, holding its units for hold
// (0: the default), and records it.
func (d *mbDriver) created(o *order.Order, user, key string, lines []inventory.Line, hold time.Duration) {
	if hold == 0 {
		hold = testrig.TTL
	}
	expires := d.now().Add(hold)
	if o.Status != order.Pending || !slices.Equal(o.Lines(), lines) || o.UserID != user || !o.ExpiresAt.Equal(expires) {
		d.failf("created order %s is %s %v of %s expiring %s; the model has PENDING %v of %s expiring %s",
			o.ID, o.Status, o.Lines(), o.UserID, o.ExpiresAt, lines, user, expires)
	}
	if d.m.orders[o.ID] != nil {
		d.failf("order id %s given twice", o.ID)
	}
	d.note("  order %s", o.ID)
	d.touchOrder(d.m.newOrder(o.ID, user, key, lines, d.now(), expires))
}

func (d *mbDriver) seckill() {
	user, sku := d.pick(mbUsers), d.pick(mbNames)
	var limit int64
	if s := d.m.skus[sku]; s != nil && d.rng.IntN(10) < 7 {
		limit = s.limit // what the HTTP layer passes; sometimes the plain path
	}
	lines := []inventory.Line{{SKU: sku, Qty: 1}}
	want := d.m.orderOutcomes(user, lines)
	if limit > 0 {
		want = d.m.seckillOutcomes(user, sku)
	}
	hold := d.pickHold()
	o, err := d.r.Orders.SeckillHold(d.ctx, user, sku, limit, hold)
	if d.expect(fmt.Sprintf("seckill user=%s %s limit=%d hold=%s", user, sku, limit, hold), err, want) == "ok" {
		d.created(o, user, "", lines, hold)
	}
}

// pay delivers a payment callback: the first, a duplicate, a second payment
// id, another order's payment id or another spelling of one, on an order
// pending, expired (a late payment), cancelled or paid.
func (d *mbDriver) pay() {
	o := d.pickOrder(order.Pending, order.Pending, order.Expired, order.Cancelled, order.Paid)
	if o == nil {
		return
	}
	pid := d.fresh("pay")
	switch n := d.rng.IntN(20); {
	case n < 6 && o.payment != "":
		pid = o.payment // a duplicate callback
	case n < 9 && len(d.m.payList) > 0:
		pid = d.m.payList[d.rng.IntN(len(d.m.payList))] // perhaps another order's payment
	case n < 12 && len(d.m.payList) > 0:
		pid = mbSwapCase(d.m.payList[d.rng.IntN(len(d.m.payList))]) // another payment id
	}
	want, status, late := d.m.payOutcome(o, pid)
	got, err := d.r.Orders.Pay(d.ctx, o.id, pid)
	d.touchOrder(o)
	if d.expect(fmt.Sprintf("pay %s (%s) payment=%s", o.id, o.status, pid), err, mbWant(want)) != "ok" {
		return
	}
	if got.Status != status || got.PaymentID == nil || *got.PaymentID != pid {
		d.failf("pay %s answered %s paid by %v; the model has %s paid by %s", o.id, got.Status, got.PaymentID, status, pid)
	}
	d.m.pay(o, pid, status, late)
}

func (d *mbDriver) cancel() {
	o := d.pickOrder(order.Pending)
	if o == nil {
		return
	}
	want := d.m.cancelOutcome(o)
	got, err := d.r.Orders.Cancel(d.ctx, o.id)
	d.touchOrder(o)
	if d.expect(fmt.Sprintf("cancel %s (%s)", o.id, o.status), err, mbWant(want)) != "ok" {
		return
	}
	if got.Status != order.Cancelled {
		d.failf("cancel %s answered %s", o.id, got.Status)
	}
	d.m.cancel(o)
}

// extend moves an order's deadline: by its buyer, an admin or another
// buyer, with no key, a fresh key or the last extension's (a retry), for a
// hold that fits, is shorter than the order has, or passes the maximum.
func (d *mbDriver) extend() {
	o := d.pickOrder(order.Pending, order.Pending, order.Expired)
	if o == nil {
		return
	}
	user := o.user
	switch n := d.rng.IntN(10); {
	case n == 0:
		user = ""
	case n == 1:
		user = d.pick(mbUsers)
	}
	key := d.pickExtKey(o.extKey)
	by := []time.Duration{time.Minute, 10 * time.Minute, 30 * time.Minute, mbMaxHold}[d.rng.IntN(4)]
	now := d.now()
	want, moves := d.m.extendOutcome(o, user, key, now, now.Add(by))
	got, err := d.r.Orders.Extend(d.ctx, o.id, user, key, by)
	d.touchOrder(o)
	if d.expect(fmt.Sprintf("extend %s (%s, ends %s) by %q key=%q +%s", o.id, o.status, o.expires, user, key, by), err, mbWant(want)) != "ok" {
		return
	}
	if moves {
		o.expires, o.extKey = now.Add(by), key
	}
	if !got.ExpiresAt.Equal(o.expires) {
		d.failf("extend answered a deadline %s, the model %s", got.ExpiresAt, o.expires)
	}
}

// pickExtKey is an extension's Idempotency-Key: none, a fresh one, or last
// (a retry of the extension that moved the hold last).
func (d *mbDriver) pickExtKey(last string) string {
	switch n := d.rng.IntN(5); {
	case n < 2:
		return ""
	case n < 4 || last == "":
		return d.fresh("ext")
	}
	return last
}

// extendHold moves a token-API hold's end, as extend does an order's.
func (d *mbDriver) extendHold() {
	sku, token := d.pickTokenKey()
	if n := len(d.m.tokenHeld); n > 0 && d.rng.IntN(2) == 0 {
		k := d.m.tokenHeld[d.rng.IntN(n)]
		sku, token = k.sku, strings.TrimPrefix(k.token, "t.")
	}
	k := mbKey{"t." + token, sku}
	last := ""
	if r := d.m.res[k]; r != nil {
		last = r.extKey
	}
	key := d.pickExtKey(last)
	by := []time.Duration{time.Minute, 10 * time.Minute, 30 * time.Minute, mbMaxHold}[d.rng.IntN(4)]
	now := d.now()
	want, moves := d.m.extendHoldOutcome(k, key, now, now.Add(by))
	end, err := d.r.Tokens.Extend(d.ctx, sku, token, key, by)
	d.touchedTokens[k.token] = true
	if d.expect(fmt.Sprintf("extend hold %s token=%s key=%q +%s", sku, token, key, by), err, mbWant(want)) != "ok" {
		return
	}
	r := d.m.res[k]
	if moves {
		r.expires, r.extKey = now.Add(by), key
	}
	if !end.Equal(r.expires) {
		d.failf("extend answered an end %s, the model %s", end, r.expires)
	}
}

// putCampaign puts a new campaign on a SKU (any of the names: an unknown
// one, an unlimited one, one whose window overlaps another campaign's, one
// that cannot cover the allotment are refused). Its window opens an hour
// ago by the database's clock, half an hour ahead of the node's (not yet),
// or, once the node's clock ran hours ahead of the database's, in between:
// a node whose clock runs fast, which Redis lets through and the database
// refuses.
//
// The node's clock here runs ahead of the database's (the expiries and the
// retention move it), so a SKU whose campaign ended at the node's time can
// have no later campaign the database would open: half the campaigns are
// of a SKU of their own (DEAL-n), which sells nothing else.
func (d *mbDriver) putCampaign() {
	id, sku := d.fresh("camp"), d.pick(mbNames)
	if d.rng.IntN(2) == 0 {
		sku = d.fresh("DEAL")
		stock := 2 + d.rng.Int64N(6)
		_, err := d.r.Catalog.Put(d.ctx, sku, stock, 0)
		d.must("put "+sku, err)
		d.m.put(sku, stock, 0, 0)
	}
	now, real := d.now(), time.Now().UTC().Truncate(time.Microsecond)
	starts := real.Add(-time.Hour)
	switch n := d.rng.IntN(5); {
	case n == 0:
		starts = now.Add(30 * time.Minute)
	case n == 1 && now.Sub(real) > 3*time.Hour:
		starts = real.Add(time.Hour)
	}
	ends := now.Add(time.Duration(24+d.rng.IntN(216)) * time.Hour)
	allotment, limit := 1+d.rng.Int64N(4), d.rng.Int64N(3)
	hold := []time.Duration{0, time.Minute}[d.rng.IntN(2)]
	want := d.m.putCampaignOutcome(id, sku, allotment, starts, ends)
	_, err := d.r.Campaigns.Put(d.ctx, id, campaign.Spec{SKU: sku, Allotment: allotment, StartsAt: starts, EndsAt: ends,
		PerUserLimit: limit, HoldSeconds: int64(hold / time.Second)}, nil)
	d.touchedTokens["c:"+id] = true
	if d.expect(fmt.Sprintf("campaign %s of %s x%d limit %d [%s, %s)", id, sku, allotment, limit, starts, ends), err, mbWant(want)) != "ok" {
		return
	}
	d.m.putCampaign(&mbCampaign{id: id, sku: sku, starts: starts, ends: ends, limit: limit, hold: hold}, allotment, now)
}

func (d *mbDriver) pickCampaign() *mbCampaign {
	if n := len(d.m.campList); n > 0 {
		return d.m.campList[n-1-d.rng.IntN(min(n, 6))] // a recent one
	}
	return nil
}

// buyCampaign buys one unit of a campaign for a buyer.
func (d *mbDriver) buyCampaign() {
	c := d.pickCampaign()
	if c == nil {
		return
	}
	user := d.pick(mbUsers)
	want := d.m.buyOutcomes(c, user, d.now(), time.Now())
	o, err := d.r.Campaigns.Buy(d.ctx, c.id, user, "")
	d.touchedTokens["c:"+c.id] = true
	if d.expect(fmt.Sprintf("buy campaign %s (%s) by %s", c.id, c.sku, user), err, want) != "ok" {
		return
	}
	hold := c.hold
	if hold == 0 {
		hold = testrig.TTL
	}
	expires := d.now().Add(hold)
	if o.Status != order.Pending || o.UserID != user || !slices.Equal(o.Lines(), []inventory.Line{{SKU: c.sku, Qty: 1}}) || !o.ExpiresAt.Equal(expires) {
		d.failf("campaign order %s is %s %v of %s ending %s; the model has PENDING 1 of %s for %s ending %s",
			o.ID, o.Status, o.Lines(), o.UserID, o.ExpiresAt, c.sku, user, expires)
	}
	d.note("  order %s", o.ID)
	d.touchOrder(d.m.bought(c, o.ID, user, d.now(), expires))
}

// endCampaign ends a campaign now (ended or not: ending twice changes nothing).
func (d *mbDriver) endCampaign() {
	c := d.pickCampaign()
	if c == nil || d.rng.IntN(3) != 0 {
		return
	}
	_, err := d.r.Campaigns.End(d.ctx, c.id)
	d.touchedTokens["c:"+c.id] = true
	if d.expect(fmt.Sprintf("end campaign %s", c.id), err, mbWant("ok")) != "ok" {
		return
	}
	d.m.endCampaign(c, d.now())
}

// refund refunds an order at any age: its deduction may be pending, applied,
// or applied so long ago that retention pruned its ledger row.
func (d *mbDriver) refund() {
	o := d.pickOrder(order.Paid, order.Paid, order.RefundRequired)
	if o == nil {
		return
	}
	want := d.m.refundOutcome(o)
	got, err := d.r.Orders.Refund(d.ctx, o.id)
	d.touchOrder(o)
	if d.expect(fmt.Sprintf("refund %s (%s)", o.id, o.status), err, mbWant(want)) != "ok" {
		return
	}
	if got.Status != order.Refunded {
		d.failf("refund %s answered %s", o.id, got.Status)
	}
	d.m.refund(o)
}

// otherSpelling addresses an order by its id with the letters' case
// swapped: no such order.
func (d *mbDriver) otherSpelling() {
	o := d.pickOrder()
	if o == nil || mbSwapCase(o.id) == o.id {
		return
	}
	id := mbSwapCase(o.id)
	var err error
	what := ""
	switch d.rng.IntN(4) {
	case 0:
		what = "get"
		_, err = d.r.Orders.Get(d.ctx, id)
	case 1:
		what = "pay"
		_, err = d.r.Orders.Pay(d.ctx, id, d.fresh("pay"))
	case 2:
		what = "cancel"
		_, err = d.r.Orders.Cancel(d.ctx, id)
	default:
		what = "refund"
		_, err = d.r.Orders.Refund(d.ctx, id)
	}
	d.touchOrder(o)
	d.expect(fmt.Sprintf("spelling %s %s (of %s)", what, id, o.id), err, mbWant("notfound"))
}

// expire moves the clock past deadlines and runs the timeout sweep: pending
// orders and token-API holds past their deadline are released.
func (d *mbDriver) expire() {
	ttl := testrig.TTL
	adv := []time.Duration{ttl + time.Minute, ttl / 3, 2 * ttl}[d.rng.IntN(3)]
	d.r.Clock.Advance(adv)
	n, err := d.tm.SweepOnce(d.ctx)
	want := d.m.sweep(d.now())
	d.note("expire: clock +%s, sweep -> %d expired (model %d), %v", adv, n, want, err)
	d.stats["expire"]++
	d.must("sweep", err)
	if n != want {
		d.failf("the sweep expired %d orders, the model %d", n, want)
	}
}

// retention jumps the clock past the retention horizon and prunes: ledger
// rows of everything applied so far go.
func (d *mbDriver) retention() {
	d.r.Clock.Advance(mbHorizon + time.Hour)
	p, err := d.ret.PruneOnce(d.ctx)
	d.note("retention: clock +%s, pruned %+v, %v", mbHorizon+time.Hour, p, err)
	d.stats["retention"]++
	d.must("retention", err)
}

// ---------------------------------------------------------------------------
// Operations: the token API.

// reserve reserves under a client's token: new, a replay, a replay with
// another quantity, or one released before.
func (d *mbDriver) reserve() {
	sku, token := d.pickTokenKey()
	k := mbKey{"t." + token, sku}
	row, s := d.m.res[k], d.m.skus[sku]
	qty := 1 + d.rng.Int64N(3)
	if row != nil && row.qty > 0 && d.rng.IntN(10) < 7 {
		qty = row.qty // a replay
	}
	want := d.m.reserveOutcomes(k, qty)
	hold := d.pickHold()
	held, err := d.r.Tokens.ReserveHold(d.ctx, sku, qty, token, hold)
	got := held.Result
	d.touchedTokens[k.token] = true
	if d.expect(fmt.Sprintf("reserve %s qty=%d token=%s hold=%s", sku, qty, token, hold), err, want) != "ok" {
		return
	}
	if hold == 0 {
		hold = testrig.TTL
	}
	switch {
	case row != nil && (got != row.result || !held.ExpiresAt.Equal(row.expires)):
		d.failf("a replay of token %s answered %d ending %s, the first reservation %d ending %s", token, got, held.ExpiresAt, row.result, row.expires)
	case row == nil && !held.ExpiresAt.Equal(d.now().Add(hold)):
		d.failf("reserve answered a hold ending %s, the model %s", held.ExpiresAt, d.now().Add(hold))
	case row != nil:
		return
	case d.m.stale[sku]: // what Redis had left is anyone's guess
	case s.limited() && got != s.available()-qty, !s.limited() && got != inventory.Unlimited:
		d.failf("reserve answered %d left, the model has %d available before taking %d", got, s.available(), qty)
	}
	d.m.reserve(k, qty, got, d.now(), d.now().Add(hold))
}

func (d *mbDriver) commit() {
	sku, token := d.pickTokenKey()
	if n := len(d.m.tokenHeld); n > 0 && d.rng.IntN(2) == 0 {
		k := d.m.tokenHeld[d.rng.IntN(n)] // perhaps held still
		sku, token = k.sku, strings.TrimPrefix(k.token, "t.")
	}
	k := mbKey{"t." + token, sku}
	want, qty := d.m.commitOutcome(k)
	got, err := d.r.Tokens.Commit(d.ctx, sku, token)
	d.touchedTokens[k.token] = true
	if d.expect(fmt.Sprintf("commit %s token=%s", sku, token), err, mbWant(want)) != "ok" {
		return
	}
	if got != qty {
		d.failf("commit answered %d units, the reservation holds %d", got, qty)
	}
	d.m.commitToken(k)
}

func (d *mbDriver) release() {
	sku, token := d.pickTokenKey()
	k := mbKey{"t." + token, sku}
	want, units := d.m.releaseOutcome(k)
	got, err := d.r.Tokens.Release(d.ctx, sku, token)
	d.touchedTokens[k.token] = true
	if d.expect(fmt.Sprintf("release %s token=%s", sku, token), err, mbWant(want)) != "ok" {
		return
	}
	if got != units {
		d.failf("release answered %d units, the model gives back %d", got, units)
	}
	d.m.releaseToken(k, d.now())
}

// ---------------------------------------------------------------------------
// Operations: the catalog.

// adjust adjusts a SKU's stock without a reference, with a fresh one, with
// one applied before (an operator's retry), with one applied before and
// another delta, or with another spelling of one applied before.
func (d *mbDriver) adjust() {
	sku := d.pick(mbNames)
	delta := int64(d.rng.IntN(8)) - 2
	if delta <= 0 {
		delta--
	}
	ref := ""
	switch n := d.rng.IntN(20); {
	case n < 7:
	case n < 13 || len(d.m.refList) == 0:
		ref = d.fresh("po")
	case n < 17: // an operator's retry
		r := d.m.refList[d.rng.IntN(len(d.m.refList))]
		sku, ref, delta = r.sku, r.ref, r.delta
	case n < 19: // the same reference, another delta
		r := d.m.refList[d.rng.IntN(len(d.m.refList))]
		sku, ref, delta = r.sku, r.ref, r.delta+1+int64(d.rng.IntN(3))
		if delta == 0 {
			delta++
		}
	default: // another spelling of a reference: another reference
		r := d.m.refList[d.rng.IntN(len(d.m.refList))]
		sku, ref, delta = r.sku, mbSwapCase(r.ref), r.delta
	}
	want, apply := d.m.adjustOutcome(sku, delta, ref)
	v, err := d.cat.Adjust(d.ctx, sku, delta, "model", ref)
	if d.expect(fmt.Sprintf("adjust %s %+d ref=%q", sku, delta, ref), err, mbWant(want)) != "ok" {
		return
	}
	if apply {
		d.m.adjust(sku, delta, ref)
	}
	s := d.m.skus[sku]
	if v.OnHand != s.onHand || v.Reserved != s.reserved || v.Available != s.available() ||
		!d.m.stale[sku] && v.RedisAvailable != s.available() {
		d.failf("adjust answered %+v; the model has on_hand %d reserved %d", *v, s.onHand, s.reserved)
	}
}

// put creates a SKU (perhaps another spelling of one that exists) or sets
// its stock (perhaps unlimited), per-user limit and low-stock threshold
// (half the time none).
func (d *mbDriver) put() {
	sku := d.pick(mbNames)
	onHand := int64(d.rng.IntN(11))
	if d.rng.IntN(10) == 0 {
		onHand = inventory.Unlimited
	}
	limit := int64(0)
	if d.rng.IntN(2) == 0 {
		limit = 1 + int64(d.rng.IntN(4))
	}
	threshold := max(0, int64(d.rng.IntN(8))-3)
	want := d.m.putOutcome(sku, onHand)
	v, err := d.cat.PutSettings(d.ctx, sku, arbiter.Settings{OnHand: onHand, PerUserLimit: limit, LowStockThreshold: threshold})
	if d.expect(fmt.Sprintf("put %s stock=%d limit=%d threshold=%d", sku, onHand, limit, threshold), err, mbWant(want)) != "ok" {
		return
	}
	d.m.put(sku, onHand, limit, threshold)
	s := d.m.skus[sku]
	if v.SKU != sku || v.OnHand != s.onHand || v.Reserved != s.reserved || v.Available != s.available() ||
		v.RedisAvailable != s.available() || v.Unlimited != !s.limited() || v.PerUserLimit != s.limit || v.LowStockThreshold != s.threshold {
		d.failf("put answered %+v; the model has on_hand %d reserved %d limit %d threshold %d", *v, s.onHand, s.reserved, s.limit, s.threshold)
	}
}

// ---------------------------------------------------------------------------
// Operations: Redis faults.

// flush loses every Redis key of the rig's database (FLUSHDB): stock values,
// remembered tokens, buyers' pre-filters.
func (d *mbDriver) flush() {
	err := d.r.RDB.FlushDB(d.ctx).Err()
	d.note("flushdb -> %v", err)
	d.stats["flush"]++
	d.must("flushdb", err)
	d.m.stale, d.m.staleQuota, d.m.tokenKey = map[string]bool{}, map[string]bool{}, map[mbKey]bool{}
	for _, c := range d.m.campList {
		c.stale = false // the next admission reads the database
	}
}

// skuKeys are the Redis keys of name's values (stock, buyers' pre-filter),
// not its remembered tokens or its init lock.
func (d *mbDriver) skuKeys(name string) []string {
	keys, err := d.r.RDB.Keys(d.ctx, "inv:{"+name+"}:*").Result()
	d.must("keys", err)
	out := keys[:0]
	for _, k := range keys {
		if !strings.Contains(k, "}:t:") && !strings.HasSuffix(k, "lock") {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

func (d *mbDriver) takeSnapshot() {
	d.snapshot = map[string]map[string]string{}
	for _, name := range mbNames {
		d.snapshot[name] = map[string]string{}
		for _, k := range d.skuKeys(name) {
			v, err := d.r.RDB.Dump(d.ctx, k).Result()
			if errors.Is(err, redis.Nil) {
				continue
			}
			d.must("dump "+k, err)
			d.snapshot[name][k] = v
		}
	}
	d.note("snapshot of Redis")
	d.stats["snapshot"]++
}

// rollback brings some SKUs' Redis values back to the snapshot (a Redis
// restarted from an old RDB file, or failed over to a lagging replica).
func (d *mbDriver) rollback() {
	if d.snapshot == nil {
		return
	}
	var rolled []string
	for _, name := range mbNames {
		if d.rng.IntN(2) == 0 {
			continue
		}
		keys := map[string]bool{}
		for _, k := range d.skuKeys(name) {
			keys[k] = true
		}
		for k := range d.snapshot[name] {
			keys[k] = true
		}
		for k := range keys {
			var err error
			if v, ok := d.snapshot[name][k]; ok {
				err = d.r.RDB.RestoreReplace(d.ctx, k, 0, v).Err()
			} else {
				err = d.r.RDB.Del(d.ctx, k).Err()
			}
			d.must("restore "+k, err)
		}
		d.m.stale[name], d.m.staleQuota[name] = true, true
		for _, c := range d.m.campList {
			if c.sku == name {
				c.stale = true // its pool and buyers are under the SKU's tag
			}
		}
		rolled = append(rolled, name)
	}
	d.note("rollback of Redis for %v", rolled)
	d.stats["rollback"]++
}

// ---------------------------------------------------------------------------
// Operations: the ordered sync.

// drain relays every outbox row and lets a consumer apply them all.
func (d *mbDriver) drain() {
	for i := 0; ; i++ {
		n, err := d.r.Relay.RelayOnce(d.ctx)
		d.must("relay", err)
		if n == 0 {
			break
		}
		if i > 10000 {
			d.failf("the relay keeps finding rows")
		}
	}
	if d.mem.Pending() > 0 {
		c := d.mem.Consumer(d.r.Applier.Handle, 32, 20*time.Millisecond)
		d.must("consumer", c.Start())
		deadline := time.Now().Add(60 * time.Second)
		for d.mem.Pending() > 0 {
			if time.Now().After(deadline) {
				_ = c.Close()
				d.failf("%d stock messages not applied after 60s", d.mem.Pending())
			}
			time.Sleep(time.Millisecond)
		}
		d.must("consumer", c.Close())
	}
	for _, msg := range d.m.outbox {
		d.touchedTokens[msg.token] = true
	}
	n := len(d.m.outbox)
	if err := d.m.drain(); err != nil {
		d.failf("%v", err)
	}
	d.note("drain: %d operations applied", n)
	d.anomalies = true
}

func (d *mbDriver) drainOp() {
	d.stats["drain"]++
	d.drain()
}

func mbMessage(sm arbiter.StockMessage) mq.Message {
	body, _ := json.Marshal(sm)
	return mq.Message{Key: sm.SKU, Body: body}
}

// redeliver delivers an applied operation again: nothing changes, however
// old it is (its ledger row may be pruned).
func (d *mbDriver) redeliver() {
	if len(d.m.applied) == 0 {
		return
	}
	msg := d.m.applied[d.rng.IntN(len(d.m.applied))]
	err := d.r.Applier.Handle(d.ctx, []mq.Message{mbMessage(arbiter.StockMessage{Token: msg.token, SKU: msg.sku, Op: msg.op, Qty: msg.qty})})
	d.touchedTokens[msg.token] = true
	d.anomalies = true
	d.expect(fmt.Sprintf("redeliver %s %s %s %d", msg.op, msg.sku, msg.token, msg.qty), err, mbWant("ok"))
}

// malformedOp delivers a message the consumer cannot apply: recorded as one
// anomaly (once however often it is delivered), applied never.
func (d *mbDriver) malformedOp() {
	d.anomalies = true
	if len(d.malformed) > 0 && d.rng.IntN(3) == 0 {
		msg := d.malformed[d.rng.IntN(len(d.malformed))]
		err := d.r.Applier.Handle(d.ctx, []mq.Message{msg})
		d.expect(fmt.Sprintf("malformed again %s %q", msg.ID, msg.Body), err, mbWant("ok"))
		return
	}
	id := d.fresh("bad")
	var msg mq.Message
	switch d.rng.IntN(6) {
	case 0:
		msg = mq.Message{Key: "CAB", Body: []byte("not json " + id)}
	case 1:
		msg = mbMessage(arbiter.StockMessage{Token: id, SKU: "CAB", Op: "STEAL", Qty: 1})
	case 2:
		msg = mbMessage(arbiter.StockMessage{Token: id, SKU: "CAB", Op: arbiter.OpDeduct, Qty: 0})
	case 3:
		msg = mbMessage(arbiter.StockMessage{Token: id, SKU: "no such sku!", Op: arbiter.OpDeduct, Qty: 1})
	case 4: // well formed, but no reservation of that token
		msg = mbMessage(arbiter.StockMessage{Token: id, SKU: d.pick(mbNames), Op: arbiter.OpDeduct, Qty: 1})
	default:
		msg = mbMessage(arbiter.StockMessage{Token: id, SKU: "PHONE-X", Op: arbiter.OpRestore, Qty: -2})
	}
	msg.ID = id
	d.malformed = append(d.malformed, msg)
	d.m.anomalies++
	err := d.r.Applier.Handle(d.ctx, []mq.Message{msg})
	d.expect(fmt.Sprintf("malformed %s %q", id, msg.Body), err, mbWant("ok"))
}

func (d *mbDriver) quietOp() {
	d.stats["quiet"]++
	d.quiet(false)
}

// ---------------------------------------------------------------------------
// Comparing the service with the model.

// check compares what every step may have changed: every SKU's quantities,
// every buyer's quota, the reservations and orders the step touched or the
// model changed, the anomalies after a delivery, and Redis's available
// units of every SKU Redis is not known to be wrong about (with the ordered
// sync stopped, every step ends at a quiet point).
func (d *mbDriver) check() {
	d.t.Helper()
	for tk := range d.m.dirtyTokens {
		d.touchedTokens[tk] = true
	}
	for id := range d.m.dirtyOrders {
		d.touchedOrders[id] = true
	}
	if d.anomalies {
		d.checkAnomalies() // first: an operation the consumer refused explains the rest
	}
	d.checkSKUs()
	d.checkQuotas()
	if len(d.touchedTokens) > 0 {
		d.checkReservations(d.touchedTokens)
	}
	if len(d.touchedOrders) > 0 {
		d.checkOrders(d.touchedOrders)
	}
	d.checkRedis(false)
	d.checkEvents()
	d.clean()
}

func (d *mbDriver) clean() {
	d.m.dirtyTokens, d.m.dirtyOrders = map[string]bool{}, map[string]bool{}
	d.touchedTokens, d.touchedOrders, d.anomalies = map[string]bool{}, map[string]bool{}, false
}

// quiet drains the ordered sync and compares Redis before and after the
// periodic realign; with full, it compares every reservation and order too
// (what no step touched must not have changed either).
func (d *mbDriver) quiet(full bool) {
	d.drain()
	d.checkRedis(false)
	realigned, err := d.r.Reconciler().Realign(d.ctx)
	d.note("quiet point: realigned %v", realigned)
	d.must("realign", err)
	d.m.stale = map[string]bool{}
	d.checkRedis(true)
	if !full {
		d.check()
		return
	}
	if err := d.m.selfCheck(); err != nil {
		d.failf("%v", err)
	}
	d.checkAnomalies()
	d.checkSKUs()
	d.checkQuotas()
	d.checkReservations(nil)
	d.checkOrders(nil)
	d.checkEvents()
	d.clean()
}

func (d *mbDriver) diff(what string, got, want map[string]string) {
	d.t.Helper()
	var lines []string
	for k, w := range want {
		if g, ok := got[k]; !ok {
			lines = append(lines, fmt.Sprintf("%s: service has none, model %s", k, w))
		} else if g != w {
			lines = append(lines, fmt.Sprintf("%s: service %s, model %s", k, g, w))
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			lines = append(lines, fmt.Sprintf("%s: service %s, model has none", k, g))
		}
	}
	if len(lines) > 0 {
		sort.Strings(lines)
		d.failf("%s differ:\n    %s", what, strings.Join(lines, "\n    "))
	}
}

// rows runs query (its "IN ?" expanded for in, if any) on the database
// directly (no ORM: the checks run after every step) and calls scan for
// every row.
func (d *mbDriver) rows(query string, in map[string]bool, scan func(*sql.Rows) error) {
	d.t.Helper()
	var args []any
	if in != nil {
		marks := strings.TrimSuffix(strings.Repeat("?,", len(in)), ",")
		query = strings.Replace(query, "IN ?", "IN ("+marks+")", 1)
		for k := range in {
			args = append(args, k)
		}
	}
	rows, err := d.sqlDB.QueryContext(d.ctx, query, args...)
	d.must(query, err)
	defer rows.Close()
	for rows.Next() {
		d.must(query, scan(rows))
	}
	d.must(query, rows.Err())
}

func (d *mbDriver) checkSKUs() {
	d.t.Helper()
	got, want := map[string]string{}, map[string]string{}
	d.rows(`SELECT sku, on_hand, reserved, per_user_limit, low_stock_threshold FROM skus`, nil, func(r *sql.Rows) error {
		var sku string
		var onHand, reserved, limit, threshold int64
		err := r.Scan(&sku, &onHand, &reserved, &limit, &threshold)
		got[sku] = fmt.Sprintf("on_hand=%d reserved=%d limit=%d threshold=%d", onHand, reserved, limit, threshold)
		return err
	})
	for name, s := range d.m.skus {
		want[name] = fmt.Sprintf("on_hand=%d reserved=%d limit=%d threshold=%d", s.onHand, s.reserved, s.limit, s.threshold)
	}
	d.diff("SKUs", got, want)
}

func (d *mbDriver) checkQuotas() {
	d.t.Helper()
	got, want := map[string]string{}, map[string]string{}
	d.rows(`SELECT sku, user_id, qty FROM buyer_quotas WHERE qty <> 0`, nil, func(r *sql.Rows) error {
		var sku, user string
		var qty int64
		err := r.Scan(&sku, &user, &qty)
		got[sku+"/"+user] = strconv.FormatInt(qty, 10)
		return err
	})
	for k, q := range d.m.quota {
		if q != 0 {
			want[k.sku+"/"+k.user] = strconv.FormatInt(q, 10)
		}
	}
	d.diff("buyers' quotas", got, want)
}

// checkReservations compares the reservations of tokens (all if nil).
func (d *mbDriver) checkReservations(tokens map[string]bool) {
	d.t.Helper()
	query := `SELECT token, sku, qty, state, COALESCE(buyer, ''), COALESCE(order_id, ''), expires_at FROM stock_reservations`
	if tokens != nil {
		query += ` WHERE token IN ?`
	}
	got, want := map[string]string{}, map[string]string{}
	d.rows(query, tokens, func(r *sql.Rows) error {
		var token, sku, state, buyer, order string
		var qty int64
		var expires time.Time
		if err := r.Scan(&token, &sku, &qty, &state, &buyer, &order, &expires); err != nil {
			return err
		}
		if tokens != nil && !tokens[token] { // another spelling
			return nil
		}
		if m := d.m.res[mbKey{token, sku}]; m != nil && m.state == mbRestored && (state == string(arbiter.Sold) || state == string(mbRestored)) {
			state = string(mbRestored) // whatever a refund leaves
		}
		got[token+"/"+sku] = fmt.Sprintf("qty=%d %s buyer=%q order=%q", qty, state, buyer, order) + holdEnd(order, state, expires)
		return nil
	})
	for k, r := range d.m.res {
		if tokens == nil || tokens[k.token] {
			want[k.token+"/"+k.sku] = fmt.Sprintf("qty=%d %s buyer=%q order=%q", r.qty, r.state, r.buyer, r.order) +
				holdEnd(r.order, string(r.state), r.expires)
		}
	}
	d.diff("reservations", got, want)
}

// holdEnd is a HELD token-API reservation's end as the checks compare it
// (an order's hold ends at the order's deadline, compared with the order).
func holdEnd(order, state string, expires time.Time) string {
	if order != "" || state != string(arbiter.Held) {
		return ""
	}
	return " ends " + expires.UTC().Format(time.RFC3339Nano)
}

// checkOrders compares the orders ids (all if nil).
func (d *mbDriver) checkOrders(ids map[string]bool) {
	d.t.Helper()
	query := `SELECT id, status, COALESCE(payment_id, ''), reservation_token, expires_at FROM orders`
	if ids != nil {
		query += ` WHERE id IN ?`
	}
	got, want := map[string]string{}, map[string]string{}
	d.rows(query, ids, func(r *sql.Rows) error {
		var id, status, pay, token string
		var expires time.Time
		if err := r.Scan(&id, &status, &pay, &token, &expires); err != nil {
			return err
		}
		if ids == nil || ids[id] {
			got[id] = fmt.Sprintf("%s payment=%q token=%s ends %s", status, pay, token, expires.UTC().Format(time.RFC3339Nano))
		}
		return nil
	})
	for id, o := range d.m.orders {
		if ids == nil || ids[id] {
			want[id] = fmt.Sprintf("%s payment=%q token=%s ends %s", o.status, o.payment, o.token, o.expires.UTC().Format(time.RFC3339Nano))
		}
	}
	d.diff("orders", got, want)
}

func (d *mbDriver) checkAnomalies() {
	d.t.Helper()
	var n int64
	d.must("count anomalies", d.sqlDB.QueryRowContext(d.ctx, `SELECT COUNT(*) FROM stock_anomalies`).Scan(&n))
	if n != d.m.anomalies {
		var rows []arbiter.AnomalyRow
		_ = d.r.DB.Order("id").Find(&rows).Error
		var b strings.Builder
		for _, a := range rows {
			fmt.Fprintf(&b, "\n    %s %s %s qty=%d: %s", a.Op, a.SKU, a.Token, a.Qty, a.Reason)
		}
		d.failf("stock_anomalies has %d rows, the model expects %d (one per malformed or unapplicable message):%s", n, d.m.anomalies, b.String())
	}
}

// checkRedis compares Redis's available units with the model's for every
// SKU Redis is not known to be wrong about; an unknown name has no value.
// With initialise, every known SKU is read (initialising a lost value).
func (d *mbDriver) checkRedis(initialise bool) {
	d.t.Helper()
	if initialise {
		for name := range d.m.skus {
			d.must("init "+name, d.r.Stock.EnsureInit(d.ctx, name))
		}
	}
	lvs, err := d.r.Stock.LevelsOf(d.ctx, mbNames)
	d.must("levels", err)
	for i, name := range mbNames {
		s, lv := d.m.skus[name], lvs[i]
		switch {
		case s == nil && lv.Initialised:
			d.failf("Redis holds %d available for %s, which does not exist", lv.Available, name)
		case s == nil, d.m.stale[name], !lv.Initialised:
		case lv.Available != s.available():
			d.failf("Redis has %d available for %s; the model on_hand %d - reserved %d = %d",
				lv.Available, name, s.onHand, s.reserved, s.available())
		}
	}
}

// mbFeed is what the replay feed said of a SKU so far: its last seq,
// whether its last threshold event was sold_out, and per campaign what
// its events said (started, sold out, ended).
type mbFeed struct {
	seq       int64
	soldOut   bool
	campaigns map[string]*[3]bool
}

// checkEvents numbers the events the step wrote for the replay feed, as the
// events job does, reads them from the feed after the last one read, and
// compares them per SKU with what the model says the step crossed: the
// SKUs' thresholds (sold out at 0 available, back from 0, low at or below
// the threshold) and the campaigns' events (opened by the first sale, the
// pool at 0, back from 0 while the campaign runs, the end). Within a step
// of several transactions (a sweep, a drain) the model knows what crossed,
// not in which order: there the events are compared as a set, and their
// order is held to what a receiver relies on instead: each SKU's seqs run
// 1, 2, 3, ... with no gap, sold_out and back_in_stock alternate (a SKU's
// and each campaign's), a campaign opens before its other events and
// nothing follows its end, and each event's levels are the SKU's
// (available = on_hand - reserved) and say what it says.
func (d *mbDriver) checkEvents() {
	d.t.Helper()
	want := d.m.events
	d.m.events = map[string][]string{}
	for name, s := range d.m.skus {
		want[name] = append(want[name], s.announce()...)
	}
	for {
		var n int
		d.must("publish", arbiter.Transact(d.ctx, d.r.DB, func(tx *gorm.DB) (err error) {
			n, err = arbiter.EventsOf(tx).Publish(500)
			return err
		}))
		if n < 500 {
			break
		}
	}
	got := map[string][]string{}
	for {
		page, err := arbiter.EventsOf(d.r.DB).Page(arbiter.EventFilter{After: d.lastEvent, Limit: 500})
		d.must("feed", err)
		for _, e := range page {
			d.lastEvent = *e.ID
			d.checkEvent(e)
			name := e.Type
			if e.CampaignID != nil {
				name += " " + *e.CampaignID
			}
			got[e.SKU] = append(got[e.SKU], name)
		}
		if len(page) < 500 {
			break
		}
	}
	if len(got) > 0 {
		d.note("  events %v", got)
	}
	g, w := map[string]string{}, map[string]string{}
	for sku, evs := range got {
		sort.Strings(evs)
		g[sku] = strings.Join(evs, ", ")
	}
	for sku, evs := range want {
		if len(evs) > 0 {
			sort.Strings(evs)
			w[sku] = strings.Join(evs, ", ")
		}
	}
	d.diff("stock events of the step", g, w)
}

// checkEvent holds one event of the feed to what its SKU's events said
// before it.
func (d *mbDriver) checkEvent(e arbiter.Event) {
	d.t.Helper()
	f := d.feed[e.SKU]
	if f == nil {
		f = &mbFeed{campaigns: map[string]*[3]bool{}}
		d.feed[e.SKU] = f
	}
	if e.Seq != f.seq+1 {
		d.failf("%s's event %s has seq %d after seq %d", e.SKU, e.Type, e.Seq, f.seq)
	}
	f.seq = e.Seq
	limited := e.OnHand != inventory.Unlimited
	if limited && e.Available != e.OnHand-e.Reserved || !limited && e.Available != inventory.Unlimited {
		d.failf("%s's event %s (seq %d) carries on_hand %d reserved %d available %d", e.SKU, e.Type, e.Seq, e.OnHand, e.Reserved, e.Available)
	}
	bad := ""
	if strings.HasPrefix(e.Type, "campaign.") != (e.CampaignID != nil) {
		bad = "a campaign id on a SKU's event, or none on a campaign's"
	}
	switch e.Type {
	case arbiter.EventSoldOut:
		if f.soldOut || e.Available != 0 {
			bad = "sold out again, or with units available"
		}
		f.soldOut = true
	case arbiter.EventBackInStock:
		if !f.soldOut || limited && e.Available <= 0 {
			bad = "back in stock without a sold_out before, or with none available"
		}
		f.soldOut = false
	case arbiter.EventLowStock:
		if !limited {
			bad = "low stock of an unlimited SKU"
		}
	default:
		if e.CampaignID == nil {
			break
		}
		c := f.campaigns[*e.CampaignID]
		if c == nil {
			c = &[3]bool{}
			f.campaigns[*e.CampaignID] = c
		}
		started, soldOut, ended := &c[0], &c[1], &c[2]
		switch {
		case *ended:
			bad = "after the campaign's end"
		case e.Type == arbiter.EventCampaignStarted && *started, e.Type != arbiter.EventCampaignStarted && e.Type != arbiter.EventCampaignEnded && !*started:
			bad = "opened twice, or a sale's event before the opening"
		case e.Type == arbiter.EventCampaignSoldOut && *soldOut, e.Type == arbiter.EventCampaignBackInStock && !*soldOut:
			bad = "sold_out and back_in_stock out of turn"
		}
		switch e.Type {
		case arbiter.EventCampaignStarted:
			*started = true
		case arbiter.EventCampaignSoldOut:
			*soldOut = true
		case arbiter.EventCampaignBackInStock:
			*soldOut = false
		case arbiter.EventCampaignEnded:
			*ended = true
		}
	}
	if bad != "" {
		d.failf("%s's event %s (seq %d, campaign %v): %s", e.SKU, e.Type, e.Seq, e.CampaignID, bad)
	}
}
