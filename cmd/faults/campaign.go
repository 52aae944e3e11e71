package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/acme/inventory"
	"github.com/acme/inventory/stock"
)

// A campaign run (Scenario.Campaign) puts a flash-sale campaign on the hot
// SKU before the workload starts, its window opening a few seconds into the
// run and closing a few seconds before the workload stops, both by the
// database's clock (docs/SPEC.md section 5). Campaign buyers poll GET
// /v1/campaigns/{id} and buy across the opening and past the end; of what
// they win some is paid, some cancelled, the rest left to expire after the
// campaign's hold, one of those paid late, after the end.
//
// Every process of a run (the driver, the inventoryd nodes, MariaDB) reads
// the same host's clock, so the driver's and the nodes' times compare with
// the database's directly (the skew read at the put is noted; it is the
// time a query takes).
const (
	campaignID        = "faults-flash"
	campaignAllotment = 60
	campaignLimit     = 2                // units per buyer in the campaign
	campaignHold      = 10 * time.Second // hold_seconds: inventory.MinHold
	campaignBuyers    = 6
	campaignOpensIn   = 3 * time.Second // after the put, by the database's clock (rounded up to a second)
	campaignEndsEarly = 3 * time.Second // before the workload stops
)

// campaignPlan is the campaign a run put.
type campaignPlan struct {
	ID               string
	SKU              string
	Allotment        int64
	StartsAt, EndsAt time.Time // as put, by the database's clock
	// skew is the database's clock less the driver's when the campaign was
	// put, within half the quickest read's round trip (one host: ~0).
	skew     time.Duration
	latePaid atomic.Bool // the one campaign order paid after the end is taken
}

// local is t (by the database's clock) on the driver's clock.
func (p *campaignPlan) local(t time.Time) time.Time { return t.Add(-p.skew) }

// campaignSeen is what the campaign's buyers were told.
type campaignSeen struct {
	answers []campAnswer
	polls   []campPoll
	orders  map[string]bool // orders a campaign buy answered 201
	late    *latePayment
}

// campAnswer is one POST /v1/campaigns/{id}/buy: sent and answered on the
// driver's clock.
type campAnswer struct {
	sent, got  time.Time
	status     int
	code       string // the error's code
	retryAfter string
	order      string // 201: the order's id
}

// campPoll is one GET /v1/campaigns/{id}.
type campPoll struct {
	sent, got time.Time
	status    int
	state     string
}

// latePayment is the campaign order paid after the campaign ended.
type latePayment struct {
	order      string
	sent       time.Time
	status     int
	orderState string // what the callback answered: PAID (re-reserved from the SKU) or REFUND_REQUIRED
}

func (w *Witness) campaignAnswered(a campAnswer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.camp.answers = append(w.camp.answers, a)
	if a.status == http.StatusCreated {
		w.camp.orders[a.order] = true
	}
}

func (w *Witness) campaignPolled(p campPoll) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.camp.polls = append(w.camp.polls, p)
}

// putCampaign puts the run's campaign on the hot SKU: its window opens
// campaignOpensIn after now by the database's clock (rounded up to a whole
// second, as a merchant's would be) and ends campaignEndsEarly before the
// workload stops.
func (r *Run) putCampaign(ctx context.Context) error {
	// The database's clock less the driver's, from the quickest of a few
	// reads (within half its round trip; a slow read under load would
	// otherwise pass for skew).
	var dbNow time.Time
	var skew, rtt time.Duration
	for i := 0; i < 5; i++ {
		before := time.Now()
		var unix string
		if err := r.db.QueryRowContext(ctx, `SELECT UNIX_TIMESTAMP(NOW(6))`).Scan(&unix); err != nil {
			return err
		}
		after := time.Now()
		secs, err := strconv.ParseFloat(unix, 64)
		if err != nil {
			return fmt.Errorf("the database's clock: %q: %w", unix, err)
		}
		if i == 0 || after.Sub(before) < rtt {
			dbNow, rtt = time.UnixMicro(int64(secs*1e6)).UTC(), after.Sub(before)
			skew = dbNow.Sub(before.Add(rtt / 2))
		}
	}
	p := &campaignPlan{ID: campaignID, SKU: hotSKU, Allotment: campaignAllotment, skew: skew}
	p.StartsAt = dbNow.Add(campaignOpensIn).Truncate(time.Second).Add(time.Second)
	p.EndsAt = dbNow.Add(r.duration - campaignEndsEarly).Truncate(time.Second)
	if p.EndsAt.Sub(p.StartsAt) < campaignHold {
		return fmt.Errorf("campaign: a workload of %s leaves a window of %s, shorter than the hold %s", r.duration, p.EndsAt.Sub(p.StartsAt), campaignHold)
	}
	a := r.client.doAt(ctx, r.fleet[0].URL(), http.MethodPut, "/v1/campaigns/"+p.ID, map[string]any{
		"sku": p.SKU, "allotment": p.Allotment, "starts_at": p.StartsAt.Format(time.RFC3339Nano), "ends_at": p.EndsAt.Format(time.RFC3339Nano),
		"per_user_limit": campaignLimit, "hold_seconds": int64(campaignHold / time.Second)}, r.client.adminHeader())
	if a.Status != http.StatusOK {
		return fmt.Errorf("PUT /v1/campaigns/%s: %d %v %v", p.ID, a.Status, a.Body, a.Err)
	}
	r.camp = p
	r.witness.camp = &campaignSeen{orders: map[string]bool{}}
	r.logf("%s: campaign %s: %d of %s, window %s to %s by the database's clock (its clock %s ahead of the driver's), limit %d, hold %s",
		r.sc.Name, p.ID, p.Allotment, p.SKU, p.StartsAt.Format("15:04:05"), p.EndsAt.Format("15:04:05"), p.skew.Round(time.Microsecond),
		campaignLimit, campaignHold)
	return nil
}

// campaignBuyer polls the campaign and buys one unit at a time as ever new
// buyers (each tries three times, against the limit of two), from before
// the opening until the workload stops; an ambiguous answer is retried with
// the same Idempotency-Key.
func (wl *Workload) campaignBuyer(ctx context.Context, rng *rand.Rand, id int) {
	path := "/v1/campaigns/" + wl.camp.ID
	for n := 0; ctx.Err() == nil; n++ {
		sent := time.Now()
		g := wl.c.do(ctx, rng, http.MethodGet, path, nil, wl.c.clientHeader())
		if ctx.Err() != nil {
			return
		}
		wl.w.campaignPolled(campPoll{sent: sent, got: time.Now(), status: g.Status, state: g.str("state")})
		user := fmt.Sprintf("k%d-%d", id, n/3)
		h := wl.c.buyerHeader(user)
		h.Set("Idempotency-Key", fmt.Sprintf("camp-%d-%d", id, n))
		wl.quiet.RLock()
		a := wl.c.retry(ctx, rng, 4, func() Answer {
			sent := time.Now()
			a := wl.c.do(ctx, rng, http.MethodPost, path+"/buy", nil, h)
			if a.Status != 0 || ctx.Err() == nil { // a request the run's end cut is no answer
				wl.w.campaignAnswered(campAnswer{sent: sent, got: time.Now(), status: a.Status, code: a.code(),
					retryAfter: a.Header.Get("Retry-After"), order: a.str("id")})
			}
			return a
		})
		if a.Status == http.StatusCreated {
			wl.afterCampaignOrder(ctx, rng, wl.w.created(a, user), a)
		}
		wl.quiet.RUnlock()
		switch {
		case a.Status == http.StatusCreated: // a buyer who won pays or cancels at a human pace: the pool lasts into the window's middle
			sleep(ctx, time.Duration(300+rng.IntN(400))*time.Millisecond)
		case a.code() == "sale_not_started":
			sleep(ctx, time.Duration(150+rng.IntN(250))*time.Millisecond)
		case a.Status == http.StatusConflict:
			sleep(ctx, time.Duration(50+rng.IntN(150))*time.Millisecond)
		default:
			sleep(ctx, time.Duration(20+rng.IntN(60))*time.Millisecond)
		}
	}
}

// afterCampaignOrder pays the order, cancels it (its unit back to the pool
// while the campaign runs), or leaves it to expire after the campaign's
// hold (back to the pool before the end, to the SKU after it); the first
// order left to expire is paid after it expired and the campaign ended.
func (wl *Workload) afterCampaignOrder(ctx context.Context, rng *rand.Rand, o *orderSeen, a Answer) {
	switch p := rng.IntN(100); {
	case p < 45:
		wl.pay(ctx, rng, o, "pay-"+o.ID)
	case p < 70:
		h := wl.c.buyerHeader(o.User)
		wl.c.retry(ctx, rng, 4, func() Answer {
			return wl.c.do(ctx, rng, http.MethodPost, "/v1/orders/"+o.ID+"/cancel", nil, h)
		})
	default:
		if !wl.camp.latePaid.CompareAndSwap(false, true) {
			return
		}
		expires, err := time.Parse(time.RFC3339Nano, a.str("expires_at"))
		if err != nil {
			expires = time.Now().Add(campaignHold)
		}
		at := expires
		if end := wl.camp.local(wl.camp.EndsAt); end.After(at) {
			at = end
		}
		at = at.Add(sweepInterval + 500*time.Millisecond) // expired, and the campaign over
		lrng := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
		wl.late.Add(1)
		go func() {
			defer wl.late.Done()
			sleep(wl.lateCtx, time.Until(at))
			sent := time.Now()
			pa := wl.pay(wl.lateCtx, lrng, o, "late-"+o.ID)
			wl.w.mu.Lock()
			wl.w.camp.late = &latePayment{order: o.ID, sent: sent, status: pa.Status, orderState: pa.str("status")}
			wl.w.mu.Unlock()
		}()
	}
}

// campaignFault: Redis snapshotted before the opening and FLUSHALLed
// right at it, then restarted from the snapshot (rolled back to
// before the opening) two seconds in; a quiet point in the middle of the
// window where Redis's copy of the pool must agree with the database's;
// and an inventoryd node SIGKILLed right at the end.
func campaignFault(ctx context.Context, r *Run) error {
	p := r.camp
	open, end := p.local(p.StartsAt), p.local(p.EndsAt)
	r.note("campaign %s: %d of %s (limit %d, hold %s) opens at %.1fs and ends at %.1fs, by the database's clock (%s ahead of the driver's)",
		p.ID, p.Allotment, p.SKU, campaignLimit, campaignHold, open.Sub(r.start).Seconds(), end.Sub(r.start).Seconds(), p.skew.Round(time.Microsecond))
	// The snapshot at once (the pool's copy as the put warmed it): under
	// load a SAVE takes seconds, and the FLUSHALL must land at the opening.
	snap, err := r.redis.Snapshot("before-opening")
	if err != nil {
		return err
	}
	r.note("RDB snapshot %s before the opening", time.Until(open).Round(time.Millisecond))
	sleep(ctx, time.Until(open))
	if err := r.redis.Client().FlushAll(ctx).Err(); err != nil {
		return err
	}
	r.note("FLUSHALL at the opening (%+dms)", time.Since(open).Milliseconds())
	sleep(ctx, time.Until(open.Add(2*time.Second)))
	if err := r.redis.RestartFrom(snap); err != nil {
		return err
	}
	r.note("redis restarted from the snapshot of before the opening (the pool's copy full, its epoch old)")
	sleep(ctx, time.Until(open.Add(end.Sub(open)*9/20)))
	if err := r.poolQuietPoint(ctx); err != nil {
		return err
	}
	sleep(ctx, time.Until(end.Add(-30*time.Millisecond)))
	in := r.fleet[r.rng.IntN(len(r.fleet))]
	in.Kill()
	r.note("%s SIGKILLed at the end (%+dms)", in.Name, time.Since(end).Milliseconds())
	sleep(ctx, time.Duration(500+r.rng.IntN(500))*time.Millisecond)
	return in.Start(ctx)
}

// quietWait is how long Redis's copy of the pool may take to agree with
// the database once the campaign's buyers are quiet: a request's follow-ups
// end 500 ms after its 1 s deadline (stock.FollowUp), and the periodic
// realign (every realignInterval, one node at a time) writes a pool Redis
// holds wrong; twice that and a margin for a loaded machine.
const quietWait = 2*realignInterval + time.Second

// poolQuietPoint stops the campaign's buyers (each finishes its buy, and
// its payment or cancel, first) and expects Redis's copy of the pool to
// agree with the database within quietWait: units left, the
// initialisation (epoch) and the window. (Not the change counter: Redis's
// is the one its initialisation read or an apply brought, and a sale that
// committed under the copy's own epoch brings none.) The rest of the workload goes on, and expiries may
// give units back to the pool meanwhile (Redis follows each).
func (r *Run) poolQuietPoint(ctx context.Context) error {
	r.quiet.Lock()
	defer r.quiet.Unlock()
	st, err := stock.NewStore(r.redis.Client(), stock.Config{
		Init: func(context.Context, string, func(inventory.Baseline) error) error {
			return errors.New("the driver reads only")
		},
		InitCampaign: func(context.Context, stock.Campaign, func(stock.CampaignBaseline) error) error {
			return errors.New("the driver reads only")
		}})
	if err != nil {
		return err
	}
	c := stock.Campaign{ID: r.camp.ID, SKU: r.camp.SKU}
	began := time.Now()
	var first, last string
	for ctx.Err() == nil {
		db, err := r.poolRow(ctx)
		if err != nil {
			return err
		}
		lv, err := st.CampaignLevels(ctx, c)
		if err != nil {
			return err
		}
		var diffs []string
		switch {
		case !lv.Initialised:
			diffs = append(diffs, "Redis has no copy")
		default:
			if db.state == "HELD" && lv.Available != db.qty {
				diffs = append(diffs, fmt.Sprintf("units left: Redis %d, the database %d", lv.Available, db.qty))
			}
			if lv.Epoch != db.epoch {
				diffs = append(diffs, fmt.Sprintf("epoch: Redis %d, the database's last %d", lv.Epoch, db.epoch))
			}
			if lv.Opens.UnixMilli() != db.starts.UnixMilli() || lv.Closes.UnixMilli() != db.ends.UnixMilli() {
				diffs = append(diffs, fmt.Sprintf("window: Redis %s-%s, the database %s-%s", lv.Opens.UTC().Format("15:04:05.000"),
					lv.Closes.UTC().Format("15:04:05.000"), db.starts.Format("15:04:05.000"), db.ends.Format("15:04:05.000")))
			}
		}
		if len(diffs) == 0 {
			if first != "" {
				first = " (at first: " + first + ")"
			}
			r.note("quiet point: Redis's pool agrees with the database after %s: %d left, epoch %d%s",
				time.Since(began).Round(time.Millisecond), db.qty, db.epoch, first)
			return nil
		}
		last = strings.Join(diffs, "; ")
		if first == "" {
			first = last
		}
		if !lv.Initialised && time.Since(began) >= quietWait {
			r.note("quiet point: Redis has no copy of the pool (the next buy initialises it from the database)")
			return nil
		}
		if time.Since(began) >= quietWait {
			r.mu.Lock()
			r.poolDrift = append(r.poolDrift, last)
			if lv.Available < db.qty && db.state == "HELD" {
				r.poolHidden += db.qty - lv.Available
			}
			r.mu.Unlock()
			r.note("quiet point: Redis's pool still disagrees with the database after %s: %s", quietWait, last)
			return nil
		}
		sleep(ctx, 100*time.Millisecond)
	}
	return ctx.Err()
}

// poolRow is the campaign's pool and window as the database holds them.
type poolRow struct {
	state           string
	qty, seq, epoch int64
	starts, ends    time.Time
	allotment       int64
}

func (r *Run) poolRow(ctx context.Context) (poolRow, error) {
	var p poolRow
	err := r.db.QueryRowContext(ctx, `SELECT r.state, r.qty, r.result, c.redis_epoch, c.starts_at, c.ends_at, c.allotment
		FROM stock_reservations r JOIN campaigns c ON c.id = r.campaign_id WHERE r.token = ?`, "c:"+r.camp.ID).
		Scan(&p.state, &p.qty, &p.seq, &p.epoch, &p.starts, &p.ends, &p.allotment)
	return p, err
}

// CampaignCheck is what the checker found of the campaign.
type CampaignCheck struct {
	Outside     int64 // sales (201s, or the database's rows) outside the window
	WrongAnswer int64 // buys answered otherwise than the window says (before: sale_not_started with Retry-After; after: sale_ended)
	Unaccounted int64 // allotment - (sold + held + returned by the pool + released to the SKU after the end)
	PoolDrift   int   // quiet points where Redis's pool disagreed with the database
	Summary     string
}

func (c *CampaignCheck) line() string {
	return fmt.Sprintf("campaign: %d sales outside the window, %d wrong answers, %d units unaccounted, %d Redis pool disagreements; %s",
		c.Outside, c.WrongAnswer, c.Unaccounted, c.PoolDrift, c.Summary)
}

// checkCampaign holds the settled database and the buyers' answers to the
// campaign's promises: no sale outside the window, by the database's
// clock (a 201 answered before the opening, or to a buy sent after the end
// that is not a replay of an earlier sale, and any reservation row of the
// campaign created outside it); before the opening every buy refused
// sale_not_started with a Retry-After, after the end sale_ended; the
// allotment accounted for exactly (sold + held + what the pool returned
// at the end + campaign orders released to the SKU after the end); and
// Redis's copy of the pool agreeing with the database at the quiet point.
// Sales outside the window and units beyond the allotment count as
// oversold, units short of it as lost.
func (r *Run) checkCampaign(ctx context.Context, v *Verdict) error {
	cc := &CampaignCheck{}
	v.Campaign = cc
	p := r.camp
	pool, err := r.poolRow(ctx)
	if err != nil {
		return fmt.Errorf("the campaign's pool: %w", err)
	}
	if !pool.starts.Equal(p.StartsAt) || !pool.ends.Equal(p.EndsAt) {
		v.problem("campaign: the window is %s-%s in the database, %s-%s as put", pool.starts, pool.ends, p.StartsAt, p.EndsAt)
	}
	// The database's rows of the campaign's sales.
	type sale struct {
		order, state string
		qty          int64
		created      time.Time
	}
	sales := map[string]sale{}
	var sold, held, released int64
	if err := scan(ctx, r.db, `SELECT token, COALESCE(order_id, ''), state, qty, created_at FROM stock_reservations
		WHERE campaign_id = '`+p.ID+`' AND token <> 'c:`+p.ID+`'`, func(rows *sql.Rows) error {
		var tok string
		var s sale
		if err := rows.Scan(&tok, &s.order, &s.state, &s.qty, &s.created); err != nil {
			return err
		}
		sales[tok] = s
		switch s.state {
		case "COMMITTED", "SOLD", "RESTORED":
			sold += s.qty
		case "HELD":
			held += s.qty
		case "RELEASED":
			released += s.qty
		}
		if s.created.Before(pool.starts) || !s.created.Before(pool.ends) {
			cc.Outside += s.qty
			v.problem("campaign: order %s's unit was reserved at %s, outside the window %s-%s", s.order,
				s.created.Format("15:04:05.000000"), pool.starts.Format("15:04:05"), pool.ends.Format("15:04:05"))
		}
		return nil
	}); err != nil {
		return err
	}
	// Releases after the end went to the SKU, each with its RELEASE
	// movement (a release into the live pool moves nothing of the SKU's).
	var toSKU, poolReturned int64
	if err := scan(ctx, r.db, `SELECT reference, -reserved_delta FROM stock_movements WHERE sku = '`+p.SKU+`' AND kind = 'RELEASE'`,
		func(rows *sql.Rows) error {
			var ref string
			var n int64
			if err := rows.Scan(&ref, &n); err != nil {
				return err
			}
			switch {
			case ref == "campaign:"+p.ID:
				poolReturned += n
			case sales[ref].order != "":
				toSKU += n
			}
			return nil
		}); err != nil {
		return err
	}
	left := pool.qty // the pool's units: what it returned at the end, or has left
	if pool.state == "RELEASED" && poolReturned != pool.qty {
		v.problem("campaign: the pool ended with %d units, the SKU's movements say it returned %d", pool.qty, poolReturned)
	}
	if pool.state != "RELEASED" {
		v.problem("campaign: the pool is %s after the end", pool.state)
	}
	accounted := sold + held + left + toSKU
	cc.Unaccounted = p.Allotment - accounted
	switch {
	case accounted > p.Allotment:
		v.Oversold += accounted - p.Allotment
		v.problem("campaign: sold %d + held %d + the pool's %d + %d released to the SKU after the end = %d, beyond the allotment %d",
			sold, held, left, toSKU, accounted, p.Allotment)
	case accounted < p.Allotment:
		v.Lost += p.Allotment - accounted
		v.problem("campaign: sold %d + held %d + the pool's %d + %d released to the SKU after the end = %d, short of the allotment %d",
			sold, held, left, toSKU, accounted, p.Allotment)
	}
	if released-toSKU < 0 {
		v.problem("campaign: %d units released to the SKU, more than the %d of its released sales", toSKU, released)
	}

	// What the buyers were told, on the driver's clock (the host's, as the
	// database's): a 201 answered before the opening, or to a buy sent after
	// the end that no earlier sale explains (a retry with the same
	// Idempotency-Key answers the order it made).
	open, end := p.local(pool.starts), p.local(pool.ends)
	w := r.witness
	w.mu.Lock()
	answers, polls, late := slices.Clone(w.camp.answers), slices.Clone(w.camp.polls), w.camp.late
	w.mu.Unlock()
	var before, after, created int
	wrong := map[string]int{}
	for _, a := range answers {
		switch {
		case a.got.Before(open):
			before++
			switch {
			case a.status == http.StatusCreated:
				cc.Outside++
				v.problem("campaign: order %s answered 201 %s before the opening", a.order, open.Sub(a.got).Round(time.Millisecond))
			case a.status == http.StatusConflict && a.code == "sale_not_started":
				if n, err := strconv.Atoi(a.retryAfter); err != nil || n < 1 || time.Duration(n)*time.Second < open.Sub(a.got) {
					wrong[fmt.Sprintf("sale_not_started with Retry-After %q, %s before the opening", a.retryAfter, open.Sub(a.got).Round(time.Second))]++
				}
			case a.status == 0 || a.status == http.StatusServiceUnavailable:
			default:
				wrong[fmt.Sprintf("%d %s before the opening", a.status, a.code)]++
			}
		case !a.sent.Before(end):
			after++
			switch {
			case a.status == http.StatusCreated:
				if s, ok := sales[a.order]; !ok || !s.created.Before(pool.ends) {
					cc.Outside++
					v.problem("campaign: order %s answered 201 to a buy sent %s after the end", a.order, a.sent.Sub(end).Round(time.Millisecond))
				}
			case a.status == http.StatusConflict && a.code == "sale_ended":
			case a.status == 0 || a.status == http.StatusServiceUnavailable:
			default:
				wrong[fmt.Sprintf("%d %s after the end", a.status, a.code)]++
			}
		}
		if a.status == http.StatusCreated {
			created++
		}
	}
	for what, n := range wrong {
		cc.WrongAnswer += int64(n)
		v.problem("campaign: %d buys answered %s", n, what)
	}
	var badPolls []string
	for _, q := range polls {
		switch {
		case q.status != http.StatusOK:
		case q.got.Before(open) && q.state != "SCHEDULED":
			badPolls = append(badPolls, fmt.Sprintf("%s %s before the opening", q.state, open.Sub(q.got).Round(time.Millisecond)))
		case !q.sent.Before(end) && q.state != "ENDED":
			badPolls = append(badPolls, fmt.Sprintf("%s %s after the end", q.state, q.sent.Sub(end).Round(time.Millisecond)))
		}
	}
	if len(badPolls) > 0 {
		cc.WrongAnswer += int64(len(badPolls))
		v.problem("campaign: %d polls answered a state the window contradicts (first: %s)", len(badPolls), badPolls[0])
	}
	v.Oversold += cc.Outside

	// The campaign's view, read after everything settled.
	g := r.client.doAt(ctx, r.fleet[0].URL(), http.MethodGet, "/v1/campaigns/"+p.ID, nil, r.client.clientHeader())
	if g.Status != http.StatusOK || g.str("state") != "ENDED" || g.num("sold") != sold || g.num("held") != held {
		v.problem("campaign: GET answers %d %v after settling; the database has sold %d, held %d, ended", g.Status, g.Body, sold, held)
	}

	r.mu.Lock()
	cc.PoolDrift = len(r.poolDrift)
	hidden := r.poolHidden
	for _, d := range r.poolDrift {
		v.problem("campaign: at the quiet point Redis's pool disagreed with the database: %s", d)
	}
	r.mu.Unlock()
	v.Lost += hidden

	lateText := "no campaign order was left to expire"
	if late != nil {
		lateText = fmt.Sprintf("order %s paid %s after the end: %d %s", late.order, late.sent.Sub(end).Round(time.Millisecond), late.status, late.orderState)
		if late.sent.Before(end) || (late.status != http.StatusOK && late.status != 0 && late.status != http.StatusServiceUnavailable) {
			v.problem("campaign: the late payment of %s: %s", late.order, lateText)
		}
	}
	cc.Summary = fmt.Sprintf("%d buys before the opening, %d after the end, %d answered 201; of the allotment %d: sold %d, held %d, released %d (%d to the SKU after the end), the pool returned %d at the end; late payment: %s",
		before, after, created, p.Allotment, sold, held, released, toSKU, left, lateText)
	r.note("%s", cc.Summary)
	return nil
}
