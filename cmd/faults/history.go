package main

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// The history: every request the run sends through the API that takes,
// gives back or reads stock, as the client saw it (docs/faults.md, "The
// history check"). Each HTTP attempt is one operation: a retry is a second
// operation the model judges as the service must (a replay with the same
// Idempotency-Key, payment id or token answers the first), so nothing is
// folded or guessed here.

// opKind is what an operation does to a SKU.
type opKind uint8

const (
	opRead     opKind = iota // GET /v1/skus/{sku}
	opSet                    // PUT /v1/skus/{sku}: on_hand outright
	opAdjust                 // POST /v1/skus/{sku}/adjust: on_hand + delta, once per reference
	opCreate                 // an order, a seckill or campaign buy, a token's deduct: a hold per line
	opPay                    // the payment callback
	opCancel                 // an order's cancel
	opRefund                 // an order's refund
	opCommit                 // a token's commit
	opRelease                // a token's release
	opCampaign               // PUT /v1/campaigns/{id}: the allotment carved out of the SKU
	opExpire                 // the service's own timeout release (added by the checker, never sent)
	opClose                  // a campaign's end: its unsold rest back to the SKU (added by the checker)
	opOrder                  // GET /v1/orders/{id}: the order's status
)

func (k opKind) String() string {
	return [...]string{"read", "set", "adjust", "create", "pay", "cancel", "refund", "commit", "release", "campaign", "expire", "close", "order"}[k]
}

// outcome is what the client learnt: it happened, it was refused (a 4xx
// that changes nothing), or it is unknown (no answer, a 5xx): it may or may
// not have taken effect, at any time after it was sent.
type outcome uint8

const (
	outOK outcome = iota
	outRefused
	outUnknown
)

// line is one SKU of a hold.
type line struct {
	SKU string
	Qty int64
}

// histOp is one request and its answer, in the run's monotonic time.
type histOp struct {
	Kind       opKind
	Call, Ret  time.Duration // since the history began; Ret is open (maxTime) for an unknown outcome
	Out        outcome
	Status     int
	Code       string // a refusal's error code
	Msg        string // and its message
	SKU        string // read, set, adjust, commit, release
	Lines      []line // create: the request's lines (a buy: one unit)
	User       string // create: the buyer
	Key        string // create: the Idempotency-Key, if any
	Token      string // a token create, commit or release
	Campaign   string // a campaign buy or put
	Order      string // pay, cancel, refund: the order id; create: the id answered
	PaymentID  string // pay: the payment id sent
	Ref        string // adjust: the reference
	N          int64  // set: stock; adjust: delta; campaign: allotment; commit/release: units answered
	Limit      int64  // set: per_user_limit
	Answer     string // pay, cancel, refund: the order's status answered
	AnswerPaid string // pay: the payment id the answer names
	ExpiresAt  time.Time
	EndsAt     time.Time // campaign put: its end
	Hold       time.Duration
	// Made, for a create answered done whose key an earlier attempt went
	// unanswered under: when the node stamped the order's created_at,
	// inside the commit (on the history's clock; 0: not read). The hold
	// took effect after it, whichever attempt made it (foldRetries).
	Made time.Duration
	Read skuRead
}

type skuRead struct{ OnHand, Reserved, Available int64 }

// History records the operations of one run. Safe for concurrent use.
type History struct {
	mu   sync.Mutex
	base time.Time
	ops  []histOp
}

func newHistory() *History { return &History{base: time.Now()} }

func (h *History) since(t time.Time) time.Duration { return t.Sub(h.base) }

// snapshot is every operation recorded so far.
func (h *History) snapshot() []histOp {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]histOp(nil), h.ops...)
}

// record classifies one exchange and keeps it if it touches stock. body is
// what was sent (nil, []byte or a value marshalled to JSON); a is the
// answer (Status 0 when none came).
func (h *History) record(method, path string, body any, header http.Header, start, end time.Time, a Answer) {
	if h == nil {
		return
	}
	op, ok := classify(method, path, body, header)
	if !ok || neverSent(a.Err) && !a.wrote {
		return
	}
	op.Call, op.Ret, op.Status = h.since(start), h.since(end), a.Status
	switch {
	case a.ambiguous():
		op.Out, op.Ret = outUnknown, maxTime
	case a.Status >= 400:
		op.Out, op.Code, op.Msg = outRefused, a.code(), a.message()
	default:
		op.Out = outOK
	}
	if op.Out == outOK {
		if !answered(&op, a) {
			return // an answer that names nothing to judge (a FAILED callback's order)
		}
	}
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

// maxTime is an open end: an operation whose outcome is unknown may take
// effect at any time after it was sent.
const maxTime = time.Duration(1<<62 - 1)

// classify names the operation a request is, from its method, path and body.
func classify(method, path string, body any, header http.Header) (histOp, bool) {
	var raw []byte
	switch b := body.(type) {
	case nil:
	case []byte:
		raw = b
	default:
		raw, _ = json.Marshal(b)
	}
	var req struct {
		UserID    string `json:"user_id"`
		Items     []line `json:"items"`
		SKU       string `json:"sku"`
		Qty       int64  `json:"qty"`
		Token     string `json:"token"`
		Stock     *int64 `json:"stock"`
		Limit     int64  `json:"per_user_limit"`
		Delta     int64  `json:"delta"`
		Reference string `json:"reference"`
		OrderID   string `json:"order_id"`
		PaymentID string `json:"payment_id"`
		Status    string `json:"status"`
		Allotment int64  `json:"allotment"`
		EndsAt    string `json:"ends_at"`
		Hold      int64  `json:"hold_seconds"`
	}
	if len(raw) > 0 {
		if json.Unmarshal(raw, &req) != nil {
			return histOp{}, false
		}
	}
	parts := strings.Split(strings.Trim(path, "/"), "/")
	key := header.Get("Idempotency-Key")
	hold := time.Duration(req.Hold) * time.Second
	switch {
	case method == http.MethodGet && len(parts) == 3 && parts[1] == "skus":
		return histOp{Kind: opRead, SKU: parts[2]}, true
	case method == http.MethodPut && len(parts) == 3 && parts[1] == "skus" && req.Stock != nil:
		return histOp{Kind: opSet, SKU: parts[2], N: *req.Stock, Limit: req.Limit}, true
	case method == http.MethodPost && len(parts) == 4 && parts[1] == "skus" && parts[3] == "adjust":
		return histOp{Kind: opAdjust, SKU: parts[2], N: req.Delta, Ref: req.Reference}, true
	case method == http.MethodPost && len(parts) == 4 && parts[1] == "seckill" && parts[3] == "buy":
		return histOp{Kind: opCreate, Lines: []line{{parts[2], 1}}, User: req.UserID, Key: key, Hold: hold}, true
	case method == http.MethodPost && path == "/v1/orders":
		return histOp{Kind: opCreate, Lines: mergeLines(req.Items), User: req.UserID, Key: key, Hold: hold}, true
	case method == http.MethodPost && len(parts) == 4 && parts[1] == "campaigns" && parts[3] == "buy":
		return histOp{Kind: opCreate, Campaign: parts[2], Key: key, User: buyerOf(header)}, true
	case method == http.MethodPut && len(parts) == 3 && parts[1] == "campaigns":
		end, _ := time.Parse(time.RFC3339Nano, req.EndsAt)
		return histOp{Kind: opCampaign, Campaign: parts[2], SKU: req.SKU, N: req.Allotment, Limit: req.Limit, EndsAt: end, Hold: hold}, true
	case method == http.MethodPost && path == "/v1/stock/deduct":
		return histOp{Kind: opCreate, Lines: []line{{req.SKU, req.Qty}}, Token: req.Token}, true
	case method == http.MethodPost && path == "/v1/stock/commit":
		return histOp{Kind: opCommit, SKU: req.SKU, Token: req.Token}, true
	case method == http.MethodPost && path == "/v1/stock/release":
		return histOp{Kind: opRelease, SKU: req.SKU, Token: req.Token}, true
	case method == http.MethodGet && len(parts) == 3 && parts[1] == "orders":
		return histOp{Kind: opOrder, Order: parts[2]}, true
	case method == http.MethodPost && len(parts) == 4 && parts[1] == "orders" && parts[3] == "cancel":
		return histOp{Kind: opCancel, Order: parts[2]}, true
	case method == http.MethodPost && len(parts) == 4 && parts[1] == "orders" && parts[3] == "refund":
		return histOp{Kind: opRefund, Order: parts[2]}, true
	case method == http.MethodPost && path == "/v1/payments/callback" && req.Status == "SUCCESS":
		return histOp{Kind: opPay, Order: req.OrderID, PaymentID: req.PaymentID}, true
	}
	return histOp{}, false
}

// answered reads what a successful answer says into op; false when there
// is nothing in it to judge.
func answered(op *histOp, a Answer) bool {
	switch op.Kind {
	case opRead:
		op.Read = skuRead{a.num("on_hand"), a.num("reserved"), a.num("available")}
	case opCreate:
		if op.Token != "" {
			return true
		}
		op.Order = a.str("id")
		op.ExpiresAt, _ = time.Parse(time.RFC3339Nano, a.str("expires_at"))
		items, _ := a.Body["items"].([]any)
		var lines []line
		for _, it := range items {
			m, _ := it.(map[string]any)
			sku, _ := m["sku"].(string)
			q, _ := m["qty"].(float64)
			lines = append(lines, line{sku, int64(q)})
		}
		op.Lines = mergeLines(lines)
	case opPay, opCancel, opRefund, opOrder:
		op.Answer, op.AnswerPaid = a.str("status"), a.str("payment_id")
	case opCommit:
		op.N = a.num("committed")
	case opRelease:
		op.N = a.num("released")
	}
	return true
}

func mergeLines(lines []line) []line {
	var out []line
	for _, l := range lines {
		found := false
		for i := range out {
			if out[i].SKU == l.SKU {
				out[i].Qty += l.Qty
				found = true
			}
		}
		if !found {
			out = append(out, l)
		}
	}
	return out
}

// buyerOf is the user a buyer token names (its JWT subject), read without
// verifying it: the service verifies, the history only needs the name.
func buyerOf(h http.Header) string {
	parts := strings.Split(h.Get("X-Buyer-Token"), ".")
	if len(parts) != 3 {
		return ""
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return ""
	}
	var claims struct {
		Sub string `json:"sub"`
	}
	_ = json.Unmarshal(raw, &claims)
	return claims.Sub
}

// savedHistory is a run's history as written beside its logs, so a check
// can be replayed without the run (go test -run TestReplayHistory).
type savedHistory struct {
	Base    time.Time
	Stale   time.Duration // the scenario's allowance for refusals
	Ops     []histOp
	Commits []commit
	Never   []histOp // the creates the database never took (histConfig.Never)
}

func writeHistory(path string, h savedHistory) error {
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func readHistory(path string) (savedHistory, error) {
	var h savedHistory
	b, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(b, &h)
	}
	return h, err
}

// neverSent: the connection was never made (the node was down), so the
// request reached no one and changed nothing.
func neverSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
