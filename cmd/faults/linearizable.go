package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// The history check: each SKU's history (every operation of the run that
// took, gave back or read its stock) must be linearizable against the
// sequential model of one SKU (skumodel.go), as Porcupine decides. What it
// proves and what it relaxes, and how it is checked: docs/faults.md ("The
// history check").

// histConfig is what the check needs to know of the run.
type histConfig struct {
	// Stale is how long before it was sent a refusal may reflect: the
	// database gives back before Redis and the nodes' sold-out flags learn
	// of it (docs/faults.md, "What the check proves and what it relaxes"). A refusal is judged as if it had been
	// sent Stale earlier.
	Stale time.Duration
	// The holds' default lengths, for a hold whose answer was lost.
	OrderHold, CampaignHold time.Duration
	// Timeout bounds each SKU's check: one that does not end in time fails.
	Timeout time.Duration
	// Dir receives the visualization of a failing SKU's history.
	Dir string
	// Base is when the history began: the service's wall-clock times
	// (deadlines, a campaign's end) are placed on the history's clock by it.
	Base time.Time
	// Name is the scenario's, for the visualization's file name.
	Name string
	// Commits are the database's movements of the history's changes
	// (commits.go): where they are, the search tries the windows they
	// imply first.
	Commits []commit
	// Never are the creates whose answer never came and that the database
	// never took (resolve.go): they changed nothing the model knows, but
	// their admissions may hold units and the buyer's count in Redis (the
	// node died between the admission and the write) until the realign
	// gives them back, which it does only once the SKU stands still. Each
	// counts as in flight beside every refusal after it was sent
	// (admitted).
	Never []histOp
}

// expirySlack is how much earlier than its deadline a timeout release may
// be linearized: the deadline is the service's wall clock, the history the
// driver's monotonic one, on one host.
const expirySlack = 50 * time.Millisecond

// HistVerdict is the history check's finding.
type HistVerdict struct {
	Result string // "yes", "NO", or "timeout"
	SKU    string // the SKU that failed
	Viz    string // the visualization of its smallest failing prefix
	Saved  string // the history, written out when it failed
	Ops    map[string]int
	Took   map[string]time.Duration
}

func (h *HistVerdict) column() string {
	switch {
	case h == nil:
		return "-"
	case h.Result == "yes":
		return "yes"
	}
	return h.Result + " " + h.SKU
}

func (h *HistVerdict) passed() bool { return h != nil && h.Result == "yes" }

// line is the sizes and times of every SKU's check.
func (h *HistVerdict) line() string {
	var skus []string
	for s := range h.Ops {
		skus = append(skus, s)
	}
	sort.Strings(skus)
	var parts []string
	var total time.Duration
	for _, s := range skus {
		parts = append(parts, fmt.Sprintf("%s %d ops %s", s, h.Ops[s], h.Took[s].Round(time.Millisecond)))
		total += h.Took[s]
	}
	out := fmt.Sprintf("history: %s; checked in %s", strings.Join(parts, ", "), total.Round(time.Millisecond))
	if h.Viz != "" {
		out += "; visualization: " + h.Viz
	}
	if h.Saved != "" {
		out += "; history: " + h.Saved
	}
	return out
}

// orderInfo is what the history learnt of an order from its 201.
type orderInfo struct {
	id    string // its identity in the model
	lines []line
	user  string
	camp  bool
}

// partition turns the run's operations into each SKU's inputs, with the
// service's own background changes (timeouts, a campaign's end) added as
// operations with open ends.
func partition(ops []histOp, cfg histConfig) map[string][]porcupine.Operation {
	campSKU := map[string]string{}
	for i := range ops {
		if op := &ops[i]; op.Kind == opCampaign {
			campSKU[op.Campaign] = op.SKU
		}
	}
	ident := func(i int, op *histOp, sku string) string {
		switch {
		case op.Token != "":
			return "t:" + sku + ":" + op.Token
		case op.Key != "":
			return "k:" + op.User + ":" + op.Key
		case op.Out == outOK:
			return "o:" + op.Order
		}
		return fmt.Sprintf("p:%d", i) // no answer: a hold nothing else can name
	}
	orders := map[string]orderInfo{}
	for i := range ops {
		op := &ops[i]
		if op.Kind == opCreate && op.Out == outOK && op.Token == "" {
			orders[op.Order] = orderInfo{id: ident(i, op, ""), lines: op.Lines, user: op.User, camp: op.Campaign != ""}
		}
	}
	// deadline of each hold that may time out, and when an answer first
	// showed it no longer held (paid, cancelled, committed, released,
	// expired).
	type hold struct {
		deadline time.Duration
		lines    []line
		settled  time.Duration // the earliest return of an answer that showed it settled
		ref      string        // its movements' reference
	}
	holds := map[string]*hold{}
	settle := func(id string, at time.Duration) {
		if h := holds[id]; h != nil && (h.settled == 0 || at < h.settled) {
			h.settled = at
		}
	}
	ops = foldReplays(foldRetries(ops))
	inflight := admitted(ops, cfg.Never, campSKU, cfg.Stale)
	unanswered := unansweredTokens(ops, cfg.Never)
	out := map[string][]porcupine.Operation{}
	add := func(sku string, op *histOp, in *skuInput, call, ret time.Duration) {
		in.op = op
		out[sku] = append(out[sku], porcupine.Operation{Input: in, Call: int64(call), Return: int64(ret)})
	}
	// An unanswered cancel (or token release) did what it did while its
	// hold was held: once an answer showed the hold settled, it can only
	// have been a no-op.
	type placed struct {
		sku string
		i   int
		id  string
	}
	var lostGiveBacks []placed
	// A cancel or refund is done once: repeated, it is refused. So one
	// answered done was the one, and an unanswered one of the same order
	// did nothing, whenever it was sent.
	done := map[[2]string]bool{}
	for i := range ops {
		if op := &ops[i]; (op.Kind == opCancel || op.Kind == opRefund) && op.Out == outOK {
			done[[2]string{op.Kind.String(), op.Order}] = true
		}
	}
	for i := range ops {
		op := &ops[i]
		call := op.Call
		if op.Out == outRefused {
			call = max(0, call-cfg.Stale) // judged as of up to Stale earlier
		}
		switch op.Kind {
		case opRead:
			if op.Out == outOK {
				add(op.SKU, op, &skuInput{kind: opRead, out: outOK}, op.Call, op.Ret)
			}
		case opSet, opAdjust:
			if op.Out != outRefused {
				add(op.SKU, op, &skuInput{kind: op.Kind, out: op.Out, qty: op.N, ref: op.Ref}, op.Call, op.Ret)
			}
		case opCampaign:
			if op.Out != outRefused {
				add(op.SKU, op, &skuInput{kind: opCampaign, out: op.Out, qty: op.N}, op.Call, op.Ret)
				close := &histOp{Kind: opClose, Campaign: op.Campaign, SKU: op.SKU, Call: op.EndsAt.Sub(cfg.Base) - expirySlack, Ret: maxTime, Out: outUnknown}
				add(op.SKU, close, &skuInput{kind: opClose, out: outUnknown}, close.Call, maxTime)
			}
		case opCreate:
			lines := op.Lines
			camp := op.Campaign != ""
			if camp && len(lines) == 0 {
				lines = []line{{campSKU[op.Campaign], 1}}
			}
			user := op.User
			switch op.Out {
			case outRefused:
				limit := op.Code == "conflict" && op.Token == ""
				switch {
				case op.Code == "insufficient_stock":
				case limit && (camp || isSeckill(op)):
				case op.Code == "conflict" && op.Token != "" && strings.HasSuffix(op.Msg, tokenInProgress) && pendingToken(op, unanswered):
					continue // "in progress; retry": an earlier attempt went unanswered, as the answer says
				case op.Code == "conflict" && op.Token != "":
				default:
					continue // refused for something the model does not judge (the buyer's token, the window, a key reused)
				}
				l, ok := refusedLine(op, lines)
				if !ok {
					continue
				}
				add(l.SKU, op, &skuInput{kind: opCreate, out: outRefused, id: ident(i, op, l.SKU), qty: l.Qty, user: user, camp: camp, limit: limit,
					inflight: inflight[refusal{i, l.SKU}]}, call, op.Ret)
				continue
			}
			for _, l := range lines {
				id := ident(i, op, l.SKU)
				add(l.SKU, op, &skuInput{kind: opCreate, out: op.Out, id: id, qty: l.Qty, user: user, camp: camp, ref: holdRef(op)}, op.Call, op.Ret)
				h := holds[id]
				if h == nil {
					h = &hold{}
					holds[id] = h
				}
				h.lines, h.ref = append(h.lines, l), holdRef(op)
				var deadline time.Duration
				switch {
				case op.Out == outOK && !op.ExpiresAt.IsZero():
					deadline = op.ExpiresAt.Sub(cfg.Base)
				default:
					d := op.Hold
					if d == 0 {
						d = cfg.OrderHold
						if camp {
							d = cfg.CampaignHold
						}
					}
					deadline = op.Call + d
				}
				if h.deadline == 0 || deadline < h.deadline {
					h.deadline = deadline
				}
			}
		case opPay, opCancel, opRefund, opOrder:
			o, ok := orders[op.Order]
			if !ok {
				continue // an order the run never created (a probe): nothing to judge on any SKU
			}
			if op.Out == outRefused && !(op.Code == "conflict" && op.Kind != opPay) || op.Kind == opOrder && op.Out != outOK {
				continue
			}
			if op.Out == outUnknown && done[[2]string{op.Kind.String(), op.Order}] {
				continue
			}
			if op.Kind == opOrder && op.Answer == "PENDING" {
				// What a follower's PENDING read proves, that the timeout
				// came after it, is its expiry's start (below); as an
				// operation of its own it would only be one more to order.
				continue
			}
			for _, l := range o.lines {
				add(l.SKU, op, &skuInput{kind: op.Kind, out: op.Out, id: o.id, qty: l.Qty, user: o.user, camp: o.camp, lines: len(o.lines), ref: op.Order}, call, op.Ret)
				if op.Kind == opCancel && op.Out == outUnknown {
					lostGiveBacks = append(lostGiveBacks, placed{l.SKU, len(out[l.SKU]) - 1, o.id})
				}
			}
			// These answers say the hold had left HELD by the time they
			// came: a cancel done or refused for the order's state, a
			// payment or refund done, a read of it (PENDING reads are
			// skipped above).
			if op.Out == outOK || op.Out == outRefused && op.Kind == opCancel {
				settle(o.id, op.Ret)
			}
		case opCommit, opRelease:
			if op.Out == outRefused && op.Code != "conflict" && op.Code != "not_found" {
				continue
			}
			id := "t:" + op.SKU + ":" + op.Token
			add(op.SKU, op, &skuInput{kind: op.Kind, out: op.Out, id: id, ref: "token:" + op.Token}, call, op.Ret)
			if op.Kind == opRelease && op.Out == outUnknown {
				lostGiveBacks = append(lostGiveBacks, placed{op.SKU, len(out[op.SKU]) - 1, id})
			}
			if op.Out == outOK {
				settle(id, op.Ret)
			}
		}
	}
	noop := map[*skuInput]bool{}
	for _, c := range lostGiveBacks {
		h, o := holds[c.id], &out[c.sku][c.i]
		switch {
		case h == nil || h.settled == 0:
		case o.Call >= int64(h.settled):
			noop[o.Input.(*skuInput)] = true // sent once the hold was settled
		default:
			o.Return = min(o.Return, int64(h.settled))
		}
	}
	for sku := range out {
		out[sku] = slices.DeleteFunc(out[sku], func(o porcupine.Operation) bool { return noop[o.Input.(*skuInput)] })
	}
	// What the followers saw of each order: the last read that found it
	// PENDING, the first that found it EXPIRED.
	type seen struct{ pending, expired time.Duration }
	follow := map[string]*seen{}
	for i := range ops {
		op := &ops[i]
		o, ok := orders[op.Order]
		if op.Kind != opOrder || op.Out != outOK || !ok {
			continue
		}
		f := follow[o.id]
		if f == nil {
			f = &seen{}
			follow[o.id] = f
		}
		switch op.Answer {
		case "PENDING":
			f.pending = max(f.pending, op.Call)
		case "EXPIRED":
			if f.expired == 0 || op.Ret < f.expired {
				f.expired = op.Ret
			}
		}
	}
	released := map[[2]string]bool{} // SKU, reference: a give-back the database recorded
	for _, c := range cfg.Commits {
		if c.Kind == "RELEASE" {
			released[[2]string{c.SKU, c.Ref}] = true
		}
	}
	for id, h := range holds {
		if h.settled != 0 && h.settled < h.deadline-expirySlack {
			continue // paid, cancelled or released before it could time out
		}
		// The timeout released it after its deadline and after a read
		// found it still PENDING; before the first read that found it
		// EXPIRED. With none, it may never have: a payment, cancel or
		// commit came first. Then it is a no-op once that settled the hold,
		// so it is placed no later than the first answer showing the hold
		// settled (after it there is nothing left for it to do), or at any
		// time if none did.
		exp := &histOp{Kind: opExpire, Order: id, Call: h.deadline - expirySlack, Ret: maxTime, Out: outUnknown}
		if h.settled != 0 {
			exp.Ret = h.settled
		}
		if f := follow[id]; f != nil {
			exp.Call = max(exp.Call, f.pending)
			if f.expired != 0 {
				exp.Ret, exp.Out = f.expired, outOK
			}
		}
		if exp.Call >= exp.Ret {
			continue // settled before the timeout could act (a PENDING read came late)
		}
		for _, l := range mergeLines(h.lines) {
			if exp.Out == outUnknown && cfg.Commits != nil && h.ref != "" && !released[[2]string{l.SKU, h.ref}] {
				// The database has no give-back of the hold: the timeout
				// never released it, and the search need not try it.
				continue
			}
			add(l.SKU, exp, &skuInput{kind: opExpire, out: exp.Out, id: id, ref: h.ref}, exp.Call, exp.Ret)
		}
	}
	for sku := range out {
		lanes(out[sku])
	}
	return out
}

// foldRetries folds a request retried after an unknown outcome into the
// attempt that was answered: the same create (Idempotency-Key or token),
// payment (payment id) or token commit, answered alike however many
// attempts took effect, sent again by
// the same client once the earlier attempt went unanswered. It took effect
// once, somewhere between the first attempt's sending and the answer, and
// that is the one operation the check then judges; left apart, each
// unanswered attempt is one more operation that may fall anywhere after it
// was sent, for the search to try. Where the database says when it made
// the hold (histOp.Made), the window opens no earlier: a campaign's
// buyers retrying through 503s opened ten windows on the hot SKU of one
// make test history back by 1.3 to 2.7 s, over reads that then had those
// holds to place, and its check ran out of the minute (2026-11-29; 87 s
// with a longer budget, 1.9 s with the windows as answered).
//
// Attempts that all went unanswered (a client retrying through a dead
// database) are one open operation sent when the first was, for every
// request whose effect is the same whichever attempt has it and nothing
// when repeated: the above, and a cancel, refund or token release (a
// second finds the hold no longer held). Any attempt's effect, at any time
// after it was sent, is the first attempt's at that time; left apart, n
// open attempts are 2^n subsets for the search to try (mariadb-blackhole's
// token retries of 2026-11-28 ran the check out of time).
func foldRetries(ops []histOp) []histOp {
	type key struct {
		kind                     opKind
		user, id, token, payment string
	}
	// answered: whether an answered attempt may stand for the unanswered
	// ones before it.
	keyOf := func(op *histOp) (k key, answered, ok bool) {
		switch op.Kind {
		case opCreate:
			if op.Key == "" && op.Token == "" {
				return key{}, false, false
			}
			return key{opCreate, op.User, op.Key, op.Token, ""}, true, true
		case opPay:
			return key{opPay, "", op.Order, "", op.PaymentID}, true, true
		case opCommit:
			return key{op.Kind, op.SKU, "", op.Token, ""}, true, true
		case opCancel, opRefund:
			return key{op.Kind, "", op.Order, "", ""}, false, true
		case opRelease:
			return key{op.Kind, op.SKU, "", op.Token, ""}, false, true
		}
		return key{}, false, false
	}
	ops = slices.Clone(ops)
	pending := map[key][]int{} // unanswered attempts not yet folded
	drop := make([]bool, len(ops))
	order := make([]int, len(ops))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return ops[order[a]].Call < ops[order[b]].Call })
	for _, i := range order {
		op := &ops[i]
		k, answered, ok := keyOf(op)
		if !ok {
			continue
		}
		if op.Out == outUnknown {
			pending[k] = append(pending[k], i)
			continue
		}
		if !answered {
			// A cancel, refund or release retried is answered otherwise
			// when the unanswered attempt took effect (409, or 0
			// released): the attempts before it stay apart.
			foldUnanswered(pending[k], drop)
			delete(pending, k)
			continue
		}
		if op.Out != outOK {
			continue
		}
		sent := op.Call
		for _, j := range pending[k] {
			if ops[j].Call < sent {
				op.Call = min(op.Call, ops[j].Call)
				drop[j] = true
			}
		}
		if op.Made > 0 { // and not before the database made the hold (resolveUnknowns)
			op.Call = max(op.Call, op.Made-expirySlack)
		}
		delete(pending, k)
	}
	for _, p := range pending {
		foldUnanswered(p, drop)
	}
	out := make([]histOp, 0, len(ops))
	for i, op := range ops {
		if !drop[i] {
			out = append(out, op)
		}
	}
	return out
}

// foldReplays keeps one operation for every group of payment callbacks
// replayed with the same order and payment id and answered alike (a
// provider's retries, the abuse scenario's thousand at once): sent at the
// first one's call, known done by the first answer. The others are replays
// that change nothing wherever they fall; kept, each would be one more way
// to order the same no-op for the search to try.
func foldReplays(ops []histOp) []histOp {
	type key struct{ order, payment, answer string }
	first := map[key]int{}
	out := make([]histOp, 0, len(ops))
	for _, op := range ops {
		if op.Kind != opPay || op.Out != outOK {
			out = append(out, op)
			continue
		}
		k := key{op.Order, op.PaymentID, op.Answer}
		if i, ok := first[k]; ok {
			out[i].Call, out[i].Ret = min(out[i].Call, op.Call), min(out[i].Ret, op.Ret)
			continue
		}
		first[k] = len(out)
		out = append(out, op)
	}
	return out
}

// tokenInProgress ends the token API's answer to a deduct whose token
// Redis remembers and the database does not have: another attempt of it
// is still writing, or its node died after Redis admitted it (the token
// stays remembered until its key expires).
const tokenInProgress = "a reservation with this token is in progress; retry"

// unansweredTokens is, for each SKU and token, when the first deduct of
// it that went unanswered (whether or not the database took it) was sent.
func unansweredTokens(ops, never []histOp) map[[2]string]time.Duration {
	out := map[[2]string]time.Duration{}
	for _, list := range [][]histOp{ops, never} {
		for _, op := range list {
			if op.Kind != opCreate || op.Token == "" || op.Out != outUnknown || len(op.Lines) != 1 {
				continue
			}
			k := [2]string{op.Lines[0].SKU, op.Token}
			if at, ok := out[k]; !ok || op.Call < at {
				out[k] = op.Call
			}
		}
	}
	return out
}

// pendingToken: a deduct refused as in progress had an attempt of its
// token sent before it that went unanswered, which the answer names.
func pendingToken(op *histOp, unanswered map[[2]string]time.Duration) bool {
	if len(op.Lines) != 1 {
		return false
	}
	at, ok := unanswered[[2]string{op.Lines[0].SKU, op.Token}]
	return ok && at < op.Ret
}

// refusal names a refused create and the SKU it was refused on.
type refusal struct {
	op  int
	sku string
}

// admitted is, for each refusal, the units of its SKU that other requests
// in flight beside it may have held in Redis: Redis admits a request before
// the database records it (or refuses it, for another line of a cart), so
// while it is in flight its units are missing from what Redis offers, and a
// refusal beside it can be right although the database had the stock. A
// request counts if it was sent before the refusal was answered and
// answered after the refusal's judged start (its call less stale). One
// that Redis itself refused held nothing, but the answer does not tell the
// two apart, so it counts too. A create the database never took (never)
// was never answered: its admission, if Redis made one, holds until the
// realign, so it counts beside every refusal sent after it.
func admitted(ops, never []histOp, campSKU map[string]string, stale time.Duration) map[refusal]int64 {
	type req struct {
		call, ret time.Duration
		qty       int64
		user      string
	}
	bySKU := map[string][]req{}
	var refusals []refusal
	linesOf := func(op *histOp) []line {
		if op.Campaign != "" && len(op.Lines) == 0 {
			return []line{{campSKU[op.Campaign], 1}}
		}
		return op.Lines
	}
	for i := range ops {
		op := &ops[i]
		if op.Kind != opCreate {
			continue
		}
		for _, l := range linesOf(op) {
			bySKU[l.SKU] = append(bySKU[l.SKU], req{op.Call, op.Ret, l.Qty, op.User})
			if op.Out == outRefused {
				refusals = append(refusals, refusal{i, l.SKU})
			}
		}
	}
	for i := range never {
		op := &never[i]
		for _, l := range linesOf(op) {
			bySKU[l.SKU] = append(bySKU[l.SKU], req{op.Call, maxTime, l.Qty, op.User})
		}
	}
	out := map[refusal]int64{}
	for _, r := range refusals {
		op := &ops[r.op]
		from := op.Call - stale
		var n int64
		for _, o := range bySKU[r.sku] {
			// A refusal for the buyer's limit counts only the buyer's own
			// requests: Redis counts them against the limit as it admits.
			if o.call < op.Ret && o.ret > from && !(o.call == op.Call && o.ret == op.Ret) && (op.Code != "conflict" || o.user == op.User) {
				n += o.qty
			}
		}
		out[r] = n
	}
	return out
}

func isSeckill(op *histOp) bool { return op.Key == "" && op.Token == "" && op.Campaign == "" }

// refusedLine is the line a refusal names: the only one, or the one whose
// SKU ends the message ("...: CART-2"); false when it cannot be told.
func refusedLine(op *histOp, lines []line) (line, bool) {
	if len(lines) == 1 {
		return lines[0], true
	}
	for _, l := range lines {
		if strings.HasSuffix(op.Msg, ": "+l.SKU) {
			return l, true
		}
	}
	return line{}, false
}

// lanes gives each operation a client id for the visualization: the first
// lane free when it was sent.
func lanes(ops []porcupine.Operation) {
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	var free []int64
	for i := range ops {
		lane := -1
		for l, until := range free {
			if until < ops[i].Call {
				lane = l
				break
			}
		}
		if lane < 0 {
			lane = len(free)
			free = append(free, 0)
		}
		free[lane] = ops[i].Return
		ops[i].ClientId = lane
	}
}

// skuPorcupine is the model of one SKU as Porcupine takes it.
var skuPorcupine = porcupine.Model{
	Init: func() interface{} { return newModelSKU() },
	Step: func(state, input, _ interface{}) (bool, interface{}) {
		return step(state.(*modelSKU), input.(*skuInput))
	},
	Hash:  func(state interface{}) uint64 { return state.(*modelSKU).hash() },
	Equal: func(a, b interface{}) bool { return a.(*modelSKU).equal(b.(*modelSKU)) },
	DescribeOperation: func(input, _ interface{}) string {
		return describeInput(input.(*skuInput))
	},
	DescribeState: func(state interface{}) string { return state.(*modelSKU).describe() },
}

func describeInput(in *skuInput) string {
	op := in.op
	var b strings.Builder
	b.WriteString(op.Kind.String())
	switch op.Kind {
	case opRead:
		fmt.Fprintf(&b, " → on_hand %d reserved %d available %d", op.Read.OnHand, op.Read.Reserved, op.Read.Available)
		return b.String()
	case opSet, opAdjust, opCampaign:
		fmt.Fprintf(&b, " %d", in.qty)
	default:
		if in.id != "" {
			fmt.Fprintf(&b, " %s", in.id)
		}
		if in.qty != 0 {
			fmt.Fprintf(&b, " ×%d", in.qty)
		}
		if in.user != "" {
			fmt.Fprintf(&b, " by %s", in.user)
		}
	}
	switch op.Out {
	case outUnknown:
		b.WriteString(" → ?")
	case outRefused:
		fmt.Fprintf(&b, " → %d %s", op.Status, op.Code)
	default:
		if op.Answer != "" {
			fmt.Fprintf(&b, " → %s", op.Answer)
		} else if op.Kind == opCommit || op.Kind == opRelease {
			fmt.Fprintf(&b, " → %d", op.N)
		} else {
			fmt.Fprintf(&b, " → %d", op.Status)
		}
	}
	return b.String()
}

// checkHistory checks every SKU's history; on a violation it writes the
// visualization of the failing SKU's smallest failing prefix into cfg.Dir.
func checkHistory(ops []histOp, cfg histConfig) *HistVerdict {
	v := &HistVerdict{Result: "yes", Ops: map[string]int{}, Took: map[string]time.Duration{}}
	parts := partition(ops, cfg)
	commits := map[string][]commit{}
	for _, c := range cfg.Commits {
		commits[c.SKU] = append(commits[c.SKU], c)
	}
	var skus []string
	for sku := range parts {
		skus = append(skus, sku)
	}
	sort.Strings(skus)
	for _, sku := range skus {
		h := parts[sku]
		v.Ops[sku] = len(h)
		t0 := time.Now()
		res := checkSKU(h, commitWindows(h, commits[sku]), cfg.Timeout)
		v.Took[sku] = time.Since(t0)
		if res == porcupine.Ok || v.Result != "yes" {
			continue
		}
		v.SKU = sku
		if res == porcupine.Unknown {
			v.Result = "timeout"
			continue
		}
		v.Result = "NO"
		if cfg.Dir != "" {
			v.Viz = visualize(sku, h, cfg)
		}
	}
	return v
}

// checkSKU decides whether one SKU's history h is linearizable. It first
// searches cut, the same history with the windows its commits imply
// (commits.go), where the search is quick: a linearization found there is
// one of h. Only when none is found is h itself searched, and only that
// search can say the history is not linearizable.
func checkSKU(h, cut []porcupine.Operation, timeout time.Duration) porcupine.CheckResult {
	deadline := time.Now().Add(timeout)
	if cut != nil && search(cut, timeout/4) == porcupine.Ok {
		return porcupine.Ok
	}
	return search(h, time.Until(deadline))
}

// search decides whether h is linearizable. Refusals and an order's
// status reads change nothing (changesNothing), and they are what makes
// the search costly: in a sold-out burst the refusals are most of the
// history and all at once, and the search tries every subset of the
// status reads in flight beside a read of the stock it cannot place yet
// (twenty of them beside one read after mariadb-blackhole's heal ran out
// of the check's minute). So the rest is searched first, and those are
// then placed into the linearization found (fit). One that fits nowhere
// there joins the searched operations (another linearization may fit
// it), and the search runs again, until everything fits or the search
// fails: a pass is always a whole linearization, and a failure is always
// the search's own, on operations of the history.
func search(h []porcupine.Operation, timeout time.Duration) porcupine.CheckResult {
	var searched, refusals []porcupine.Operation
	for _, o := range h {
		if changesNothing(o.Input.(*skuInput)) {
			refusals = append(refusals, o)
		} else {
			searched = append(searched, o)
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return porcupine.Unknown
		}
		res, info := porcupine.CheckOperationsVerbose(skuPorcupine, searched, left)
		if res != porcupine.Ok {
			return res
		}
		lins := info.PartialLinearizationsOperations()
		if len(lins) != 1 || len(lins[0]) == 0 {
			return porcupine.CheckOperationsTimeout(skuPorcupine, h, time.Until(deadline))
		}
		misfits := fit(lins[0][0], refusals)
		if len(misfits) == 0 {
			return porcupine.Ok
		}
		for _, m := range misfits {
			if overLimitImpossible(h, m) {
				return porcupine.Illegal // no search can place it: say so now, not after the whole search
			}
		}
		searched = append(searched, misfits...)
		refusals = slices.DeleteFunc(refusals, func(o porcupine.Operation) bool {
			return slices.ContainsFunc(misfits, func(m porcupine.Operation) bool { return m.Input == o.Input })
		})
	}
}

// changesNothing says whether the model's state is the same after the
// operation as before it, wherever it is placed: a refusal, or a read of
// an order's status (step).
func changesNothing(in *skuInput) bool { return in.out == outRefused || in.kind == opOrder }

// overLimitImpossible says whether r, a refusal for the buyer's per-user
// limit, fits nowhere in h whatever the order: in the model a buyer's
// count only grows by the units of the buyer's own holds (a late payment
// counts again only what the timeout gave back), so it never exceeds the
// units of the buyer's creates sent before r was answered; and the limit
// in force is one a put (or the campaign) set before then. When that
// count, with what was in flight beside r and r's own units, stays within
// the smallest such limit, r is wrong in every linearization. Without this
// the search refutes such a refusal only by trying every order of the
// operations around it, which a busy history does not allow in its time.
func overLimitImpossible(h []porcupine.Operation, r porcupine.Operation) bool {
	rin := r.Input.(*skuInput)
	if rin.kind != opCreate || rin.out != outRefused || !rin.limit || rin.user == "" {
		return false
	}
	var units int64
	least := int64(-1) // the smallest positive limit set before r was answered
	for _, o := range h {
		in := o.Input.(*skuInput)
		if o.Call >= r.Return || in.out == outRefused {
			continue
		}
		switch {
		case in.kind == opCreate && in.user == rin.user:
			units += in.qty // a campaign's too: paid late, it counts against the SKU's limit
		case in.kind == opSet && !rin.camp, in.kind == opCampaign && rin.camp:
			if l := in.op.Limit; l > 0 && (least < 0 || l < least) {
				least = l
			}
		}
	}
	return least < 0 || units+rin.inflight+rin.qty <= least
}

// fit places the refusals into the linearization lin of the other
// operations, and returns those it could not place. Each may go after
// every operation of lin answered before it was sent and before every one
// sent after it was answered, and after every refusal placed before it
// that was sent after it was answered; it is placed at the first such
// point where the model accepts it. A refusal changes nothing, so lin
// with the refusals placed is a linearization of them all.
func fit(lin []porcupine.Operation, extra []porcupine.Operation) []porcupine.Operation {
	type item struct {
		op     porcupine.Operation
		lo, hi int
	}
	items := make([]item, len(extra))
	for k, r := range extra {
		lo, hi := 0, len(lin)
		for i, o := range lin {
			if o.Return < r.Call {
				lo = i + 1
			}
		}
		for i := len(lin) - 1; i >= 0; i-- {
			if lin[i].Call > r.Return {
				hi = i
			}
		}
		items[k] = item{r, lo, hi}
	}
	sort.SliceStable(items, func(a, b int) bool {
		if items[a].lo != items[b].lo {
			return items[a].lo < items[b].lo
		}
		return items[a].op.Call < items[b].op.Call
	})
	var misfits []porcupine.Operation
	var waiting []item
	maxCall := int64(-1 << 63) // of what was placed: a later placement must not have been answered before it
	cur := newModelSKU()
	next := 0
	for p := 0; p <= len(lin); p++ {
		for next < len(items) && items[next].lo <= p {
			waiting = append(waiting, items[next])
			next++
		}
		sort.SliceStable(waiting, func(a, b int) bool { return waiting[a].op.Call < waiting[b].op.Call })
		kept := waiting[:0]
		for _, w := range waiting {
			if w.op.Return >= maxCall {
				if ok, _ := step(cur, w.op.Input.(*skuInput)); ok {
					maxCall = max(maxCall, w.op.Call)
					continue
				}
			}
			if w.hi <= p || w.op.Return < maxCall {
				misfits = append(misfits, w.op)
				continue
			}
			kept = append(kept, w)
		}
		waiting = kept
		if p == len(lin) {
			break
		}
		_, cur = step(cur, lin[p].Input.(*skuInput))
		maxCall = max(maxCall, lin[p].Call)
	}
	for _, w := range waiting {
		misfits = append(misfits, w.op)
	}
	return misfits
}

// visualize writes the smallest prefix of h (by when operations were sent)
// that is still not linearizable, as Porcupine's HTML, and returns its path.
// A prefix keeps every operation sent before its last one; those not yet
// answered then are cut: a refusal or read is dropped, any other operation
// becomes one whose outcome is unknown. So a prefix that is not
// linearizable shows a violation of the whole history.
func visualize(sku string, h []porcupine.Operation, cfg histConfig) string {
	sorted := append([]porcupine.Operation(nil), h...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Call < sorted[j].Call })
	prefix := func(n int) []porcupine.Operation {
		cut := sorted[n-1].Call
		var out []porcupine.Operation
		for _, o := range sorted[:n] {
			in := o.Input.(*skuInput)
			if o.Return > cut {
				if in.out == outRefused || in.kind == opRead || in.kind == opOrder {
					continue
				}
				open := *in
				open.out = outUnknown
				o.Input, o.Return = &open, int64(maxTime)
			}
			out = append(out, o)
		}
		return out
	}
	illegal := func(n int) bool { return checkSKU(prefix(n), nil, cfg.Timeout/10) == porcupine.Illegal }
	lo, hi := 1, len(sorted) // the whole history is illegal
	for lo < hi {
		mid := (lo + hi) / 2
		if illegal(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	ops := prefix(hi)
	lanes(ops)
	_, info := porcupine.CheckOperationsVerbose(skuPorcupine, ops, cfg.Timeout)
	path := filepath.Join(cfg.Dir, "history-"+cfg.Name+"-"+sku+".html")
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return ""
	}
	if err := porcupine.VisualizePath(skuPorcupine, info, path); err != nil {
		return ""
	}
	return path
}

// foldUnanswered keeps the first of unanswered attempts (in the order they
// were sent) and drops the rest.
func foldUnanswered(attempts []int, drop []bool) {
	for _, j := range attempts[min(1, len(attempts)):] {
		drop[j] = true
	}
}
