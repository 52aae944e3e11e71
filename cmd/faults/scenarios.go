package main

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/acme/inventory/mq"
	"github.com/acme/inventory/testkit/servers"
)

// Scenario is one fault (or set of faults) injected while the workload runs.
type Scenario struct {
	Name      string
	Instances int  // inventoryd processes (default 1)
	Cluster   bool // Redis Cluster of three masters instead of one Redis
	Quick     bool // part of the subset make test runs
	// From is the git revision whose inventoryd the fleet starts on and
	// migrates with ("": the one under test): the upgrade scenario.
	From string
	// Campaign: a flash-sale campaign on the hot SKU opens and ends
	// within the workload, with its buyers and checks (campaign.go).
	Campaign bool
	// Timed: the thresholds of docs/SPEC.md section 7 on the answers'
	// times are verdicts (elsewhere the times are reported only).
	Timed       bool
	MinDuration time.Duration
	// Stale is how long before it was sent a refusal may reflect the
	// database in the history check, where the fault leaves Redis or the
	// nodes' sold-out flags behind it (docs/faults.md, the history check); 0 is
	// strictStale.
	Stale time.Duration
	// Env is added to every instance's environment.
	Env []string
	// Before runs once the instances are up and the SKUs put, before the
	// workload starts.
	Before func(ctx context.Context, r *Run) error
	// Fault runs beside the workload and must leave every server it broke
	// running again before it returns.
	Fault func(ctx context.Context, r *Run) error
	// After runs once the workload has stopped, before the checks.
	After func(ctx context.Context, r *Run, v *Verdict) error
	// Inspect sees the run after the checks, before teardown.
	Inspect func(ctx context.Context, r *Run, v *Verdict)
}

// redisStale is how far a refusal may lag a give-back where the fault can
// leave Redis or the nodes' sold-out flags behind the database (Redis
// flushed, rolled back, failed over or cut off; a node killed between the
// database's commit and its give-back to Redis; the database killed under
// a commit): until the realigner's next pass (realignInterval) and the
// sold-out flag's expiry (2 s, the default), with a second to spare.
const redisStale = realignInterval + 3*time.Second

// killRandomly SIGKILLs a random instance and restarts it 0.2-1 s later,
// again and again until fraction until of the run.
func (r *Run) killRandomly(ctx context.Context, until float64) (int, error) {
	kills := 0
	for time.Since(r.start) < time.Duration(until*float64(r.duration)) && ctx.Err() == nil {
		in := r.fleet[r.rng.IntN(len(r.fleet))]
		in.Kill()
		kills++
		sleep(ctx, time.Duration(200+r.rng.IntN(800))*time.Millisecond)
		if err := in.Start(ctx); err != nil {
			return kills, err
		}
		sleep(ctx, time.Duration(500+r.rng.IntN(1500))*time.Millisecond)
	}
	return kills, nil
}

var scenarios = append([]Scenario{
	{Name: "redis-restart", Stale: redisStale, Fault: func(ctx context.Context, r *Run) error {
		r.at(ctx, 0.35)
		if err := r.redis.Kill(); err != nil {
			return err
		}
		r.note("redis killed (no persistence)")
		sleep(ctx, time.Second)
		r.note("redis started empty")
		return r.redis.Start()
	}},
	{Name: "redis-flushall", Stale: redisStale, Quick: true, Fault: func(ctx context.Context, r *Run) error {
		for _, f := range []float64{0.3, 0.65} {
			r.at(ctx, f)
			if err := r.redis.Client().FlushAll(ctx).Err(); err != nil {
				return err
			}
			r.note("FLUSHALL")
		}
		return nil
	}},
	{Name: "redis-evict", Stale: redisStale, Fault: func(ctx context.Context, r *Run) error {
		rdb := r.redis.Client()
		// Keys vanish one by one, the stock keys among them, while the sale goes on.
		for _, f := range []float64{0.2, 0.35} {
			r.at(ctx, f)
			keys, err := rdb.Keys(ctx, "inv:*").Result()
			if err != nil {
				return err
			}
			gone := 0
			for _, k := range keys {
				if r.rng.IntN(2) == 0 {
					gone += int(rdb.Del(ctx, k).Val())
				}
			}
			r.note("deleted %d of %d keys", gone, len(keys))
		}
		// Every stock key expires.
		r.at(ctx, 0.5)
		keys, err := rdb.Keys(ctx, "inv:{*}:stock").Result()
		if err != nil {
			return err
		}
		for _, k := range keys {
			rdb.PExpire(ctx, k, time.Duration(1+r.rng.IntN(50))*time.Millisecond)
		}
		r.note("%d stock keys set to expire within 50ms", len(keys))
		// Real eviction: memory capped below what is used, LRU over all keys.
		r.at(ctx, 0.65)
		info, err := rdb.Info(ctx, "memory").Result()
		if err != nil {
			return err
		}
		mem, dataset := infoInt(info, "used_memory"), infoInt(info, "used_memory_dataset")
		if err := rdb.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
			return err
		}
		if err := rdb.ConfigSet(ctx, "maxmemory", strconv.FormatInt(mem-dataset/2, 10)).Err(); err != nil {
			return err
		}
		before := rdb.Info(ctx, "stats").Val()
		sleep(ctx, 2*time.Second)
		after := rdb.Info(ctx, "stats").Val()
		if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
			return err
		}
		r.note("maxmemory set half the dataset (%d bytes) under use for 2s, allkeys-lru: %d keys evicted, %d error replies (OOM)",
			dataset/2, infoInt(after, "evicted_keys")-infoInt(before, "evicted_keys"), infoInt(after, "total_error_replies")-infoInt(before, "total_error_replies"))
		return nil
	}},
	{Name: "redis-rdb-rollback", Stale: redisStale, Quick: true, Fault: func(ctx context.Context, r *Run) error {
		r.at(ctx, 0.2)
		snap, err := r.redis.Snapshot("early")
		if err != nil {
			return err
		}
		r.note("RDB snapshot taken")
		r.at(ctx, 0.6)
		r.note("redis restarted from the earlier snapshot")
		return r.redis.RestartFrom(snap)
	}},
	{Name: "redis-failover", Stale: redisStale, Fault: func(ctx context.Context, r *Run) error {
		replica, err := servers.StartReplica(filepath.Join(r.dir, "replica"), servers.FreePort(), r.redis)
		if err != nil {
			return err
		}
		r.closers = append(r.closers, replica.Close)
		r.note("replica in sync")
		r.at(ctx, 0.3)
		if err := replica.Promote(); err != nil {
			return err
		}
		r.note("replica cut off (lags from here on)")
		r.at(ctx, 0.55)
		if err := r.links["redis"].Switch(replica.Addr()); err != nil {
			return err
		}
		if err := r.redis.Kill(); err != nil {
			return err
		}
		r.note("primary killed; the lagging replica is the primary (REPLICAOF NO ONE)")
		return nil
	}},
	{Name: "kill-inventoryd", Stale: redisStale, Instances: 2, Quick: true, Fault: func(ctx context.Context, r *Run) error {
		// SIGKILLs restarted at once (the node comes back under its
		// instance name, so with its queue locks), then one that stays
		// down until the other node applies the dead one's queues (the
		// takeover, timed), then more quick ones.
		r.at(ctx, 0.1)
		kills, err := r.killRandomly(ctx, 0.3)
		if err != nil {
			return err
		}
		if err := r.killForTakeover(ctx); err != nil {
			return err
		}
		more, err := r.killRandomly(ctx, 0.85)
		r.note("%d SIGKILLs of a random instance mid-checkout and mid-payment, each restarted within 1 s", kills+more)
		return err
	}},
	{Name: "broker-stop", Stale: redisStale, Instances: 2, MinDuration: 50 * time.Second, Fault: func(ctx context.Context, r *Run) error {
		r.at(ctx, 0.15)
		if err := r.lab.mq.StopBroker(); err != nil {
			return err
		}
		r.note("broker stopped")
		sleep(ctx, 30*time.Second)
		if err := r.lab.mq.StartBroker(); err != nil {
			return err
		}
		r.note("broker started again")
		// When the name server routes the topic again, and when the relay's
		// sends and the consumers' applying resume (each read from the
		// database), within 90 s; then kill a consumer while the backlog of
		// 30 s of payments drains. A broker that loses its own start-up race
		// (RocketMQ 5.3.3: its first registration goes to the name servers
		// its client has already connected to, possibly none) is routed only
		// by its periodic registration, 10 s after its start: no client can
		// find it until then, so the sync is also timed from the route.
		before, began := r.unapplied(ctx), time.Now()
		sent0, applied0, _, err := r.syncCounts(ctx)
		if err != nil {
			return err
		}
		routed, sends, applying := time.Duration(-1), time.Duration(-1), time.Duration(-1)
		for time.Since(began) < 90*time.Second && (routed < 0 || sends < 0 || applying < 0) && ctx.Err() == nil {
			if routed < 0 {
				if ok, _ := mq.TopicExists(ctx, []string{r.lab.mq.NameServer()}, r.resourceName()); ok {
					routed = time.Since(began)
				}
			}
			if sent, applied, _, err := r.syncCounts(ctx); err == nil {
				if sends < 0 && sent > sent0 {
					sends = time.Since(began)
				}
				if applying < 0 && applied > applied0 {
					applying = time.Since(began)
				}
			}
			sleep(ctx, 100*time.Millisecond)
		}
		r.note("after the restart (-1: not within 90 s): the name server routed it again after %s; sends resumed %s, applying resumed %s after the broker was back (%s after the route)",
			routed.Round(time.Millisecond), sends.Round(time.Millisecond), applying.Round(time.Millisecond), sinceRoute(applying, routed))
		now := r.unapplied(ctx)
		in := r.fleet[r.rng.IntN(len(r.fleet))]
		in.Kill()
		if now < before {
			r.note("%s (a consumer) killed while the backlog drained (%d → %d unapplied, %.0fs after the broker came back)", in.Name, before, now, time.Since(began).Seconds())
		} else {
			r.note("the backlog had not started to drain %.0fs after the broker came back (%d → %d unapplied); %s (a consumer) killed", time.Since(began).Seconds(), before, now, in.Name)
		}
		sleep(ctx, time.Second)
		return in.Start(ctx)
	}},
	{Name: "mariadb-restart", Stale: redisStale, Fault: func(ctx context.Context, r *Run) error {
		for _, f := range []float64{0.3, 0.7} {
			r.at(ctx, f)
			unapplied := r.unapplied(ctx)
			if err := r.lab.db.Kill(); err != nil {
				return err
			}
			r.note("mariadb killed (%d stock operations were waiting to apply)", unapplied)
			sleep(ctx, 3*time.Second)
			if err := r.lab.db.Start(); err != nil {
				return err
			}
			r.note("mariadb started again (crash recovery)")
		}
		return nil
	}},
	{Name: "scale-out", Instances: 3, After: soldOutClearsEverywhere, Inspect: sharedWork},
	{Name: "redis-cluster", Stale: redisStale, Instances: 2, Cluster: true, Fault: func(ctx context.Context, r *Run) error {
		r.at(ctx, 0.4)
		i := r.rng.IntN(3)
		r.note("cluster master %d restarting (empty)", i)
		if err := r.cluster.RestartNode(i); err != nil {
			return err
		}
		r.note("cluster master %d back", i)
		return nil
	}},
	{Name: "abuse", Instances: 2, Quick: true, Fault: abuse},
	// A flash-sale campaign on the hot SKU: Redis flushed at the opening
	// and rolled back to before it, a quiet point in the window, a node
	// SIGKILLed at the end (campaign.go).
	{Name: "campaign", Instances: 2, Stale: redisStale, Quick: true, Campaign: true, MinDuration: 18 * time.Second, Fault: campaignFault},
	// Webhook subscriptions delivered through a receiver that is down,
	// slow past the deadline and answering 500 in turn, and the node that
	// delivers it SIGKILLed while it catches up (webhooks.go).
	{Name: "webhooks", Instances: 2, Env: hookEnv, Before: hooksBefore, Fault: hooksFault, Inspect: hooksInspect},
	// A rolling upgrade of the fleet from the release before, under load
	// (upgrade.go).
	upgrade,
	upgradeLean,
	// The lean sale's projector's leader killed and its lock held while
	// holds expire (projector.go).
	projectorKill,
}, linkScenarios()...)

// sinceRoute is how long after the route came back (routed) something
// resumed (at), as text; "-" when either was not seen.
func sinceRoute(at, routed time.Duration) string {
	if at < 0 || routed < 0 {
		return "-"
	}
	return max(0, at-routed).Round(time.Millisecond).String()
}

// soldOutClearsEverywhere drains the hot SKU until every instance answers
// sold out, restocks it through one instance, and expects each instance to
// sell again: no node keeps a stale sold-out flag.
func soldOutClearsEverywhere(ctx context.Context, r *Run, v *Verdict) error {
	for i := 0; ; i++ {
		if i > 2000 {
			return fmt.Errorf("the hot SKU never sold out")
		}
		out := 0
		for n, in := range r.fleet {
			user := fmt.Sprintf("drain-%d-%d", i, n)
			a := r.client.doAt(ctx, in.URL(), http.MethodPost, "/v1/seckill/"+hotSKU+"/buy", map[string]string{"user_id": user}, r.client.buyerHeader(user))
			switch a.Status {
			case http.StatusCreated:
				r.witness.created(a, user)
			case http.StatusConflict:
				out++
			}
		}
		if out == len(r.fleet) {
			break
		}
	}
	units := int64(len(r.fleet))
	ref := fmt.Sprintf("restock-everywhere-%d", r.seed)
	a := r.client.doAt(ctx, r.fleet[0].URL(), http.MethodPost, "/v1/skus/"+hotSKU+"/adjust",
		map[string]any{"delta": units, "reason": "restock", "reference": ref}, r.client.adminHeader())
	r.witness.restocked(restock{SKU: hotSKU, Delta: units, Ref: ref, Acked: a.Status == http.StatusOK})
	if a.Status != http.StatusOK {
		return fmt.Errorf("restock: %d %v", a.Status, a.Body)
	}
	r.note("hot SKU sold out on every instance; restocked %d through %s", units, r.fleet[0].Name)
	for n, in := range r.fleet {
		user := fmt.Sprintf("after-restock-%d", n)
		var got int
		// Within 500 ms: a flag that was never cleared would still answer
		// sold out (flags last 2 s).
		for end := time.Now().Add(500 * time.Millisecond); time.Now().Before(end); sleep(ctx, 50*time.Millisecond) {
			a := r.client.doAt(ctx, in.URL(), http.MethodPost, "/v1/seckill/"+hotSKU+"/buy", map[string]string{"user_id": user}, r.client.buyerHeader(user))
			if got = a.Status; got == http.StatusCreated {
				r.witness.created(a, user)
				break
			}
		}
		if got != http.StatusCreated {
			v.problem("%s still answers %d 500ms after the restock (stale sold-out flag)", in.Name, got)
		}
	}
	return nil
}

// infoInt reads one integer field of an INFO answer.
func infoInt(info, field string) int64 {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// sharedWork reads each instance's counters: the consumer group must have
// spread the applying over more than one node; the notes say who relayed,
// applied and expired what.
func sharedWork(ctx context.Context, r *Run, v *Verdict) {
	var applying int
	var parts []string
	for _, in := range r.fleet {
		m, err := scrape(ctx, in.URL())
		if err != nil {
			v.problem("%s /metrics: %v", in.Name, err)
			return
		}
		if m["inventory_mq_applied_total"] > 0 {
			applying++
		}
		parts = append(parts, fmt.Sprintf("%s relayed %.0f, applied %.0f, expired %.0f", in.Name,
			m["inventory_mq_sent_total"], m["inventory_mq_applied_total"], m["inventory_orders_expired_total"]))
	}
	r.note("%s", strings.Join(parts, "; "))
	if applying < 2 {
		v.problem("only %d of %d instances applied stock operations: the consumer group did not balance", applying, len(r.fleet))
	}
}

// scrape reads the unlabelled samples of an instance's /metrics.
func scrape(ctx context.Context, base string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		name, value, ok := strings.Cut(lines.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") || strings.Contains(name, "{") {
			continue
		}
		if f, err := strconv.ParseFloat(value, 64); err == nil {
			out[name] = f
		}
	}
	return out, lines.Err()
}

// abuse aims hostile traffic at the service beside the workload: 1,000
// concurrent replays of a pending order's signed callback, forged, stale and
// unknown-order callbacks, the token API aimed at live order reservations,
// a buyer token used for another user, and one buyer over the per-user
// limit from 50 connections with spoofed forwarding headers. Every probe
// that is not refused is a finding.
func abuse(ctx context.Context, r *Run) error {
	c, w := r.client, r.witness
	rng := rand.New(rand.NewPCG(r.seed, 99))
	r.at(ctx, 0.3)

	// Fresh pending orders (held units) to aim at, on stock added for them.
	for i, sku := range cartSKUs {
		ref := fmt.Sprintf("restock-victims-%d-%d", r.seed, i)
		a := c.do(ctx, rng, http.MethodPost, "/v1/skus/"+sku+"/adjust", map[string]any{"delta": 10, "reason": "restock", "reference": ref}, c.adminHeader())
		if a.Status == http.StatusOK || a.ambiguous() {
			w.restocked(restock{SKU: sku, Delta: 10, Ref: ref, Acked: a.Status == http.StatusOK})
		}
	}
	var victims []*orderSeen
	for i := 0; len(victims) < 20 && i < 200 && ctx.Err() == nil; i++ {
		user := fmt.Sprintf("victim-%d", i)
		h := c.buyerHeader(user)
		h.Set("Idempotency-Key", fmt.Sprintf("victim-%d-%d", r.seed, i))
		a := c.do(ctx, rng, http.MethodPost, "/v1/orders", map[string]any{"user_id": user,
			"items": []map[string]any{{"sku": cartSKUs[i%len(cartSKUs)], "qty": 1}}}, h)
		if a.Status == http.StatusCreated {
			victims = append(victims, w.created(a, user))
		}
	}
	if len(victims) < 2 {
		return fmt.Errorf("abuse: could not place orders to aim at (%d)", len(victims))
	}

	// The token API aimed at their reservations, while they hold units.
	probes := 0
	for _, o := range victims[1:] {
		for sku := range o.Items {
			for _, path := range []string{"/v1/stock/release", "/v1/stock/commit"} {
				a := c.do(ctx, rng, http.MethodPost, path, map[string]any{"sku": sku, "token": o.ID}, c.clientHeader())
				probes++
				if a.Status == http.StatusOK && (a.num("released") > 0 || a.num("committed") > 0) {
					w.notRefused("token API " + path + " on an order's reservation")
				}
			}
		}
		forged, fh := c.callback("not-the-secret-"+o.ID, o.ID, "forged-"+o.ID, time.Now())
		stale, sh := c.callback(c.secrets.Payment, o.ID, "stale-"+o.ID, time.Now().Add(-time.Hour))
		unknown, uh := c.callback(c.secrets.Payment, fmt.Sprintf("0190aaaa-bbbb-7ccc-8ddd-%012d", rng.IntN(1e9)), "unknown-"+o.ID, time.Now())
		for _, p := range []struct {
			kind string
			body []byte
			h    http.Header
			want int
		}{{"forged callback", forged, fh, http.StatusUnauthorized}, {"stale callback", stale, sh, http.StatusUnauthorized},
			{"callback for an unknown order", unknown, uh, http.StatusNotFound}} {
			a := c.do(ctx, rng, http.MethodPost, "/v1/payments/callback", p.body, p.h)
			probes++
			if a.Status != p.want && !a.ambiguous() {
				w.notRefused(fmt.Sprintf("%s (%d)", p.kind, a.Status))
			}
		}
		// Another buyer's token, the victim's user id: 403.
		a := c.do(ctx, rng, http.MethodPost, "/v1/orders", map[string]any{"user_id": o.User,
			"items": []map[string]any{{"sku": cartSKUs[0], "qty": 1}}}, c.buyerHeader("mallory"))
		probes++
		if a.Status != http.StatusForbidden && !a.ambiguous() {
			w.notRefused(fmt.Sprintf("order as another buyer (%d)", a.Status))
		}
	}
	r.note("%d token-API, forged/stale/unknown callback and impersonation probes at %d held orders", probes, len(victims)-1)

	// 1,000 concurrent replays of the first victim's correctly signed
	// callback: one payment, every answer the same paid order.
	target := victims[0]
	pid := "pay-" + target.ID
	body, h := c.callback(c.secrets.Payment, target.ID, pid, time.Now())
	var paid, other atomic.Int64
	parallel(50, 20, func(rng *rand.Rand) {
		a := c.do(ctx, rng, http.MethodPost, "/v1/payments/callback", body, h)
		switch {
		case a.Status == http.StatusOK && a.str("id") == target.ID && a.str("status") == "PAID" && a.str("payment_id") == pid:
			paid.Add(1)
		case !a.ambiguous():
			other.Add(1)
		}
	}, r.seed)
	if paid.Load() > 0 {
		w.paid(target, pid)
	}
	if other.Load() > 0 {
		w.notRefused(fmt.Sprintf("replayed callbacks answered otherwise than the paid order (%d)", other.Load()))
	}
	r.note("1000 concurrent replays of %s's callback: %d answered the paid order", target.ID, paid.Load())

	// One buyer, 50 connections, spoofed forwarding headers, over the limit;
	// each purchase won is paid at once, so none expires and frees quota.
	ref := fmt.Sprintf("restock-abuse-%d", r.seed)
	a := c.do(ctx, rng, http.MethodPost, "/v1/skus/"+hotSKU+"/adjust", map[string]any{"delta": 40, "reason": "restock", "reference": ref}, c.adminHeader())
	w.restocked(restock{SKU: hotSKU, Delta: 40, Ref: ref, Acked: a.Status == http.StatusOK})
	user := fmt.Sprintf("greedy-%d", r.seed)
	var won atomic.Int64
	clients := make(chan *Client, 50)
	for range 50 {
		clients <- newClient(c.secrets, c.urls, c.stats, c.hist, c.follow) // connections of its own
	}
	parallel(50, 3, func(rng *rand.Rand) {
		own := <-clients
		defer func() { clients <- own }()
		hdr := c.buyerHeader(user)
		hdr.Set("X-Forwarded-For", fmt.Sprintf("203.0.113.%d", rng.IntN(250)))
		hdr.Set("X-Real-IP", fmt.Sprintf("198.51.100.%d", rng.IntN(250)))
		a := own.do(ctx, rng, http.MethodPost, "/v1/seckill/"+hotSKU+"/buy", map[string]string{"user_id": user}, hdr)
		if a.Status == http.StatusCreated {
			won.Add(1)
			o := w.created(a, user)
			b, ph := own.callback(c.secrets.Payment, o.ID, "pay-"+o.ID, time.Now())
			if p := own.do(ctx, rng, http.MethodPost, "/v1/payments/callback", b, ph); p.Status == http.StatusOK && p.str("status") == "PAID" {
				w.paid(o, "pay-"+o.ID)
			}
		}
	}, r.seed+1)
	close(clients)
	for own := range clients {
		own.http.CloseIdleConnections()
	}
	var paidOrders int64
	if err := r.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM orders WHERE user_id = ? AND status = 'PAID'`, user).Scan(&paidOrders); err != nil {
		return err
	}
	switch {
	case paidOrders > hotLimit:
		w.notRefused(fmt.Sprintf("purchases beyond the per-user limit of %d (%d paid)", hotLimit, paidOrders))
	case won.Load() == 0:
		return fmt.Errorf("abuse: the greedy buyer won nothing; the limit was not tested")
	}
	r.note("one buyer from 50 connections with spoofed XFF/X-Real-IP: %d of 150 purchases won, %d paid (limit %d)", won.Load(), paidOrders, hotLimit)
	return nil
}

// parallel runs f n×each times from n goroutines, each with its own rng.
func parallel(n, each int, f func(*rand.Rand), seed uint64) {
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(rng *rand.Rand) {
			defer wg.Done()
			for j := 0; j < each; j++ {
				f(rng)
			}
		}(rand.New(rand.NewPCG(seed, uint64(1000+i))))
	}
	wg.Wait()
}
