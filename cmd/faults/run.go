package main

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/testkit/faultnet"
	"github.com/acme/inventory/testkit/servers"
	"gorm.io/gorm"
)

// Service timings of every run: short, so timeouts, sweeps and realignment
// all happen many times inside one scenario.
const (
	orderTTL        = 3 * time.Second
	sweepInterval   = time.Second
	realignInterval = 2 * time.Second
)

// brokerHost is the loopback address the broker advertises, where its link
// listens (it binds 127.0.0.1 itself).
const brokerHost = "127.0.0.2"

// Lab is the private servers one `make faults` run owns: one MariaDB and
// one RocketMQ name server and broker shared by the scenarios (each gets
// its own database and topic), and the inventoryd binary under test. Each
// scenario starts its own Redis. The inventoryd processes reach every
// dependency through a link (links.go): the broker's is the lab's, the
// others are each scenario's.
type Lab struct {
	dir    string
	bin    string
	db     *servers.MariaDB
	mq     *servers.RocketMQ
	toxi   *faultnet.Toxiproxy
	broker *faultnet.Link // what the broker advertises: 127.0.0.2:port, to 127.0.0.1:port
	vizDir string         // where a failing history's visualization is written (beside the run's table)
	rel    *releases      // older releases built for a fleet to start on (Lab.release)

	cleanup func() // removes dir (unless kept)
}

func startLab(dir, bin string, logf func(string, ...any)) (*Lab, error) {
	lab := &Lab{dir: dir, bin: bin, toxi: faultnet.New(), rel: &releases{bins: map[string]string{}}}
	var err error
	t0 := time.Now()
	if lab.db, err = servers.StartMariaDB(filepath.Join(dir, "mariadb"), servers.FreePort()); err != nil {
		return nil, fmt.Errorf("mariadb: %w", err)
	}
	logf("mariadb up in %s", time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	ns, broker := servers.FreePort(), servers.FreePort(-2, 1)
	if lab.mq, err = servers.StartRocketMQ(filepath.Join(dir, "rocketmq"), ns, broker, brokerHost); err != nil {
		lab.Close()
		return nil, fmt.Errorf("rocketmq: %w", err)
	}
	// The broker tells the name server brokerHost:port, where this proxy
	// listens; it binds 127.0.0.1:port. Nothing dials the broker before a
	// scenario's migrate.
	if lab.broker, err = lab.toxi.Link("broker", net.JoinHostPort(brokerHost, strconv.Itoa(broker)), lab.mq.Broker()); err != nil {
		lab.Close()
		return nil, err
	}
	logf("rocketmq name server and broker up in %s", time.Since(t0).Round(time.Millisecond))
	return lab, nil
}

func (l *Lab) Close() {
	if l.broker != nil {
		l.broker.Close()
	}
	if l.mq != nil {
		l.mq.Close()
	}
	if l.db != nil {
		l.db.Close()
	}
	if l.cleanup != nil {
		l.cleanup()
	}
}

// Run is one scenario in progress.
type Run struct {
	lab      *Lab
	sc       Scenario
	seed     uint64
	rng      *rand.Rand // the fault injector's
	dir      string
	duration time.Duration
	start    time.Time

	redis   *servers.Redis            // single-node scenarios: the primary, behind its link
	links   map[string]*faultnet.Link // "mariadb", "redis" (single node) and "broker", as the fleet reaches them
	cluster *servers.RedisCluster
	env     []string
	fleet   []*Instance
	db      *sql.DB
	// outboxDB is db as GORM, through which the outbox's owner speaks.
	outboxDB *gorm.DB
	stats    *Stats
	hist     *History
	follow   *Followers
	client   *Client
	witness  *Witness
	closers  []func() // what a scenario started for itself (a replica)
	logf     func(string, ...any)

	mu       sync.Mutex
	notes    []string
	dark     *Dark     // the blackhole the fault made, if any
	phases   []Phase   // the stretches with a link slowed down
	takeover *Takeover // the consumer node killed for its queues' takeover, if any
	outage   *Outage   // projector-kill's: the holds due while no node projected

	hooks      *hookRun      // the run's webhook receivers, if the scenario has them (webhooks.go)
	camp       *campaignPlan // the run's campaign, if the scenario has one
	quiet      sync.RWMutex  // the campaign's quiet point (Workload.quiet)
	poolDrift  []string      // quiet points where Redis's pool disagreed with the database
	poolHidden int64         // units of the pool Redis hid below the database there
}

// note records what the fault injector did, with the time into the run.
func (r *Run) note(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notes = append(r.notes, fmt.Sprintf("%5.1fs %s", time.Since(r.start).Seconds(), fmt.Sprintf(format, args...)))
}

// at sleeps until fraction f of the workload's duration has passed.
func (r *Run) at(ctx context.Context, f float64) {
	sleep(ctx, time.Until(r.start.Add(time.Duration(f*float64(r.duration)))))
}

// runScenario sets a scenario up from nothing, runs the workload with its
// fault, lets everything settle and checks the final state.
func runScenario(ctx context.Context, lab *Lab, sc Scenario, seed uint64, duration time.Duration, logf func(string, ...any)) (v *Verdict, err error) {
	if sc.MinDuration > duration {
		duration = sc.MinDuration
	}
	r := &Run{lab: lab, sc: sc, seed: seed, rng: rand.New(rand.NewPCG(seed, 0)), duration: duration,
		dir: filepath.Join(lab.dir, sc.Name), stats: &Stats{}, hist: newHistory(), witness: newWitness(), logf: logf,
		links: map[string]*faultnet.Link{"broker": lab.broker}}
	v = &Verdict{Scenario: sc.Name}
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return nil, err
	}
	followCtx, stopFollowing := context.WithCancel(ctx)
	defer stopFollowing()
	r.follow = &Followers{ctx: followCtx}
	defer r.teardown()
	if err := r.setup(ctx); err != nil {
		return nil, fmt.Errorf("%s: setup: %w", sc.Name, err)
	}
	if sc.Campaign {
		if err := r.putCampaign(ctx); err != nil {
			return nil, fmt.Errorf("%s: setup: %w", sc.Name, err)
		}
	}
	if sc.Before != nil {
		if err := sc.Before(ctx, r); err != nil {
			return nil, fmt.Errorf("%s: setup: %w", sc.Name, err)
		}
	}
	logf("%s: %d instance(s) up; workload for %s", sc.Name, len(r.fleet), duration)

	wctx, stop := context.WithCancel(ctx)
	lateCtx, stopLate := context.WithTimeout(ctx, duration+orderTTL+10*time.Second)
	defer stopLate()
	wl := &Workload{c: r.client, w: r.witness, seed: seed, ttl: orderTTL, lateCtx: lateCtx, camp: r.camp, quiet: &r.quiet}
	r.start = time.Now()
	wl.Run(wctx)
	faultErr := make(chan error, 1)
	go func() {
		if sc.Fault == nil {
			faultErr <- nil
			return
		}
		faultErr <- sc.Fault(ctx, r)
	}()
	sleep(ctx, duration)
	stop()
	if err := <-faultErr; err != nil {
		return nil, fmt.Errorf("%s: fault: %w", sc.Name, err)
	}
	wl.Wait()
	r.awaitFollowers(stopFollowing)
	logf("%s: workload done (%d operations); settling", sc.Name, r.stats.ops)

	for _, in := range r.fleet { // every process runs again before the checks
		if !in.Running() {
			if err := in.Start(ctx); err != nil {
				return nil, err
			}
		}
	}
	if sc.After != nil {
		if err := sc.After(ctx, r, v); err != nil {
			return nil, fmt.Errorf("%s: %w", sc.Name, err)
		}
	}
	if err := r.settleCountShortages(ctx, v); err != nil { // counts.go
		return nil, fmt.Errorf("%s: count: %w", sc.Name, err)
	}
	v.Drift, err = r.settle(ctx)
	if err != nil {
		return nil, err
	}
	if err := check(ctx, r.db, arbiter.OutboxOf(r.outboxDB.WithContext(ctx)), r.redisAvailable, r.witness, orderTTL+sweepInterval+2*time.Second, v); err != nil {
		return nil, fmt.Errorf("%s: check: %w", sc.Name, err)
	}
	if r.camp != nil {
		if err := r.checkCampaign(ctx, v); err != nil {
			return nil, fmt.Errorf("%s: check: %w", sc.Name, err)
		}
	}
	if err := r.checkHistory(ctx, v); err != nil {
		return nil, fmt.Errorf("%s: history: %w", sc.Name, err)
	}
	for kind, n := range r.witness.refused {
		v.problem("abuse: %d %s accepted", n, kind)
	}
	r.note("settled: %d of %d units stocked sold; %d orders acknowledged", v.Sold, v.Stocked, len(r.witness.orders))
	if u := r.stats.unanswered(); u != "" {
		r.note("requests without an answer: %s", u)
	}
	v.Ops, v.FiveXX = r.stats.ops, r.stats.fiveXX()
	for _, f := range r.stats.failures() {
		v.problem("answered %s%s", f.text, r.loggedCause(f.requestID))
	}
	r.mu.Lock()
	dark, phases, takeover := r.dark, r.phases, r.takeover
	r.mu.Unlock()
	v.Timing, v.Timed = measure(r.stats.snapshot(), dark, phases), sc.Timed
	v.Timing.Takeover = takeover
	if v.Timed {
		v.judge()
	}
	v.judgeTakeover() // a verdict wherever it is measured
	if sc.Inspect != nil {
		sc.Inspect(ctx, r, v)
	}
	v.Notes = r.notes
	return v, nil
}

// awaitFollowers waits until every order the run placed has been seen
// leaving PENDING, for as long as the longest hold and a sweep take and a
// margin for a dependency that is still coming back; then it stops the
// followers that are left.
func (r *Run) awaitFollowers(stop context.CancelFunc) {
	done := make(chan struct{})
	go func() { r.follow.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(campaignHold + sweepInterval + 10*time.Second):
		r.note("orders still PENDING after the followers' wait; their timeouts are open in the history")
	}
	stop()
	<-done
}

// checkHistory checks the run's history for linearizability, SKU by SKU
// (linearizable.go), once what the database tells of the unknown outcomes
// is settled (resolve.go).
func (r *Run) checkHistory(ctx context.Context, v *Verdict) error {
	stale := r.sc.Stale
	if stale == 0 {
		stale = strictStale
	}
	ops, never, err := resolveUnknowns(ctx, r.db, r.hist.snapshot(), r.hist.base)
	if err != nil {
		return err
	}
	commits, err := loadCommits(ctx, r.db, r.hist.base)
	if err != nil {
		return err
	}
	h := savedHistory{Base: r.hist.base, Stale: stale, Ops: ops, Commits: commits, Never: never}
	if err := writeHistory(filepath.Join(r.dir, "history.json"), h); err != nil {
		r.logf("%s: writing the history: %v", r.sc.Name, err)
	}
	v.History = checkHistory(ops, histConfig{Stale: stale, OrderHold: orderTTL, CampaignHold: campaignHold,
		Timeout: historyTimeout, Dir: r.lab.vizDir, Base: r.hist.base, Name: r.sc.Name, Commits: commits, Never: never})
	if !v.History.passed() {
		// Kept beside the visualization, to be replayed (-replay).
		saved := filepath.Join(r.lab.vizDir, "history-"+r.sc.Name+".json")
		if err := writeHistory(saved, h); err == nil {
			v.History.Saved = saved
		}
		// And the nodes' logs, which say what the service knew it left
		// wrong (a follow-up that failed, a realign).
		logs, _ := filepath.Glob(filepath.Join(r.dir, "inventoryd-*.log"))
		for _, l := range logs {
			if err := copyFile(l, filepath.Join(r.lab.vizDir, r.sc.Name+"-"+filepath.Base(l))); err != nil {
				r.logf("%s: keeping %s: %v", r.sc.Name, l, err)
			}
		}
	}
	return nil
}

// loggedCause is what the nodes logged under request id (the cause of a
// 500, which its answer does not say), as a suffix for the problem that
// names the answer: the log is gone once the run's directory is.
func (r *Run) loggedCause(id string) string {
	if id == "" {
		return ""
	}
	logs, _ := filepath.Glob(filepath.Join(r.dir, "inventoryd-*.log"))
	var lines []string
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(b)) {
			if strings.Contains(line, id) {
				lines = append(lines, filepath.Base(l)+": "+strings.TrimSpace(line))
			}
		}
	}
	if len(lines) == 0 {
		return ""
	}
	return "; logged: " + strings.Join(lines, " | ")
}

// copyFile copies the file at from to to.
func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o644)
}

// strictStale is how far a refusal may lag a give-back in a scenario with
// no fault that leaves Redis behind the database: the give-back reaches
// Redis, and the sold-out flags of every node, a moment after the
// database's commit (docs/faults.md, "What the check proves and what it relaxes").
const strictStale = 250 * time.Millisecond

// historyTimeout bounds each SKU's check: one that does not end in time
// fails the scenario.
const historyTimeout = 60 * time.Second

// resourceName names the run's database and its RocketMQ topic: each
// scenario has its own.
func (r *Run) resourceName() string { return "faults_" + strings.ReplaceAll(r.sc.Name, "-", "_") }

func (r *Run) setup(ctx context.Context) error {
	var err error
	if r.sc.Cluster {
		ports := [3]int{servers.FreePort(10000), servers.FreePort(10000), servers.FreePort(10000)}
		if r.cluster, err = servers.StartRedisCluster(filepath.Join(r.dir, "redis-cluster"), ports); err != nil {
			return err
		}
		r.env = append(r.env, "INVENTORY_REDIS_CLUSTER="+strings.Join(r.cluster.Addrs(), ","))
	} else {
		if r.redis, err = servers.StartRedis(filepath.Join(r.dir, "redis"), servers.FreePort()); err != nil {
			return err
		}
		if r.links["redis"], err = r.lab.toxi.Link("redis-"+r.sc.Name, "127.0.0.1:"+strconv.Itoa(servers.FreePort()), r.redis.Addr()); err != nil {
			return err
		}
		r.env = append(r.env, "INVENTORY_REDIS_URL=redis://"+r.links["redis"].Addr()+"/0")
	}
	database := r.resourceName()
	if err := r.lab.db.CreateDatabase(ctx, database); err != nil {
		return err
	}
	if r.links["mariadb"], err = r.lab.toxi.Link("mariadb-"+r.sc.Name, "127.0.0.1:"+strconv.Itoa(servers.FreePort()), r.lab.db.Addr()); err != nil {
		return err
	}
	if r.db, err = sql.Open("mysql", r.lab.db.DSN(database)); err != nil {
		return err
	}
	r.outboxDB = outboxDB(r.db)
	secrets := newSecrets(rand.New(rand.NewPCG(r.seed, 1)))
	r.env = append(r.env, secrets.env()...)
	r.env = append(r.env,
		"INVENTORY_MYSQL_DSN="+r.lab.db.DSNVia(r.links["mariadb"].Addr(), database),
		"INVENTORY_ROCKETMQ_NAMESRV="+r.lab.mq.NameServer(),
		"INVENTORY_ROCKETMQ_TOPIC="+r.resourceName(),
		"INVENTORY_ORDER_TTL="+orderTTL.String(),
		"INVENTORY_SWEEP_INTERVAL="+sweepInterval.String(),
		"INVENTORY_REALIGN_INTERVAL="+realignInterval.String(),
		"INVENTORY_SECKILL_RATE=1000000", // the driver is one address; the abuse scenario tests the per-user limit
		"INVENTORY_SHUTDOWN_TIMEOUT=5s",
	)
	r.env = append(r.env, r.sc.Env...)
	bin := r.lab.bin
	if r.sc.From != "" { // the fleet starts on an older release, which migrates
		if bin, err = r.lab.release(ctx, r.sc.From); err != nil {
			return err
		}
	}
	if out, errOut, code, err := runCommand(ctx, bin, r.env, "migrate"); err != nil || code != 0 {
		return fmt.Errorf("inventoryd migrate: exit %d %v: %s %s", code, err, out, errOut)
	}
	var urls []string
	for i := 0; i < max(1, r.sc.Instances); i++ {
		in := &Instance{Name: fmt.Sprintf("%s-%d", r.sc.Name, i), Port: servers.FreePort(), bin: bin, env: r.env,
			log: filepath.Join(r.dir, fmt.Sprintf("inventoryd-%d.log", i))}
		if err := in.Start(ctx); err != nil {
			return err
		}
		r.fleet = append(r.fleet, in)
		urls = append(urls, in.URL())
	}
	r.client = newClient(secrets, urls, r.stats, r.hist, r.follow)
	for sku, n := range initialStock {
		limit := 0
		if sku == hotSKU {
			limit = hotLimit
		}
		a := r.client.doAt(ctx, urls[0], http.MethodPut, "/v1/skus/"+sku, map[string]any{"stock": n, "per_user_limit": limit}, r.client.adminHeader())
		if a.Status != http.StatusOK {
			return fmt.Errorf("PUT /v1/skus/%s: %d %v %v", sku, a.Status, a.Body, a.Err)
		}
	}
	return nil
}

// settle waits until every instance is ready, nothing is pending past its
// deadline, every stock operation is applied and reconcile is clean (the
// service realigns Redis itself), or three minutes pass (a consumer group
// change costs the sync about a minute: see docs/faults.md). It returns what
// reconcile said last: "clean", or its exit status and report.
func (r *Run) settle(ctx context.Context) (string, error) {
	deadline := time.Now().Add(3 * time.Minute)
	nextLog := time.Now().Add(10 * time.Second)
	for _, in := range r.fleet {
		for !ready(in.URL()) {
			if time.Now().After(deadline) {
				return "", fmt.Errorf("%s not ready after the run (log %s)", in.Name, in.log)
			}
			sleep(ctx, 200*time.Millisecond)
		}
	}
	drift := "not run"
	for {
		var pending, held, committed, unprojected int64
		err := r.db.QueryRowContext(ctx, `SELECT
			(SELECT COUNT(*) FROM orders WHERE status = 'PENDING'),
			(SELECT COUNT(*) FROM stock_reservations WHERE state = 'HELD'),
			(SELECT COUNT(*) FROM stock_reservations WHERE state = 'COMMITTED'),
			(`+arbiter.BacklogSQL+`)`).Scan(&pending, &held, &committed, &unprojected)
		if err != nil {
			return "", err
		}
		outbox, err := arbiter.OutboxOf(r.outboxDB.WithContext(ctx)).Counts()
		if err != nil {
			return "", err
		}
		unapplied := outbox.Unapplied
		if pending+held+committed+unapplied+unprojected == 0 {
			out, _, code, err := runCommand(ctx, r.lab.bin, r.env, "reconcile")
			if err != nil {
				return "", fmt.Errorf("reconcile: %w", err)
			}
			if code == 0 {
				return "clean", nil
			}
			drift = fmt.Sprintf("exit %d: %d SKUs (%s)", code, strings.Count(out, "\n"), strings.TrimSpace(headLine(out)))
		} else {
			drift = fmt.Sprintf("not settled: %d pending orders, %d held, %d committed, %d unapplied, %d SKUs or campaigns with holds to project", pending, held, committed, unapplied, unprojected)
		}
		if time.Now().After(deadline) {
			return drift, nil
		}
		if time.Now().After(nextLog) {
			unsent := outbox.Unsent
			r.logf("%s: waiting: %s (%d not yet sent to the broker)", r.sc.Name, drift, unsent)
			nextLog = time.Now().Add(10 * time.Second)
		}
		sleep(ctx, 500*time.Millisecond)
	}
}

// unapplied is the number of stock operations not yet applied (-1 when the
// database does not answer).
func (r *Run) unapplied(ctx context.Context) int64 {
	c, err := arbiter.OutboxOf(r.outboxDB.WithContext(ctx)).Counts()
	if err != nil {
		return -1
	}
	return c.Unapplied
}

// redisAvailable reads what Redis holds for sku through the API.
func (r *Run) redisAvailable(ctx context.Context, sku string) (int64, error) {
	a := r.client.doAt(ctx, r.fleet[0].URL(), http.MethodGet, "/v1/skus/"+sku, nil, r.client.clientHeader())
	if a.Status != http.StatusOK {
		return 0, fmt.Errorf("GET /v1/skus/%s: %d %v %v", sku, a.Status, a.Body, a.Err)
	}
	return a.num("redis_available"), nil
}

func headLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

func (r *Run) teardown() {
	for _, in := range r.fleet {
		in.Stop()
	}
	if r.db != nil {
		r.db.Close()
	}
	for name, l := range r.links {
		if name == "broker" {
			_ = l.Heal() // the lab's: it stays
		} else {
			l.Close()
		}
	}
	if r.redis != nil {
		r.redis.Close()
	}
	if r.cluster != nil {
		r.cluster.Close()
	}
	for _, c := range r.closers {
		c()
	}
}
