package app

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/breaker"
	"github.com/acme/inventory/internal/webhooks"
	"github.com/acme/inventory/internal/webhooks/delivery"
	"github.com/acme/inventory/order"
)

// releaseLatency is how long after its deadline an order was released.
var releaseLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
	Name: "inventory_release_latency_seconds", Help: "Time from an order's deadline to its release.",
	Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
})

// registerDomainMetrics exposes the components' own counters, and gauges read
// from the database at scrape time.
func registerDomainMetrics(reg prometheus.Registerer, a *App) {
	type errer interface{ Err() error }
	deps := map[string]errer{"redis": a.redisBreaker, "database": a.dbBreaker}
	if a.redisShards != nil {
		deps["redis"] = a.redisShards // 1 while any shard's is open
		reg.MustRegister(shardsCollector{a.redisShards})
	}
	for name, b := range deps {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "inventory_dependency_circuit_open",
			Help:        "1 while the dependency's circuit breaker is open or half-open (requests that need it fail fast), 0 while closed; on a Redis Cluster, 1 while any shard's is.",
			ConstLabels: prometheus.Labels{"dependency": name}},
			func() float64 {
				if b.Err() != nil {
					return 1
				}
				return 0
			}))
	}
	counter := func(name, help string, f func() int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(f()) })
	}
	st := a.Stock.Stats()
	cs := a.Commits.Stats()
	reg.MustRegister(
		counter("inventory_stock_deducted_total", "Deductions that took units (Lua script result n >= 0).", st.Deducted.Load),
		counter("inventory_stock_insufficient_total", "Deductions refused for lack of stock (-2).", st.Insufficient.Load),
		counter("inventory_stock_unlimited_total", "Deductions of unlimited SKUs (-1).", st.Unlimited.Load),
		counter("inventory_stock_cold_inits_total", "Cold SKUs this node initialised from the database.", st.ColdInits.Load),
		counter("inventory_stock_init_waits_total", "Times this node waited for another's cold init.", st.InitWaits.Load),
		counter("inventory_stock_released_units_total", "Units given back in Redis (cancel, timeout, refund, release, undo).", st.Released.Load),
		counter("inventory_stock_realigns_total", "SKUs this node realigned from the database (Redis was found wrong).", st.Realigns.Load),
		counter("inventory_stock_admission_pipelines_total", "Pipelines this node sent admissions to Redis in.", st.Pipelines.Load),
		counter("inventory_stock_admissions_pipelined_total", "Admissions those pipelines carried (each its own script call).", st.Pipelined.Load),
		counter("inventory_mq_sent_total", "Stock messages the relay published.", a.relay.Sent.Load),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "inventory_relay_leader", Help: "1 on the node that leads the outbox relay now."},
			func() float64 {
				if a.relay.Leading.Load() {
					return 1
				}
				return 0
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "inventory_projector_leader", Help: "1 on the node that leads the lean sale's projector now."},
			func() float64 {
				if a.projector.Leading.Load() {
					return 1
				}
				return 0
			}),
		counter("inventory_projected_holds_total", "Holds of the lean sale this node's projector wrote the projection of.", a.projector.Projected),
		a.projector.Lag(),
		counter("inventory_mq_applied_total", "Stock operations applied to the database.", a.applier.Applied.Load),
		counter("inventory_mq_duplicates_total", "Stock operations delivered again and ignored.", a.applier.Duplicate.Load),
		counter("inventory_mq_anomalies_total", "Stock operations recorded as anomalies.", a.applier.Anomalies.Load),
		counter("inventory_orders_expired_total", "Orders this node expired.", a.timeouts.Expired.Load),
		counter("inventory_reservation_commits_total", "Group commits of reservations (database transactions).", cs.Commits.Load),
		counter("inventory_reservation_commit_requests_total", "Reservation requests those commits carried.", cs.Requests.Load),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "inventory_reservation_commit_seconds_total",
			Help: "Time spent in those commits (summed over concurrent ones)."},
			func() float64 { return time.Duration(cs.Nanos.Load()).Seconds() }),
	)
	for _, r := range delivery.Results {
		n := a.deliveries.Stats.Of(r)
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "inventory_webhook_deliveries_total",
			Help: "Webhook delivery attempts this node made, by result: delivered (2xx), failed (no answer in time, " +
				"no connection, not 2xx: retried) or refused (the target resolves to an address not allowed: retried).",
			ConstLabels: prometheus.Labels{"result": string(r)}}, func() float64 { return float64(n.Load()) }))
	}
	reg.MustRegister(&dbCollector{a: a}, releaseLatency, transitionsCollector{a.Orders}, webhookCollector{a.webhooks})
}

// webhookCollector reads each webhook subscription's oldest undelivered
// event from the database at scrape time (every node reports the same).
// The subscription label is bounded by what operators create with
// PUT /v1/webhooks/{id}: a handful, not a value per request.
type webhookCollector struct{ subs *webhooks.Service }

var oldestDesc = prometheus.NewDesc("inventory_webhook_oldest_undelivered_seconds",
	"Age of the oldest event a webhook subscription has not been delivered yet (0: none waiting).", []string{"subscription"}, nil)

func (c webhookCollector) Describe(ch chan<- *prometheus.Desc) { ch <- oldestDesc }

func (c webhookCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ids, err := c.subs.IDs(ctx)
	if err != nil {
		return
	}
	oldest, err := c.subs.Oldest(ctx)
	if err != nil {
		return
	}
	for _, id := range ids {
		age := 0.0
		if at, ok := oldest[id]; ok {
			age = max(0, time.Since(at).Seconds())
		}
		ch <- prometheus.MustNewConstMetric(oldestDesc, prometheus.GaugeValue, age, id)
	}
}

// dbCollector reads gauges from the database at scrape time. Each query
// reads live rows only, through an index (pending orders by status, live
// reservations by state, unapplied outbox rows by applied_at), so a scrape
// costs the same after a year of history as on the first day.
type dbCollector struct{ a *App }

var (
	pendingDesc = prometheus.NewDesc("inventory_orders_pending", "Orders waiting for payment (PENDING).", nil, nil)
	heldDesc    = prometheus.NewDesc("inventory_reservations_held", "Live reservations (HELD or COMMITTED) and their units.", []string{"what"}, nil)
	backlogDesc = prometheus.NewDesc("inventory_mq_backlog", "Stock operations written but not yet applied to the database.", nil, nil)
	lagDesc     = prometheus.NewDesc("inventory_mq_lag_seconds", "Age of the oldest stock operation not yet applied.", nil, nil)
)

// The scrape's queries (TestScrapeReadsLiveRowsOnly checks their plans).
const (
	pendingQuery = `SELECT COUNT(*) FROM orders WHERE status = 'PENDING'`
	heldQuery    = `SELECT COUNT(*) AS reservations, COALESCE(SUM(qty), 0) AS units
		FROM stock_reservations WHERE state IN ('HELD', 'COMMITTED')`
	backlogQuery = arbiter.BacklogQuery
)

func (c *dbCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- pendingDesc
	ch <- heldDesc
	ch <- backlogDesc
	ch <- lagDesc
}

func (c *dbCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	db := c.a.db.WithContext(ctx)
	var pending int64
	if err := db.Raw(pendingQuery).Scan(&pending).Error; err == nil {
		ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(pending))
	}
	var held struct{ Reservations, Units int64 }
	if err := db.Raw(heldQuery).Scan(&held).Error; err == nil {
		ch <- prometheus.MustNewConstMetric(heldDesc, prometheus.GaugeValue, float64(held.Reservations), "reservations")
		ch <- prometheus.MustNewConstMetric(heldDesc, prometheus.GaugeValue, float64(held.Units), "units")
	}
	if n, oldest, err := arbiter.OutboxOf(db).Backlog(); err == nil {
		ch <- prometheus.MustNewConstMetric(backlogDesc, prometheus.GaugeValue, float64(n))
		lag := 0.0
		if oldest != nil {
			lag = time.Since(*oldest).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, lag)
	}
}

// transitionsCollector counts the orders that reached each status on this
// node (PENDING: created), from memory.
type transitionsCollector struct{ orders *order.Service }

var transitionsDesc = prometheus.NewDesc("inventory_orders_total", "Orders that reached each status on this node (PENDING: created).", []string{"status"}, nil)

func (c transitionsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- transitionsDesc }

func (c transitionsCollector) Collect(ch chan<- prometheus.Metric) {
	for status, n := range c.orders.Transitions() {
		ch <- prometheus.MustNewConstMetric(transitionsDesc, prometheus.CounterValue, float64(n), string(status))
	}
}

// shardsCollector reports each Redis Cluster node's breaker (the nodes
// callers asked within breaker.ShardIdle), labelled with its address.
type shardsCollector struct{ shards *breaker.Shards }

var shardOpenDesc = prometheus.NewDesc("inventory_redis_shard_circuit_open",
	"1 while the circuit breaker of a Redis Cluster node is open or half-open (requests for its slots fail fast, the other nodes' still sell), 0 while closed.",
	[]string{"shard"}, nil)

func (c shardsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- shardOpenDesc }

func (c shardsCollector) Collect(ch chan<- prometheus.Metric) {
	for _, b := range c.shards.Breakers() {
		open := 0.0
		if b.Err() != nil {
			open = 1
		}
		ch <- prometheus.MustNewConstMetric(shardOpenDesc, prometheus.GaugeValue, open, b.Shard())
	}
}
