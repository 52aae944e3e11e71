package main

import (
	"fmt"
	"hash/maphash"
	"slices"
	"strings"

	"github.com/benbjohnson/immutable"
)

// The sequential model of one SKU the history is checked against
// (linearizable.go). One SKU's state is what the database holds for it and
// for every hold of it: on_hand and reserved, the holds and their states,
// the units each buyer has counted against a per-user limit, a campaign's
// pool, and the sales and refunds paid but not yet applied by the ordered
// sync.
//
// The ordered sync applies those in commit order, in the background: a
// sale takes its units out of on_hand and reserved together, a refund's
// restore puts them back into on_hand. The model keeps them in pending, in
// the order the payments and refunds were linearized, and lets any prefix
// of it have been applied when an operation is judged: a read matches if
// some prefix explains it, and the state after is the one with the fewest
// applied (every later prefix is still reachable from it, so nothing is
// lost by choosing it). Every other background change (a hold's timeout, a
// campaign's end) is an operation of the history with an open end
// (linearizable.go), so the model itself is deterministic.

// hstatus is a hold's state, as the arbiter records it.
type hstatus uint8

const (
	held           hstatus = iota // PENDING: units reserved, not paid
	paid                          // paid (or a token committed): its sale is pending or applied
	cancelled                     // given back by the buyer
	expired                       // given back by the timeout
	released                      // a token released (or never reserved: a tombstone)
	refundRequired                // paid after it was cancelled, or when no stock was left
	refunded                      // refunded: its units restored
)

func (s hstatus) String() string {
	return [...]string{"HELD", "PAID", "CANCELLED", "EXPIRED", "RELEASED", "REFUND_REQUIRED", "REFUNDED"}[s]
}

// modelHold is one hold's line on this SKU.
type modelHold struct {
	Qty  int64
	St   hstatus
	User string // counted against the limit (the SKU's, or the campaign's)
	Camp bool   // taken from the campaign's pool
}

// modelSKU is one SKU in the model. It is never changed in place: every
// step makes a new one, sharing the maps (immutable) with the old.
type modelSKU struct {
	exists           bool
	onHand, reserved int64   // with nothing in pending applied
	pending          []int64 // unapplied, oldest first: +q a sale's deduction, -q a refund's restore
	limit            int64   // the SKU's per-user limit
	pool             int64   // the campaign's pool (units carved out, unsold)
	campLimit        int64
	campaign, closed bool
	holds            *immutable.Map[string, modelHold]
	buyers           *immutable.Map[string, int64] // SKU limit: user -> units counted
	campBuyers       *immutable.Map[string, int64]
	refs             *immutable.Map[string, bool] // adjust references applied
	hx               uint64                       // xor of the maps' entries' hashes
}

var seed = maphash.MakeSeed()

func entryHash(kind byte, key string, v int64) uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	h.WriteByte(kind)
	h.WriteString(key)
	var b [8]byte
	for i := range b {
		b[i] = byte(v >> (8 * i))
	}
	h.Write(b[:])
	return h.Sum64()
}

func holdHash(id string, h modelHold) uint64 {
	camp := int64(0)
	if h.Camp {
		camp = 1
	}
	return entryHash('h', id+"\x00"+h.User, h.Qty<<8|int64(h.St)<<1|camp)
}

func newModelSKU() *modelSKU {
	return &modelSKU{
		holds:      immutable.NewMap[string, modelHold](nil),
		buyers:     immutable.NewMap[string, int64](nil),
		campBuyers: immutable.NewMap[string, int64](nil),
		refs:       immutable.NewMap[string, bool](nil),
	}
}

func (s *modelSKU) clone() *modelSKU {
	c := *s
	return &c
}

func (s *modelSKU) setHold(id string, h modelHold) {
	if old, ok := s.holds.Get(id); ok {
		s.hx ^= holdHash(id, old)
	}
	s.holds = s.holds.Set(id, h)
	s.hx ^= holdHash(id, h)
}

// count adds n to user's units in m (the SKU's buyers or the campaign's).
func (s *modelSKU) count(camp bool, user string, n int64) {
	if user == "" || n == 0 {
		return
	}
	m, kind := &s.buyers, byte('b')
	if camp {
		m, kind = &s.campBuyers, 'c'
	}
	old, _ := (*m).Get(user)
	if old != 0 {
		s.hx ^= entryHash(kind, user, old)
	}
	if v := old + n; v != 0 {
		*m = (*m).Set(user, v)
		s.hx ^= entryHash(kind, user, v)
	} else {
		*m = (*m).Delete(user)
	}
}

func (s *modelSKU) counted(camp bool, user string) int64 {
	if camp {
		v, _ := s.campBuyers.Get(user)
		return v
	}
	v, _ := s.buyers.Get(user)
	return v
}

// at is the state with the first k pending entries applied.
func (s *modelSKU) at(k int) (onHand, reserved int64) {
	onHand, reserved = s.onHand, s.reserved
	for _, q := range s.pending[:k] {
		if q > 0 {
			onHand, reserved = onHand-q, reserved-q
		} else {
			onHand -= q
		}
	}
	return onHand, reserved
}

// fold applies the first k pending entries for good.
func (s *modelSKU) fold(k int) *modelSKU {
	if k == 0 {
		return s
	}
	c := s.clone()
	c.onHand, c.reserved = s.at(k)
	c.pending = slices.Clone(s.pending[k:])
	return c
}

// availableFrom is the least k at which at least q units are available
// (available only grows with k: a sale's deduction leaves it, a restore adds
// to it), or -1.
func (s *modelSKU) availableFrom(q int64) int {
	for k := 0; k <= len(s.pending); k++ {
		if on, res := s.at(k); on-res >= q {
			return k
		}
	}
	return -1
}

func (s *modelSKU) free(h modelHold) {
	if h.Camp && !s.closed {
		s.pool += h.Qty
	} else {
		s.reserved -= h.Qty
	}
	s.count(h.Camp, h.User, -h.Qty)
}

// skuInput is one operation as it bears on one SKU.
type skuInput struct {
	op    *histOp
	kind  opKind
	out   outcome
	id    string // the hold's identity (an order, an idempotency key, a token)
	qty   int64  // this SKU's units of the modelHold, or set's stock, adjust's delta, a campaign's allotment
	user  string
	camp  bool
	limit bool // the refusal is the buyer's limit, not the stock
	// inflight: units of the refusal's SKU other requests in flight beside
	// it may have held in Redis (linearizable.go, admitted); for a refusal
	// for the limit, the buyer's own.
	inflight int64
	// lines is how many SKUs the order has: a late payment is refused
	// (REFUND_REQUIRED) if any one of them lacks the stock.
	lines int
	// ref is the reference the database's movements of its change carry
	// (an order id, "token:" + a token, an adjust's reference), by which
	// its commit is found (commits.go).
	ref string
}

// step is the model's transition: whether the operation could have
// happened, with its answer, in state s, and the state after it.
func step(s *modelSKU, in *skuInput) (bool, *modelSKU) {
	op := in.op
	unknown := in.out == outUnknown
	switch in.kind {
	case opRead:
		for k := 0; k <= len(s.pending); k++ {
			on, res := s.at(k)
			if on == op.Read.OnHand && res == op.Read.Reserved && on-res == op.Read.Available {
				return true, s.fold(k)
			}
		}
		return false, s
	case opSet:
		if in.out == outRefused {
			return true, s
		}
		c := s.clone()
		c.exists, c.onHand, c.limit = true, in.qty, op.Limit
		return true, c
	case opAdjust:
		if in.out == outRefused {
			return true, s
		}
		if _, seen := s.refs.Get(op.Ref); seen && op.Ref != "" {
			return true, s
		}
		c := s.clone()
		c.onHand += in.qty
		if op.Ref != "" {
			c.refs = c.refs.Set(op.Ref, true)
			c.hx ^= entryHash('r', op.Ref, 1)
		}
		return true, c
	case opCampaign:
		if in.out == outRefused {
			return true, s
		}
		c := s.clone()
		c.campaign, c.closed, c.pool, c.campLimit = true, false, in.qty, op.Limit
		c.reserved += in.qty
		return true, c
	case opClose:
		if !s.campaign || s.closed {
			return true, s
		}
		c := s.clone()
		c.reserved -= c.pool
		c.pool, c.closed = 0, true
		return true, c
	case opCreate:
		return create(s, in)
	}
	h, ok := s.holds.Get(in.id)
	switch in.kind {
	case opOrder:
		return ok && h.St.String() == strings.Replace(op.Answer, "PENDING", "HELD", 1), s
	case opExpire:
		if !ok || h.St != held {
			return unknown, s // a timeout the followers saw needs a pending hold
		}
		c := s.clone()
		c.free(h)
		h.St = expired
		c.setHold(in.id, h)
		return true, c
	case opCancel:
		if in.out == outRefused {
			return !ok || h.St != held, s
		}
		if !ok || h.St != held {
			return unknown, s
		}
		c := s.clone()
		c.free(h)
		h.St = cancelled
		c.setHold(in.id, h)
		return true, c
	case opRelease:
		switch {
		case in.out == outRefused:
			return !ok || h.St != held, s
		case ok && h.St == held:
			if !unknown && op.N != h.Qty {
				return false, s
			}
			c := s.clone()
			c.free(h)
			h.St = released
			c.setHold(in.id, h)
			return true, c
		case !ok: // a tombstone: the token can never reserve after this
			if !unknown && op.N != 0 {
				return false, s
			}
			c := s.clone()
			c.setHold(in.id, modelHold{St: released})
			return true, c
		}
		return unknown || op.N == 0, s
	case opCommit:
		switch {
		case in.out == outRefused:
			return !ok || (h.St != held && h.St != paid), s
		case ok && h.St == held:
			if !unknown && op.N != h.Qty {
				return false, s
			}
			return true, sell(s, in.id, h)
		case ok && h.St == paid:
			return unknown || op.N == h.Qty, s
		}
		return unknown, s
	case opPay:
		return pay(s, in, h, ok)
	case opRefund:
		if in.out == outRefused {
			return !ok || (h.St != paid && h.St != refundRequired), s
		}
		if !ok {
			return unknown, s
		}
		if !unknown && op.Answer != "REFUNDED" {
			return false, s
		}
		switch h.St {
		case paid:
			c := s.clone()
			c.pending = append(slices.Clone(s.pending), -h.Qty)
			h.St = refunded
			c.setHold(in.id, h)
			return true, c
		case refundRequired:
			c := s.clone()
			h.St = refunded
			c.setHold(in.id, h)
			return true, c
		case refunded:
			return true, s
		}
		return unknown, s
	}
	return false, s
}

// sell marks a held hold paid: its sale is pending for the ordered sync.
func sell(s *modelSKU, id string, h modelHold) *modelSKU {
	c := s.clone()
	c.pending = append(slices.Clone(s.pending), h.Qty)
	h.St = paid
	c.setHold(id, h)
	return c
}

func create(s *modelSKU, in *skuInput) (bool, *modelSKU) {
	if _, ok := s.holds.Get(in.id); ok {
		// A replay (same key, same token) answers the first; a token
		// released before is refused.
		return in.out != outRefused || !in.limit && in.op.Token != "", s
	}
	q := in.qty
	limit := s.limit
	if in.camp {
		limit = s.campLimit
	}
	overLimit := in.user != "" && limit > 0 && s.counted(in.camp, in.user)+q > limit
	if in.out == outRefused {
		if in.limit {
			return in.user != "" && limit > 0 && s.counted(in.camp, in.user)+in.inflight+q > limit, s
		}
		if in.camp {
			return s.pool-in.inflight < q, s
		}
		on, res := s.at(0)
		return on-res-in.inflight < q, s
	}
	if overLimit {
		return in.out == outUnknown, s
	}
	var c *modelSKU
	if in.camp {
		if s.pool < q {
			return in.out == outUnknown, s
		}
		c = s.clone()
		c.pool -= q
	} else {
		k := s.availableFrom(q)
		if k < 0 {
			return in.out == outUnknown, s
		}
		c = s.fold(k).clone()
		c.reserved += q
	}
	if limit > 0 {
		c.count(in.camp, in.user, q)
	}
	c.setHold(in.id, modelHold{Qty: q, St: held, User: in.user, Camp: in.camp})
	return true, c
}

// pay is the payment callback on hold h: a pending hold is sold; a hold
// given back by the timeout is reserved again if the stock is there
// (PAID), else the payment must be refunded (REFUND_REQUIRED), as after a
// cancel.
func pay(s *modelSKU, in *skuInput, h modelHold, ok bool) (bool, *modelSKU) {
	unknown := in.out == outUnknown
	if in.out == outRefused || !ok {
		return true, s
	}
	answer := in.op.Answer
	switch h.St {
	case held:
		if !unknown && (answer != "PAID" || in.op.AnswerPaid != in.op.PaymentID) {
			return false, s
		}
		return true, sell(s, in.id, h)
	case paid, refunded:
		return unknown || answer == "PAID" || answer == "REFUNDED" || answer == "REFUND_REQUIRED", s
	case cancelled:
		if !unknown && answer != "REFUND_REQUIRED" {
			return false, s
		}
		c := s.clone()
		h.St = refundRequired
		c.setHold(in.id, h)
		return true, c
	case expired:
		// Reserved again from the SKU, counted against the buyer's limit
		// again: refused if either is short.
		overLimit := h.User != "" && s.limit > 0 && s.counted(false, h.User)+h.Qty > s.limit
		if k := s.availableFrom(h.Qty); k >= 0 && !overLimit && (unknown || answer == "PAID") {
			c := s.fold(k).clone()
			c.reserved += h.Qty
			if h.Camp {
				h.Camp = false // re-reserved from the SKU
			}
			if c.limit > 0 {
				c.count(false, h.User, h.Qty)
			}
			return true, sell(c, in.id, h)
		}
		if on, res := s.at(0); (on-res < h.Qty || overLimit || in.lines > 1) && (unknown || answer == "REFUND_REQUIRED") {
			c := s.clone()
			h.St = refundRequired
			c.setHold(in.id, h)
			return true, c
		}
		return false, s
	case refundRequired:
		return unknown || answer == "REFUND_REQUIRED" || answer == "REFUNDED", s
	}
	return false, s
}

func (s *modelSKU) hash() uint64 {
	h := s.hx
	mix := func(v int64) { h = (h ^ uint64(v)) * 0x100000001b3 }
	mix(s.onHand)
	mix(s.reserved)
	mix(s.limit)
	mix(s.pool)
	mix(s.campLimit)
	mix(int64(len(s.pending)))
	for _, q := range s.pending {
		mix(q)
	}
	for _, b := range []bool{s.exists, s.campaign, s.closed} {
		if b {
			mix(1)
		} else {
			mix(2)
		}
	}
	return h
}

// equal compares two states by their scalars and the hash of their maps'
// entries (64 bits, kept as the maps change): Porcupine compares a state
// with every one it met for the same set of linearized operations, and a
// walk of every map each time was most of the check's time. Two states
// whose entries differ and hash alike would be taken for one, at odds of
// about one in 2^64 per comparison.
func (s *modelSKU) equal(o *modelSKU) bool {
	return s.exists == o.exists && s.onHand == o.onHand && s.reserved == o.reserved && slices.Equal(s.pending, o.pending) &&
		s.limit == o.limit && s.pool == o.pool && s.campLimit == o.campLimit && s.campaign == o.campaign &&
		s.closed == o.closed && s.hx == o.hx && s.holds.Len() == o.holds.Len() && s.buyers.Len() == o.buyers.Len() &&
		s.campBuyers.Len() == o.campBuyers.Len() && s.refs.Len() == o.refs.Len()
}

// describe is the state as the visualization shows it.
func (s *modelSKU) describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "on_hand %d reserved %d available %d", s.onHand, s.reserved, s.onHand-s.reserved)
	if len(s.pending) > 0 {
		fmt.Fprintf(&b, "; unapplied %v", s.pending)
	}
	if s.campaign {
		fmt.Fprintf(&b, "; pool %d closed %v", s.pool, s.closed)
	}
	n := 0
	for it := s.holds.Iterator(); !it.Done(); {
		_, v, _ := it.Next()
		if v.St == held {
			n++
		}
	}
	fmt.Fprintf(&b, "; %d holds, %d held", s.holds.Len(), n)
	return b.String()
}
