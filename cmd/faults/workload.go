package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"
)

// The catalog every scenario sells from: one hot seckill SKU with a
// per-user limit, cart SKUs, and a SKU for the raw token API.
const (
	hotSKU   = "HOT"
	tokenSKU = "TOK"
	hotLimit = 2
)

var cartSKUs = []string{"CART-1", "CART-2", "CART-3", "CART-4"}

// initialStock is what each SKU is created with; small enough that the
// workload sells every SKU out and restocks race the last units.
var initialStock = map[string]int64{hotSKU: 150, tokenSKU: 120, "CART-1": 80, "CART-2": 80, "CART-3": 60, "CART-4": 60}

// Witness is what the workload was told: the client-side record the checker
// holds the database to. An acknowledged order, payment, commit or restock
// the database does not have is lost; two acknowledged payments of one order
// are a duplicate.
type Witness struct {
	mu       sync.Mutex
	orders   map[string]*orderSeen
	commits  map[string]int64 // token -> units the API said it committed
	refunds  map[string]bool  // orders answered REFUNDED
	restocks []restock
	refused  map[string]int // abuse probes that must be refused, by kind, that were not
	camp     *campaignSeen  // a campaign run's buys and polls (campaign.go)
	count    *countSeen     // the run's stock count, once posted (counts.go)
}

type orderSeen struct {
	ID    string
	User  string
	Key   string // the Idempotency-Key it was made with ("": none)
	Items map[string]int64
	Paid  map[string]bool // payment ids answered PAID
}

type restock struct {
	SKU   string
	Delta int64
	Ref   string
	Acked bool // false: the answer was ambiguous
}

func newWitness() *Witness {
	return &Witness{orders: map[string]*orderSeen{}, commits: map[string]int64{}, refunds: map[string]bool{}, refused: map[string]int{}}
}

func (w *Witness) created(a Answer, user string) *orderSeen {
	o := &orderSeen{ID: a.str("id"), User: user, Items: map[string]int64{}, Paid: map[string]bool{}}
	items, _ := a.Body["items"].([]any)
	for _, it := range items {
		m, _ := it.(map[string]any)
		sku, _ := m["sku"].(string)
		q, _ := m["qty"].(float64)
		o.Items[sku] += int64(q)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if prev, ok := w.orders[o.ID]; ok { // an idempotent replay answered the same order
		return prev
	}
	w.orders[o.ID] = o
	return o
}

// createdWithKey is created, for an order made under key.
func (w *Witness) createdWithKey(a Answer, user, key string) *orderSeen {
	o := w.created(a, user)
	w.mu.Lock()
	defer w.mu.Unlock()
	o.Key = key
	return o
}

func (w *Witness) paid(o *orderSeen, paymentID string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	o.Paid[paymentID] = true
}

func (w *Witness) committed(token string, qty int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.commits[token] = qty
}

func (w *Witness) refunded(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.refunds[id] = true
}

func (w *Witness) restocked(r restock) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.restocks = append(w.restocks, r)
}

func (w *Witness) notRefused(kind string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.refused[kind]++
}

// pickPaid is an order the workload saw paid, and the payment id that paid it.
func (w *Witness) pickPaid(rng *rand.Rand) (*orderSeen, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var paid []*orderSeen
	for _, o := range w.orders {
		if len(o.Paid) > 0 {
			paid = append(paid, o)
		}
	}
	if len(paid) == 0 {
		return nil, ""
	}
	o := paid[rng.IntN(len(paid))]
	for pid := range o.Paid {
		return o, pid
	}
	return nil, ""
}

// Workload runs the mixed traffic of every scenario until ctx ends.
type Workload struct {
	c       *Client
	w       *Witness
	seed    uint64
	ttl     time.Duration
	wg      sync.WaitGroup
	late    sync.WaitGroup // late payments still to send after the workload stops
	lateCtx context.Context
	camp    *campaignPlan // the run's campaign, if it has one (campaign.go)
	quiet   *sync.RWMutex // the campaign's buyers hold it shared while they buy; the driver takes it for a quiet point
}

func (wl *Workload) rng(actor int) *rand.Rand {
	return rand.New(rand.NewPCG(wl.seed, uint64(actor)))
}

// Run starts every actor; Wait returns when they have all stopped.
func (wl *Workload) Run(ctx context.Context) {
	actor := 0
	spawn := func(n int, f func(ctx context.Context, rng *rand.Rand, id int)) {
		for i := 0; i < n; i++ {
			actor++
			rng, id := wl.rng(actor), actor
			wl.wg.Add(1)
			go func() { defer wl.wg.Done(); f(ctx, rng, id) }()
		}
	}
	spawn(8, wl.seckillBuyer)
	spawn(4, wl.cartShopper)
	spawn(2, wl.tokenUser)
	spawn(1, wl.refunder)
	spawn(1, wl.restocker)
	if wl.camp != nil { // after the others: their random streams stay those of a run without it
		spawn(campaignBuyers, wl.campaignBuyer)
	}
	spawn(2, wl.reader)
	spawn(1, wl.counter) // last: every other actor's random stream stays what it was without it
}

func (wl *Workload) Wait() { wl.wg.Wait(); wl.late.Wait() }

// seckillBuyer buys the hot SKU as ever new buyers (and now and then one
// who already bought, to meet the per-user limit), then pays, cancels or
// walks away.
func (wl *Workload) seckillBuyer(ctx context.Context, rng *rand.Rand, id int) {
	for n := 0; ctx.Err() == nil; n++ {
		user := fmt.Sprintf("s%d-%d", id, n)
		if n > 0 && rng.IntN(5) == 0 {
			user = fmt.Sprintf("s%d-%d", id, rng.IntN(n))
		}
		a := wl.c.do(ctx, rng, http.MethodPost, "/v1/seckill/"+hotSKU+"/buy", map[string]string{"user_id": user}, wl.c.buyerHeader(user))
		if a.Status == http.StatusCreated {
			wl.afterOrder(ctx, rng, wl.w.created(a, user))
		} else if a.Status == http.StatusConflict {
			sleep(ctx, time.Duration(20+rng.IntN(60))*time.Millisecond) // sold out: buyers retry at a human pace
		}
	}
}

// cartShopper orders 1 to 3 cart SKUs under an Idempotency-Key, retrying
// an ambiguous answer with the same key.
func (wl *Workload) cartShopper(ctx context.Context, rng *rand.Rand, id int) {
	for n := 0; ctx.Err() == nil; n++ {
		user := fmt.Sprintf("c%d-%d", id, n%7)
		var items []map[string]any
		for _, i := range rng.Perm(len(cartSKUs))[:1+rng.IntN(3)] {
			items = append(items, map[string]any{"sku": cartSKUs[i], "qty": 1 + rng.IntN(3)})
		}
		h := wl.c.buyerHeader(user)
		key := fmt.Sprintf("cart-%d-%d", id, n)
		h.Set("Idempotency-Key", key)
		body := map[string]any{"user_id": user, "items": items}
		a := wl.c.retry(ctx, rng, 6, func() Answer { return wl.c.do(ctx, rng, http.MethodPost, "/v1/orders", body, h) })
		switch a.Status {
		case http.StatusCreated:
			wl.afterOrder(ctx, rng, wl.w.createdWithKey(a, user, key))
		case http.StatusConflict:
			sleep(ctx, time.Duration(50+rng.IntN(100))*time.Millisecond)
		}
	}
}

// afterOrder pays (sometimes twice, sometimes with a second payment id,
// sometimes after the order expired), cancels, or abandons the order.
func (wl *Workload) afterOrder(ctx context.Context, rng *rand.Rand, o *orderSeen) {
	switch p := rng.IntN(100); {
	case p < 55:
		pid := "pay-" + o.ID
		wl.pay(ctx, rng, o, pid)
		if rng.IntN(5) == 0 {
			wl.pay(ctx, rng, o, pid) // the provider delivers the callback again
		}
		if rng.IntN(20) == 0 {
			wl.pay(ctx, rng, o, "pay2-"+o.ID) // a second, different payment of the same order
		}
	case p < 65:
		// Paid after the order expired: re-reserves if stock is there, else REFUND_REQUIRED.
		wl.late.Add(1)
		lrng := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())) // the actor goes on with its own
		go func() {
			defer wl.late.Done()
			sleep(wl.lateCtx, wl.ttl+time.Duration(500+lrng.IntN(1500))*time.Millisecond)
			wl.pay(wl.lateCtx, lrng, o, "late-"+o.ID)
		}()
	case p < 80:
		h := wl.c.buyerHeader(o.User)
		wl.c.retry(ctx, rng, 4, func() Answer {
			return wl.c.do(ctx, rng, http.MethodPost, "/v1/orders/"+o.ID+"/cancel", nil, h)
		})
	default: // abandoned: the timeout gives it back
	}
}

func (wl *Workload) pay(ctx context.Context, rng *rand.Rand, o *orderSeen, paymentID string) Answer {
	a := wl.c.retry(ctx, rng, 8, func() Answer {
		body, h := wl.c.callback(wl.c.secrets.Payment, o.ID, paymentID, time.Now())
		return wl.c.do(ctx, rng, http.MethodPost, "/v1/payments/callback", body, h)
	})
	if a.Status == http.StatusOK && a.str("status") == "PAID" && a.str("payment_id") == paymentID {
		wl.w.paid(o, paymentID)
	}
	return a
}

// tokenUser takes stock through the raw token API and commits or releases
// each hold, retrying ambiguous answers with the same token.
func (wl *Workload) tokenUser(ctx context.Context, rng *rand.Rand, id int) {
	for n := 0; ctx.Err() == nil; n++ {
		token := fmt.Sprintf("tok-%d-%d-%d", wl.seed, id, n)
		qty := 1 + rng.IntN(3)
		h := wl.c.clientHeader()
		a := wl.c.retry(ctx, rng, 6, func() Answer {
			return wl.c.do(ctx, rng, http.MethodPost, "/v1/stock/deduct", map[string]any{"sku": tokenSKU, "qty": qty, "token": token}, h)
		})
		if a.Status != http.StatusOK {
			if a.Status == http.StatusConflict {
				sleep(ctx, time.Duration(50+rng.IntN(100))*time.Millisecond)
			}
			if !a.ambiguous() {
				continue
			}
		}
		// Held (or perhaps held): settle it either way, even past the end of the run.
		settle := context.WithoutCancel(ctx)
		body := map[string]any{"sku": tokenSKU, "token": token}
		if a.Status == http.StatusOK && rng.IntN(10) < 6 {
			c := wl.c.retry(settle, rng, 20, func() Answer { return wl.c.do(settle, rng, http.MethodPost, "/v1/stock/commit", body, h) })
			if c.Status == http.StatusOK {
				wl.w.committed(token, c.num("committed"))
			}
			continue
		}
		wl.c.retry(settle, rng, 20, func() Answer { return wl.c.do(settle, rng, http.MethodPost, "/v1/stock/release", body, h) })
	}
}

// reader reads a random SKU's levels every few tens of milliseconds, as a
// storefront does: what it is told is held to the history's model
// (linearizable.go), so a level that misses a reservation a client was
// told of, or shows a give-back twice, is caught when it is read.
func (wl *Workload) reader(ctx context.Context, rng *rand.Rand, _ int) {
	skus := append([]string{hotSKU, tokenSKU}, cartSKUs...)
	for ctx.Err() == nil {
		wl.c.do(ctx, rng, http.MethodGet, "/v1/skus/"+skus[rng.IntN(len(skus))], nil, wl.c.clientHeader())
		sleep(ctx, time.Duration(10+rng.IntN(40))*time.Millisecond)
	}
}

// refunder refunds a paid order now and then, as the operator does.
func (wl *Workload) refunder(ctx context.Context, rng *rand.Rand, _ int) {
	for ctx.Err() == nil {
		sleep(ctx, time.Duration(300+rng.IntN(500))*time.Millisecond)
		if o, _ := wl.w.pickPaid(rng); o != nil {
			a := wl.c.retry(ctx, rng, 4, func() Answer {
				return wl.c.do(ctx, rng, http.MethodPost, "/v1/orders/"+o.ID+"/refund", nil, wl.c.adminHeader())
			})
			if a.Status == http.StatusOK && a.str("status") == "REFUNDED" {
				wl.w.refunded(o.ID)
			}
		}
	}
}

// restocker adds units to a random SKU every second or so, each restock
// with its own reference so an ambiguous one can be looked up afterwards.
func (wl *Workload) restocker(ctx context.Context, rng *rand.Rand, id int) {
	skus := append([]string{hotSKU, tokenSKU}, cartSKUs...)
	for n := 0; ctx.Err() == nil; n++ {
		sleep(ctx, time.Duration(600+rng.IntN(800))*time.Millisecond)
		r := restock{SKU: skus[rng.IntN(len(skus))], Delta: int64(3 + rng.IntN(10)), Ref: fmt.Sprintf("restock-%d-%d", wl.seed, n)}
		body := map[string]any{"delta": r.Delta, "reason": "restock", "reference": r.Ref}
		// Not retried: a restock is not idempotent; an ambiguous one is resolved from the movements.
		a := wl.c.do(ctx, rng, http.MethodPost, "/v1/skus/"+r.SKU+"/adjust", body, wl.c.adminHeader())
		if a.Status == http.StatusOK || a.ambiguous() {
			r.Acked = a.Status == http.StatusOK
			wl.w.restocked(r)
		}
	}
}
