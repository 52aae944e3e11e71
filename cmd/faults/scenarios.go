package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// Scenario is one fault (or set of faults) injected while the workload runs.
type Scenario struct {
	Name        string
	Instances   int  // inventoryd processes (default 1)
	Cluster     bool // Redis Cluster of three masters instead of one Redis
	Quick       bool // part of the subset make test runs
	MinDuration time.Duration
	// Fault runs beside the workload and must leave every server it broke
	// running again before it returns.
	Fault func(ctx context.Context, r *Run) error
	// After runs once the workload has stopped, before the checks.
	After func(ctx context.Context, r *Run, v *Verdict) error
	// Inspect, in tests, sees the run after the checks, before teardown.
	Inspect func(ctx context.Context, r *Run, v *Verdict)
}

var scenarios = []Scenario{
	{Name: "redis-restart", Fault: func(ctx context.Context, r *Run) error {
		r.at(ctx, 0.35)
		if err := r.redis.Kill(); err != nil {
			return err
		}
		r.note("redis killed (no persistence)")
		sleep(ctx, time.Second)
		r.note("redis started empty")
		return r.redis.Start()
	}},
	{Name: "redis-flushall", Quick: true, Fault: func(ctx context.Context, r *Run) error {
		for _, f := range []float64{0.3, 0.65} {
			r.at(ctx, f)
			if err := r.redis.Client().FlushAll(ctx).Err(); err != nil {
				return err
			}
			r.note("FLUSHALL")
		}
		return nil
	}},
	{Name: "redis-evict", Fault: func(ctx context.Context, r *Run) error {
		// What eviction or an expiry does: keys vanish one by one, the
		// stock keys among them, while the sale goes on.
		for _, f := range []float64{0.25, 0.45, 0.65} {
			r.at(ctx, f)
			keys, err := r.redis.Client().Keys(ctx, "inv:*").Result()
			if err != nil {
				return err
			}
			gone := 0
			for _, k := range keys {
				if r.rng.IntN(2) == 0 {
					gone += int(r.redis.Client().Del(ctx, k).Val())
				}
			}
			r.note("evicted %d of %d keys", gone, len(keys))
		}
		return nil
	}},
	{Name: "redis-rdb-rollback", Quick: true, Fault: func(ctx context.Context, r *Run) error {
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
	{Name: "redis-failover", Fault: func(ctx context.Context, r *Run) error {
		replica, err := StartReplica(filepath.Join(r.dir, "replica"), freePort(), r.redis)
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
		r.proxy.Switch(replica.Addr())
		if err := r.redis.Kill(); err != nil {
			return err
		}
		r.note("primary killed; the lagging replica is the primary (REPLICAOF NO ONE)")
		return nil
	}},
	{Name: "kill-inventoryd", Instances: 2, Quick: true, Fault: func(ctx context.Context, r *Run) error {
		r.at(ctx, 0.1)
		kills := 0
		for time.Since(r.start) < time.Duration(0.85*float64(r.duration)) && ctx.Err() == nil {
			in := r.fleet[r.rng.IntN(len(r.fleet))]
			in.Kill()
			kills++
			sleep(ctx, time.Duration(200+r.rng.IntN(800))*time.Millisecond)
			if err := in.Start(ctx); err != nil {
				return err
			}
			sleep(ctx, time.Duration(500+r.rng.IntN(1500))*time.Millisecond)
		}
		r.note("%d SIGKILLs of a random instance mid-checkout and mid-payment, each restarted", kills)
		return nil
	}},
	{Name: "broker-stop", Instances: 2, MinDuration: 50 * time.Second, Fault: func(ctx context.Context, r *Run) error {
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
		// The backlog of 30 s of payments is being applied: kill a consumer mid-batch.
		sleep(ctx, 1500*time.Millisecond)
		in := r.fleet[r.rng.IntN(len(r.fleet))]
		in.Kill()
		r.note("%s (a consumer) killed while applying the backlog", in.Name)
		sleep(ctx, time.Second)
		return in.Start(ctx)
	}},
	{Name: "mariadb-restart", Fault: func(ctx context.Context, r *Run) error {
		for _, f := range []float64{0.3, 0.7} {
			r.at(ctx, f)
			if err := r.lab.db.Kill(); err != nil {
				return err
			}
			r.note("mariadb killed")
			sleep(ctx, 3*time.Second)
			if err := r.lab.db.Start(); err != nil {
				return err
			}
			r.note("mariadb started again (crash recovery)")
		}
		return nil
	}},
	{Name: "scale-out", Instances: 3, After: soldOutClearsEverywhere},
	{Name: "redis-cluster", Instances: 2, Cluster: true, Fault: func(ctx context.Context, r *Run) error {
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
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); sleep(ctx, 100*time.Millisecond) {
			a := r.client.doAt(ctx, in.URL(), http.MethodPost, "/v1/seckill/"+hotSKU+"/buy", map[string]string{"user_id": user}, r.client.buyerHeader(user))
			if got = a.Status; got == http.StatusCreated {
				r.witness.created(a, user)
				break
			}
		}
		if got != http.StatusCreated {
			v.problem("%s still answers %d 5s after the restock (stale sold-out flag)", in.Name, got)
		}
	}
	return nil
}

// abuse aims hostile traffic at the service beside the workload: replayed,
// forged, stale and unknown payment callbacks, the token API aimed at order
// reservations, and one buyer over the per-user limit from 50 connections
// with spoofed forwarding headers. Every probe that is not refused is a
// finding.
func abuse(ctx context.Context, r *Run) error {
	c, w := r.client, r.witness
	r.at(ctx, 0.3)
	var paid *orderSeen
	for paid == nil && ctx.Err() == nil {
		paid = w.pickPaid(r.rng)
		sleep(ctx, 100*time.Millisecond)
	}
	if paid == nil {
		return ctx.Err()
	}
	var pid string
	for p := range paid.Paid {
		pid = p
	}
	// 1,000 replays of a real, correctly signed callback, 50 at a time.
	body, h := c.callback(c.secrets.Payment, paid.ID, pid, time.Now())
	var replayed, notOrder atomic.Int64
	parallel(50, 20, func(rng *rand.Rand) {
		a := c.do(ctx, rng, http.MethodPost, "/v1/payments/callback", body, h)
		replayed.Add(1)
		if a.Status == http.StatusOK && a.str("id") != paid.ID {
			notOrder.Add(1)
		}
	}, r.seed)
	r.note("%d replays of %s's callback", replayed.Load(), paid.ID)

	// Pending orders of others, to aim forged callbacks and the token API at.
	var victims []*orderSeen
	w.mu.Lock()
	for _, o := range w.orders {
		if len(victims) < 50 {
			victims = append(victims, o)
		}
	}
	w.mu.Unlock()
	rng := rand.New(rand.NewPCG(r.seed, 99))
	probes := 0
	for _, o := range victims {
		forged, fh := c.callback("not-the-secret-"+o.ID, o.ID, "forged-"+o.ID, time.Now())
		stale, sh := c.callback(c.secrets.Payment, o.ID, "stale-"+o.ID, time.Now().Add(-time.Hour))
		unknown, uh := c.callback(c.secrets.Payment, "0190aaaa-bbbb-7ccc-8ddd-"+fmt.Sprintf("%012d", rng.IntN(1e9)), "unknown-"+o.ID, time.Now())
		for kind, req := range map[string]struct {
			body []byte
			h    http.Header
			want int
		}{"forged callback": {forged, fh, http.StatusUnauthorized}, "stale callback": {stale, sh, http.StatusUnauthorized},
			"callback for an unknown order": {unknown, uh, http.StatusNotFound}} {
			a := c.do(ctx, rng, http.MethodPost, "/v1/payments/callback", req.body, req.h)
			probes++
			if a.Status != req.want && !a.ambiguous() {
				w.notRefused(fmt.Sprintf("%s (%d)", kind, a.Status))
			}
		}
		for sku := range o.Items {
			for _, path := range []string{"/v1/stock/release", "/v1/stock/commit"} {
				a := c.do(ctx, rng, http.MethodPost, path, map[string]any{"sku": sku, "token": o.ID}, c.clientHeader())
				probes++
				if a.Status == http.StatusOK && (a.num("released") > 0 || a.num("committed") > 0) {
					w.notRefused("token API " + path + " on an order's reservation")
				}
			}
		}
	}
	r.note("%d forged/stale/unknown callbacks and token-API probes at %d orders", probes, len(victims))

	// One buyer, 50 connections, spoofed forwarding headers, over the limit.
	ref := fmt.Sprintf("restock-abuse-%d", r.seed)
	a := c.do(ctx, rng, http.MethodPost, "/v1/skus/"+hotSKU+"/adjust", map[string]any{"delta": 40, "reason": "restock", "reference": ref}, c.adminHeader())
	w.restocked(restock{SKU: hotSKU, Delta: 40, Ref: ref, Acked: a.Status == http.StatusOK})
	user := fmt.Sprintf("greedy-%d", r.seed)
	var won atomic.Int64
	parallel(50, 3, func(rng *rand.Rand) {
		own := newClient(c.secrets, c.urls, c.stats) // its own connections
		hdr := c.buyerHeader(user)
		hdr.Set("X-Forwarded-For", fmt.Sprintf("203.0.113.%d", rng.IntN(250)))
		hdr.Set("X-Real-IP", fmt.Sprintf("198.51.100.%d", rng.IntN(250)))
		a := own.do(ctx, rng, http.MethodPost, "/v1/seckill/"+hotSKU+"/buy", map[string]string{"user_id": user}, hdr)
		if a.Status == http.StatusCreated {
			won.Add(1)
			w.created(a, user)
		}
	}, r.seed+1)
	if won.Load() > hotLimit {
		w.notRefused(fmt.Sprintf("purchases beyond the per-user limit of %d (%d won)", hotLimit, won.Load()))
	}
	r.note("one buyer from 50 connections with spoofed XFF: %d of 150 purchases succeeded (limit %d)", won.Load(), hotLimit)
	if notOrder.Load() > 0 {
		w.notRefused(fmt.Sprintf("replayed callbacks answered with another order (%d)", notOrder.Load()))
	}
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
