// Package app wires the service together: configuration, dependencies, the
// HTTP server, background jobs, and their shutdown order.
package app

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/glebarez/sqlite"
	"github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/breaker"
	"github.com/acme/inventory/internal/campaign"
	"github.com/acme/inventory/internal/catalog"
	"github.com/acme/inventory/internal/counts"
	"github.com/acme/inventory/internal/events"
	"github.com/acme/inventory/internal/expiry"
	"github.com/acme/inventory/internal/followup"
	"github.com/acme/inventory/internal/groupcommit"
	"github.com/acme/inventory/internal/httpapi"
	"github.com/acme/inventory/internal/identity"
	"github.com/acme/inventory/internal/listing"
	"github.com/acme/inventory/internal/maintenance"
	"github.com/acme/inventory/internal/mysqlconn"
	"github.com/acme/inventory/internal/projection"
	"github.com/acme/inventory/internal/stocksync"
	"github.com/acme/inventory/internal/tokens"
	"github.com/acme/inventory/internal/webhooks"
	"github.com/acme/inventory/internal/webhooks/delivery"
	"github.com/acme/inventory/migrations"
	"github.com/acme/inventory/mq"
	"github.com/acme/inventory/order"
	"github.com/acme/inventory/stock"
)

// DefaultSoldOutTTL is how long a node's sold-out flag lives when the
// configuration does not say (INVENTORY_SOLDOUT_TTL).
const DefaultSoldOutTTL = 2 * time.Second

// App is one running inventoryd.
type App struct {
	Cfg Config
	log *slog.Logger

	rdb     redis.UniversalClient
	db      *gorm.DB
	sqlDB   *sql.DB
	mini    *miniredis.Miniredis
	multiDB *sql.DB  // several statements per query (real mode): an order's extension, one round trip
	multi   *gorm.DB // db on multiDB, behind the database's breaker
	memq    *mq.Memory
	Stock   *stock.Store
	Orders  *order.Service
	Catalog *catalog.Catalog
	// Counts applies stock counts.
	Counts *counts.Service
	Tokens *tokens.Service
	// Campaigns runs the flash-sale campaigns.
	Campaigns *campaign.Service
	// Commits is the group commit that orders and token reservations share.
	Commits *groupcommit.Writer
	// Reconciler compares and repairs Redis and the database (reconcile).
	Reconciler *maintenance.Reconciler
	relay      *stocksync.Relay
	applier    *stocksync.Applier
	timeouts   *expiry.Timeouts
	realigner  *maintenance.Realigner
	retention  *maintenance.Retention
	events     *events.Job
	projector  *projection.Job
	deliveries *delivery.Job
	webhooks   *webhooks.Service
	producer   mq.Producer
	consumer   mq.Consumer
	soldOut    *httpapi.SoldOut
	server     *httpapi.Server

	// The breakers guard Redis and the database (in real mode: the
	// embedded stand-ins live in the process and are never cut off). On a
	// Redis Cluster, redisShards has a breaker per node instead, so one
	// node's trouble refuses only the requests that need that node;
	// redisBreaker is then unused.
	redisBreaker, dbBreaker *breaker.Breaker
	redisShards             *breaker.Shards

	httpSrv *http.Server
	ln      net.Listener
	done    chan error
	stop    context.CancelFunc
	bg      sync.WaitGroup
}

// New connects to the configured servers (or starts the embedded stand-ins),
// and builds every component. It starts nothing in the background.
func New(ctx context.Context, cfg Config, log *slog.Logger) (_ *App, err error) {
	a := &App{Cfg: cfg, log: log, done: make(chan error, 1)}
	a.newBreakers()
	defer func() {
		if err != nil {
			a.closeClients()
		}
	}()
	if cfg.Embedded() {
		err = a.openEmbedded(ctx)
	} else {
		err = a.openReal(ctx)
	}
	if err != nil {
		return nil, err
	}

	a.soldOut = httpapi.NewSoldOut(cmp.Or(cfg.SoldOutTTL, DefaultSoldOutTTL), nil)
	a.Stock, err = stock.NewStore(a.rdb, stock.Config{
		Init:         arbiter.InitFunc(a.db),
		InitCampaign: campaign.InitFunc(a.db),
		TokenTTL:     cfg.OrderTTL + time.Minute,
		Logger:       log,
		OnStockBack:  a.publishStockBack,
		// A campaign's units came back: its sold-out flag is cleared on
		// every node as a SKU's is (campaign.SoldOutKey never names a SKU).
		OnCampaignBack: func(c stock.Campaign) { a.publishStockBack(campaign.SoldOutKey(c.ID)) },
	})
	if err != nil {
		return nil, err
	}
	a.relay = stocksync.NewRelay(a.db, a.producer, a.Stock.Locker(), stocksync.RelayConfig{Interval: 100 * time.Millisecond, Logger: log})
	a.applier = stocksync.NewApplier(a.db, log)
	a.Commits = groupcommit.New(a.db)
	a.Orders = order.NewService(a.db, a.Stock, order.Config{
		TTL: cfg.OrderTTL, MaxHold: cfg.MaxHold, Logger: log, OnOutbox: a.relay.Wake, Writer: a.Commits, MultiStatements: a.multi,
		Lean: cfg.LeanSale, LeanCampaigns: cfg.LeanSale && cfg.LeanCampaigns,
		OnExpired:  func(late time.Duration) { releaseLatency.Observe(late.Seconds()) },
		OnCreated:  func(ctx context.Context, o *order.Order) { a.timeouts.Schedule(ctx, o.ID, o.ExpiresAt) },
		OnFinished: func(ctx context.Context, o *order.Order) { a.timeouts.Unschedule(ctx, o.ID) },
		OnExtended: func(ctx context.Context, id string, deadline time.Time) { a.timeouts.Schedule(ctx, id, deadline) },
	})
	// An admission can still be in flight for a request's deadline and its
	// follow-ups' grace: the realign leaves a pool behind the database alone
	// that long, and a token admitted longer ago that the database does not
	// know was admitted by a node that died.
	deadline := cfg.RequestTimeout
	if deadline == 0 {
		deadline = httpapi.DefaultRequestTimeout
	}
	inFlight := deadline + stock.FollowUpGrace + 500*time.Millisecond
	a.Tokens = tokens.New(a.db, a.Stock, a.Commits, tokens.Config{TTL: cfg.OrderTTL, MaxHold: cfg.MaxHold, Logger: log,
		OnOutbox: a.relay.Wake, InFlight: inFlight, Lean: cfg.LeanSale})
	a.timeouts, err = expiry.NewTimeouts(a.Orders, a.rdb, expiry.TimeoutConfig{Logger: log, SweepInterval: cfg.SweepInterval,
		Locker: a.Stock.Locker(), Holds: a.Tokens})
	if err != nil {
		return nil, err
	}
	a.Catalog = catalog.New(a.db, a.Stock, log)
	a.Counts = counts.New(a.db, a.Stock, counts.Config{Retention: cfg.Retention, Logger: log})
	a.Campaigns = campaign.New(a.db, a.Stock, a.Orders, campaign.Config{Logger: log})
	a.Reconciler = maintenance.NewReconciler(a.db, a.Stock, log).WithSettle(inFlight)
	a.realigner = maintenance.NewRealigner(a.Reconciler, a.Stock.Locker(), cfg.RealignInterval, log)
	a.retention = maintenance.NewRetention(a.db, a.Stock.Locker(), maintenance.RetentionConfig{
		Horizon: cfg.Retention, EventHorizon: cfg.EventRetention, Interval: cfg.RetentionInterval, Logger: log,
	})
	a.events = events.New(a.db, a.Stock.Locker(), events.Config{Logger: log})
	a.projector = projection.New(a.db, a.Stock.Locker(), projection.Config{Logger: log})
	a.webhooks = webhooks.New(a.db, webhooks.Policy{AllowHTTP: cfg.WebhookAllowHTTP, AllowPrivate: cfg.WebhookAllowPrivate}, log)
	a.deliveries = delivery.New(a.webhooks, a.Stock.Locker(), delivery.Config{
		Timeout: cfg.WebhookTimeout, MaxBackoff: cfg.WebhookMaxBackoff, FailingAfter: cfg.WebhookFailingAfter, Logger: log,
	})
	a.applier.OnApplied = followup.Redis{Stock: a.Stock, Log: log}.Apply
	if a.memq != nil {
		a.consumer = a.memq.Consumer(a.applier.Handle, 64, 200*time.Millisecond)
	} else {
		a.consumer, err = mq.NewRocketConsumer(mq.RocketMQConfig{
			NameServers: cfg.RocketMQNamesrv, Topic: cfg.RocketMQTopic, Group: cfg.RocketMQTopic + "_apply",
			Instance: a.instance("consumer"), BatchSize: 64,
		}, a.applier.Handle)
		if err != nil {
			return nil, err
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerDomainMetrics(reg, a)
	buyers, err := identity.NewVerifier(a.Cfg.BuyerKey, identity.Options{
		Audience: cfg.BuyerTokenAudience, Issuer: cfg.BuyerTokenIssuer, MaxTTL: cfg.BuyerTokenMaxTTL,
	})
	if err != nil {
		return nil, fmt.Errorf("config: INVENTORY_BUYER_KEY: %w", err)
	}
	proxies, err := httpapi.ParseCIDRs(cfg.TrustedProxies)
	if err != nil {
		return nil, fmt.Errorf("config: INVENTORY_TRUSTED_PROXIES: %w", err)
	}
	a.server = httpapi.New(httpapi.Config{
		AdminToken: a.Cfg.AdminToken, ClientTokens: a.Cfg.ClientTokens, Buyers: buyers,
		PaymentSecret: a.Cfg.PaymentSecret, TrustedProxies: proxies, SeckillRate: cfg.SeckillRate, RequestTimeout: cfg.RequestTimeout,
		Ready: a.ready, Degraded: a.degraded, Gatherer: reg, Metrics: httpapi.NewMetrics(reg), Logger: log,
	}, httpapi.Services{Orders: a.Orders, Catalog: a.Catalog, Tokens: a.Tokens, Listing: listing.New(a.db), Campaigns: a.Campaigns,
		Webhooks: a.webhooks, OnWebhookPut: a.deliveries.Wake, Counts: a.Counts}, a.soldOut)
	return a, nil
}

func (a *App) instance(role string) string {
	if a.Cfg.InstanceName != "" {
		return a.Cfg.InstanceName + "_" + role
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s_%d_%s", host, os.Getpid(), role)
}

// OpenStores connects to Redis and the database only and builds the stock
// store and the catalog: what reconcile needs (no broker, no secrets).
// Close it with Close.
func OpenStores(ctx context.Context, cfg Config, log *slog.Logger) (_ *App, err error) {
	a := &App{Cfg: cfg, log: log, soldOut: httpapi.NewSoldOut(cmp.Or(cfg.SoldOutTTL, DefaultSoldOutTTL), nil)}
	a.newBreakers()
	defer func() {
		if err != nil {
			a.closeClients()
		}
	}()
	if err := a.openStores(ctx); err != nil {
		return nil, err
	}
	a.Stock, err = stock.NewStore(a.rdb, stock.Config{
		Init: arbiter.InitFunc(a.db), InitCampaign: campaign.InitFunc(a.db), TokenTTL: cfg.OrderTTL + time.Minute, Logger: log,
		OnStockBack: a.publishStockBack,
	})
	if err != nil {
		return nil, err
	}
	a.Catalog = catalog.New(a.db, a.Stock, log)
	a.Reconciler = maintenance.NewReconciler(a.db, a.Stock, log)
	return a, nil
}

// Close closes what OpenStores opened.
func (a *App) Close() { a.closeClients() }

func (a *App) openReal(ctx context.Context) error {
	if err := a.openStores(ctx); err != nil {
		return err
	}
	// A fresh broker has no topic: create it rather than fail to consume.
	if err := mq.EnsureServiceTopic(ctx, a.Cfg.RocketMQNamesrv, a.Cfg.RocketMQTopic); err != nil {
		return err
	}
	var err error
	a.producer, err = mq.NewRocketProducer(mq.RocketMQConfig{
		NameServers: a.Cfg.RocketMQNamesrv, Topic: a.Cfg.RocketMQTopic, Group: a.Cfg.RocketMQTopic + "_relay",
		Instance: a.instance("producer"),
	})
	return err
}

// openStores connects to Redis and the database, each behind its circuit
// breaker and with bounded network waits: every command and statement ends
// with its request's deadline (go-redis reads the context's deadline;
// the MySQL driver closes a connection whose context ended), and the
// driver-level timeouts bound what no context does.
func (a *App) openStores(ctx context.Context) error {
	if len(a.Cfg.RedisCluster) > 0 {
		cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: a.Cfg.RedisCluster, PoolSize: 256,
			DialTimeout: redisTimeout, ReadTimeout: redisTimeout, WriteTimeout: redisTimeout, PoolTimeout: redisTimeout,
			ContextTimeoutEnabled: true})
		a.redisShards = breaker.RedisCluster(cluster, "redis", breaker.Settings{OnChange: a.breakerChanged})
		a.rdb = cluster
	} else {
		opt, err := redis.ParseURL(a.Cfg.RedisURL)
		if err != nil {
			return fmt.Errorf("INVENTORY_REDIS_URL: %w", err)
		}
		opt.PoolSize = 256
		opt.DialTimeout = cmp.Or(opt.DialTimeout, redisTimeout)
		opt.ReadTimeout = cmp.Or(opt.ReadTimeout, redisTimeout)
		opt.WriteTimeout = cmp.Or(opt.WriteTimeout, redisTimeout)
		opt.PoolTimeout = cmp.Or(opt.PoolTimeout, redisTimeout)
		opt.ContextTimeoutEnabled = true
		a.rdb = redis.NewClient(opt)
		a.rdb.AddHook(a.redisBreaker.RedisHook())
	}
	mc, err := mysql.ParseDSN(a.Cfg.MySQLDSN)
	if err != nil {
		return fmt.Errorf("INVENTORY_MYSQL_DSN: %w", err)
	}
	if err := mysqlconn.Prepare(ctx, mc); err != nil {
		return err
	}
	if err := mysqlconn.Serving(ctx, mc); err != nil {
		return err
	}
	connector, err := mysql.NewConnector(mc)
	if err != nil {
		return fmt.Errorf("INVENTORY_MYSQL_DSN: %w", err)
	}
	a.sqlDB = sql.OpenDB(connector)
	a.sqlDB.SetMaxOpenConns(64)
	a.sqlDB.SetMaxIdleConns(64)
	a.db, err = gorm.Open(gormmysql.New(gormmysql.Config{Conn: a.dbBreaker.ConnPool(a.sqlDB)}),
		&gorm.Config{Logger: logger.Discard, TranslateError: true})
	if err != nil {
		return fmt.Errorf("mysql: %w", err)
	}
	// The same sessions, several statements per query: only the fixed
	// texts of the paths that must cost one round trip go there.
	if a.multiDB, err = mysqlconn.MultiStatements(mc, multiConns); err != nil {
		return fmt.Errorf("mysql: %w", err)
	}
	a.multi = order.OnPool(a.db, a.dbBreaker.ConnPool(a.multiDB))
	return nil
}

// multiConns bounds the multi-statement pool (an extension holds a
// connection for one round trip).
const multiConns = 16

// redisTimeout bounds each network wait of a Redis command (dial, read,
// write, a free connection) where the URL sets none: the backstop beneath
// the request deadline, for the background jobs.
const redisTimeout = time.Second

// newBreakers makes the breakers of Redis and the database; each probes
// its dependency with a ping once it has been open a while.
func (a *App) newBreakers() {
	a.redisBreaker = breaker.New("redis", breaker.Settings{OnChange: a.breakerChanged,
		Probe: func(ctx context.Context) error { return a.rdb.Ping(ctx).Err() }})
	a.dbBreaker = breaker.New("database", breaker.Settings{OnChange: a.breakerChanged,
		Probe: func(ctx context.Context) error { return a.sqlDB.PingContext(ctx) }})
}

// breakerChanged logs a dependency's breaker opening and closing.
func (a *App) breakerChanged(dependency, from, to string) {
	switch to {
	case "open":
		a.log.Warn("dependency unreachable: failing fast until a probe succeeds", "dependency", dependency, "from", from)
	case "closed":
		a.log.Info("dependency reachable again", "dependency", dependency)
	}
}

// openEmbedded starts the in-process stand-ins: miniredis (it runs the same
// Lua; TTLs follow the wall clock), SQLite in memory behind one connection,
// and the in-process ordered queue. Secrets not given are generated.
func (a *App) openEmbedded(ctx context.Context) error {
	a.mini = miniredis.NewMiniRedis()
	a.mini.ClockTTL(true)
	if err := a.mini.StartAddr("127.0.0.1:0"); err != nil {
		return fmt.Errorf("embedded redis: %w", err)
	}
	a.rdb = redis.NewClient(&redis.Options{Addr: a.mini.Addr(), PoolSize: 64})
	var err error
	// A name of its own: two embedded apps in one process must not share a database.
	a.db, err = gorm.Open(sqlite.Open("file:inventory-"+randomSecret()+"?mode=memory&cache=shared"),
		&gorm.Config{Logger: logger.Discard, TranslateError: true})
	if err != nil {
		return fmt.Errorf("embedded sql: %w", err)
	}
	if a.sqlDB, err = a.db.DB(); err != nil {
		return err
	}
	a.sqlDB.SetMaxOpenConns(1) // SQLite has one writer; one connection serialises every transaction
	a.sqlDB.SetMaxIdleConns(1) // and it must stay open: the in-memory database lives with it
	if err := migrations.Up(ctx, a.sqlDB, migrations.SQLite); err != nil {
		return err
	}
	// One process serves the embedded store: nothing older can be
	// serving it while this one starts.
	if _, err := migrations.Contract(ctx, a.sqlDB, migrations.SQLite); err != nil {
		return err
	}
	a.memq = mq.NewMemory(8)
	a.producer = a.memq.Producer()
	if a.Cfg.AdminToken == "" {
		a.Cfg.AdminToken = randomSecret()
	}
	if a.Cfg.PaymentSecret == "" {
		a.Cfg.PaymentSecret = randomSecret()
	}
	if len(a.Cfg.ClientTokens) == 0 {
		a.Cfg.ClientTokens = []string{randomSecret()}
	}
	if a.Cfg.BuyerKey == "" {
		a.Cfg.BuyerKey = randomSecret()
	}
	return nil
}

func randomSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (a *App) publishStockBack(sku string) {
	a.soldOut.Clear(sku) // this node at once; the others through Redis
	if err := a.Stock.PublishStockBack(context.Background(), sku); err != nil {
		a.log.Warn("publishing stock-back failed; other nodes' sold-out flags expire on their own", "sku", sku, "err", err)
	}
}

// ready is what the API needs: Redis and the database. A dependency whose
// breaker is open is reported as such without being asked. A Redis Cluster
// is needed as long as one of its masters answers: a node whose every
// breaker is closed but one still sells the SKUs of the others, and every
// node of the fleet shares the cluster, so taking nodes out of the load
// balancer for one shard would refuse the sales of every shard.
func (a *App) ready(ctx context.Context) map[string]error {
	redisErr := func() error {
		if a.redisShards != nil {
			return a.redisShards.Check(ctx)
		}
		return a.redisBreaker.Check(ctx)
	}
	return map[string]error{"redis": redisErr(), "database": a.dbBreaker.Check(ctx)}
}

// degraded is what the API can do without: the sync to the broker, and on
// a Redis Cluster some of its shards (redis_shards names those whose
// breaker is open: their SKUs are answered 503, the others sell). Orders
// and reservations keep being taken and recorded while the broker is down;
// their outbox rows go out when it is back.
func (a *App) degraded(ctx context.Context) map[string]error {
	if a.memq != nil {
		return map[string]error{"sync": nil}
	}
	out := map[string]error{"sync": a.producerReady(ctx)}
	if a.redisShards != nil {
		out["redis_shards"] = a.redisShards.Err()
	}
	return out
}

// producerReady checks the relay's path to the broker: an unsent outbox
// backlog older than a minute means messages are not getting out. It reads
// unsent rows only (an index range), however long the history.
func (a *App) producerReady(ctx context.Context) error {
	n, err := arbiter.OutboxOf(a.db.WithContext(ctx)).UnsentBefore(time.Now().UTC().Add(-time.Minute))
	if err != nil {
		return err
	}
	if n > 0 {
		return fmt.Errorf("%d stock messages unsent for over a minute", n)
	}
	return nil
}

// Start listens (port 0 picks a free one), serves HTTP and starts the
// consumer, relay, timeout release and stock-back subscriber.
func (a *App) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", a.Cfg.HTTPAddr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%w: another process listens there; stop it, or set INVENTORY_HTTP_ADDR to another address (e.g. INVENTORY_HTTP_ADDR=:8081)", err)
	}
	if err != nil {
		return err
	}
	a.ln = ln
	if err := a.consumer.Start(); err != nil {
		_ = ln.Close()
		return fmt.Errorf("consumer: %w", err)
	}
	bg, stop := context.WithCancel(context.WithoutCancel(ctx))
	a.stop = stop
	a.relay.Start(bg)
	a.timeouts.Start(bg)
	a.realigner.Start(bg)
	a.retention.Start(bg)
	a.events.Start(bg)
	a.projector.Start(bg)
	a.deliveries.Start(bg)
	watching := a.Stock.WatchStockBack(bg, a.soldOut.Clear)
	a.bg.Add(1)
	go func() {
		defer a.bg.Done()
		watching()
	}()
	a.httpSrv = &http.Server{Handler: a.server.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		err := a.httpSrv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		a.done <- err
	}()
	a.log.Info("listening", "addr", ln.Addr().String(), "embedded", a.Cfg.Embedded())
	return nil
}

// Handler is the HTTP API, for serving it in-process (tests).
func (a *App) Handler() http.Handler { return a.server.Handler() }

// DB is the service's database handle, for in-process tools that observe
// it (cmd/benchtable counts the statements a phase's requests send with a
// GORM callback). The group commit's own connections (Commits) are not
// behind it.
func (a *App) DB() *gorm.DB { return a.db }

// ProjectionLag is the lean sale's projection lag as this node's
// projector measures it (inventory_projection_lag_seconds), for
// cmd/benchtable to print beside the sale.
func (a *App) ProjectionLag() prometheus.Histogram { return a.projector.Lag() }

// Addr is the address the server listens on, once started.
func (a *App) Addr() string { return a.ln.Addr().String() }

// Done reports the HTTP server stopping on its own.
func (a *App) Done() <-chan error { return a.done }

// Shutdown stops the service in this order: stop accepting HTTP and finish
// the requests in flight; stop the consumer, the relay, the timeout release,
// the events job, the webhook deliveries and the subscriber (unsent outbox
// rows, unnumbered events and undelivered ones wait in the database for the
// next start; unacknowledged messages are redelivered, an attempt cut short
// is made again); then close the producer,
// Redis and the database.
func (a *App) Shutdown(ctx context.Context) error {
	start := time.Now()
	var errs []error
	if a.httpSrv != nil {
		errs = append(errs, a.httpSrv.Shutdown(ctx))
	}
	errs = append(errs, a.consumer.Close())
	a.relay.Stop()
	a.timeouts.Stop()
	a.realigner.Stop()
	a.retention.Stop()
	a.events.Stop()
	a.projector.Stop()
	a.deliveries.Stop()
	if a.stop != nil {
		a.stop()
	}
	a.bg.Wait()
	a.closeClients()
	a.log.Info("stopped", "took", time.Since(start).Round(time.Millisecond).String())
	return errors.Join(errs...)
}

func (a *App) closeClients() {
	if a.producer != nil {
		_ = a.producer.Close()
	}
	if a.rdb != nil {
		_ = a.rdb.Close()
	}
	if a.Commits != nil {
		_ = a.Commits.Close() // the group commit's own connections, back to the pool
	}
	if a.sqlDB != nil {
		_ = a.sqlDB.Close()
	}
	if a.multiDB != nil {
		_ = a.multiDB.Close()
	}
	if a.mini != nil {
		a.mini.Close()
	}
}

// Seed creates demo SKUs (the embedded default's first run).
func (a *App) Seed(ctx context.Context) error {
	for _, s := range []struct {
		sku          string
		stock, limit int64
	}{{"DEMO-TSHIRT", 100, 0}, {"DEMO-PHONE", 10, 1}, {"DEMO-EBOOK", inventory.Unlimited, 0}, {"DEMO-WATCH", 20, 0}} {
		if _, err := a.Catalog.Put(ctx, s.sku, s.stock, s.limit); err != nil {
			return err
		}
	}
	// A flash sale of 5 watches opening a minute after the start (docs/examples.md walks it).
	opens := time.Now().Add(time.Minute).Truncate(time.Second)
	_, err := a.Campaigns.Put(ctx, DemoCampaign, campaign.Spec{SKU: "DEMO-WATCH", Allotment: 5, StartsAt: opens,
		EndsAt: opens.Add(30 * time.Minute), PerUserLimit: 1, HoldSeconds: 120}, nil)
	return err
}

// DemoCampaign is the embedded default's demo flash sale.
const DemoCampaign = "DEMO-FLASH"

// Banner is what the embedded default prints for the person who started it:
// export lines for a second shell (the examples of README.md and
// docs/examples.md use them), with the buyer-token key and signed buyer
// tokens for two demo buyers.
func (a *App) Banner() string {
	base := "http://" + strings.Replace(a.Addr(), "[::]", "localhost", 1)
	var b strings.Builder
	fmt.Fprintf(&b, `inventoryd is running on embedded stand-ins (in-process Redis, SQLite, queue); data lives in memory.
demo SKUs: DEMO-TSHIRT (100), DEMO-PHONE (10, 1 per user), DEMO-EBOOK (unlimited), DEMO-WATCH (20)
demo flash sale: DEMO-FLASH, 5 of DEMO-WATCH, 1 per buyer, opening a minute from now for 30 minutes
In another shell, paste these lines; the examples (README.md, docs/examples.md) use them:

export INVENTORY_URL=%s
export ADMIN_TOKEN=%s
export CLIENT_TOKEN=%s
export PAYMENT_SECRET=%s
`, base, a.Cfg.AdminToken, a.Cfg.ClientTokens[0], a.Cfg.PaymentSecret)
	// A storefront signs buyer tokens with this key; a PEM key is the
	// public half and cannot sign, so with one there is nothing more to print.
	if !identity.IsPublicKey(a.Cfg.BuyerKey) {
		fmt.Fprintf(&b, "export BUYER_KEY=%s\n", a.Cfg.BuyerKey)
		for _, buyer := range []string{"alice", "bob"} {
			if tok, err := identity.IssueFor(a.Cfg.BuyerKey, buyer, a.buyerIssuer(), a.buyerAudience(), a.demoTokenTTL()); err == nil {
				fmt.Fprintf(&b, "export %s_TOKEN=%s\n", strings.ToUpper(buyer), tok)
			}
		}
	}
	// The binary itself, for its import command (a count file, in
	// docs/examples.md).
	if exe, err := os.Executable(); err == nil {
		fmt.Fprintf(&b, "export INVENTORYD=%s\n", exe)
	}
	fmt.Fprintf(&b, `
try (docs/examples.md has every call of the API):
  curl -s -H "Authorization: Bearer $CLIENT_TOKEN" $INVENTORY_URL/v1/skus/DEMO-TSHIRT
API description: %s/openapi.yaml
`, base)
	return b.String()
}

func (a *App) buyerIssuer() string { return cmp.Or(a.Cfg.BuyerTokenIssuer, identity.DefaultIssuer) }
func (a *App) buyerAudience() string {
	return cmp.Or(a.Cfg.BuyerTokenAudience, identity.DefaultAudience)
}

// demoTokenTTL is how long the banner's buyer tokens last: a day, or the
// longest the service accepts.
func (a *App) demoTokenTTL() time.Duration {
	return min(24*time.Hour, cmp.Or(a.Cfg.BuyerTokenMaxTTL, identity.DefaultMaxTTL))
}
