package app

import (
	"errors"
	"fmt"
	"net"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/acme/inventory"

	"github.com/caarlos0/env/v11"
	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"github.com/acme/inventory/internal/httpapi"
	"github.com/acme/inventory/internal/identity"
)

// Config is read from the environment (docs/SPEC.md section 6). Each
// variable's help tag is what `inventoryd serve --help` prints for it.
type Config struct {
	HTTPAddr        string   `env:"INVENTORY_HTTP_ADDR" envDefault:":8080" help:"listen address (127.0.0.1:0 picks a free port; the log says which)"`
	RedisURL        string   `env:"INVENTORY_REDIS_URL" help:"a single Redis, e.g. redis://127.0.0.1:6379/0"`
	RedisCluster    []string `env:"INVENTORY_REDIS_CLUSTER" envSeparator:"," help:"comma-separated Redis Cluster node addresses (instead of the URL)"`
	MySQLDSN        string   `env:"INVENTORY_MYSQL_DSN" help:"e.g. inventory:secret@tcp(127.0.0.1:3306)/inventory (MySQL 8 or MariaDB)"`
	RocketMQNamesrv []string `env:"INVENTORY_ROCKETMQ_NAMESRV" envSeparator:"," help:"comma-separated RocketMQ name servers"`
	RocketMQTopic   string   `env:"INVENTORY_ROCKETMQ_TOPIC" envDefault:"inventory_stock" help:"the ordered topic (created with 8 queues when missing)"`
	AdminToken      string   `env:"INVENTORY_ADMIN_TOKEN" help:"bearer token of the admin routes (generated in embedded mode)"`
	// ClientTokens are the client credentials (comma-separated; several at
	// once so one can be rotated without downtime).
	ClientTokens  []string `env:"INVENTORY_CLIENT_TOKENS" envSeparator:"," help:"comma-separated client credentials, all accepted (generated in embedded mode)"`
	PaymentSecret string   `env:"INVENTORY_PAYMENT_SECRET" help:"HMAC secret of the payment callback (generated in embedded mode)"`
	// BuyerKey verifies the buyer tokens the storefront signs: an HMAC secret
	// (HS256) or a PEM public key (RS256, PS256, ES256, EdDSA).
	BuyerKey string `env:"INVENTORY_BUYER_KEY" help:"verifies X-Buyer-Token: an HMAC secret or a PEM public key (generated in embedded mode)"`
	// A buyer token must name BuyerTokenAudience in aud and
	// BuyerTokenIssuer as iss, and expire within BuyerTokenMaxTTL of when it
	// is checked (zero values: identity's defaults).
	BuyerTokenAudience string        `env:"INVENTORY_BUYER_TOKEN_AUDIENCE" envDefault:"inventory" help:"the aud a buyer token must name"`
	BuyerTokenIssuer   string        `env:"INVENTORY_BUYER_TOKEN_ISSUER" envDefault:"storefront" help:"the iss a buyer token must carry"`
	BuyerTokenMaxTTL   time.Duration `env:"INVENTORY_BUYER_TOKEN_MAX_TTL" envDefault:"24h" help:"how far ahead a buyer token's exp may be (1m to 168h)"`
	// TrustedProxies (CIDRs or addresses) may set X-Forwarded-For; by
	// default the connection's remote address is the client.
	TrustedProxies  []string      `env:"INVENTORY_TRUSTED_PROXIES" envSeparator:"," help:"CIDRs or addresses whose X-Forwarded-For the seckill rate limit believes"`
	OrderTTL        time.Duration `env:"INVENTORY_ORDER_TTL" envDefault:"15m" help:"how long an unpaid order holds stock (1s to 168h)"`
	MaxHold         time.Duration `env:"INVENTORY_MAX_HOLD" envDefault:"2h" help:"the longest hold a checkout may ask for (hold_seconds) or extend to, counted from the hold's creation (at least INVENTORY_ORDER_TTL and 10s, at most 168h)"`
	SeckillRate     float64       `env:"INVENTORY_SECKILL_RATE" envDefault:"50" help:"seckill requests per second per client address (burst twice that)"`
	SoldOutTTL      time.Duration `env:"INVENTORY_SOLDOUT_TTL" envDefault:"2s" help:"how long a node answers a sold-out SKU from memory before asking Redis again; cleared on every node at once when stock comes back (100ms to 1h)"`
	RequestTimeout  time.Duration `env:"INVENTORY_REQUEST_TIMEOUT" envDefault:"1s" help:"every request's deadline: a dependency that has not answered by then gets the request a 503 with Retry-After (10ms to 1m)"`
	ShutdownTimeout time.Duration `env:"INVENTORY_SHUTDOWN_TIMEOUT" envDefault:"15s" help:"bound on graceful shutdown"`
	// LeanSale records each new hold as one row of holds, its order and
	// reservations projected after the commit (docs/design.md "The lean
	// sale"); the default. Every node reads and projects both ways
	// whatever it says. Off, a node writes the order in the sale's commit
	// as releases before the lean sale did: what a fleet rolled from one
	// of them needs until its last old node is gone (docs/operations.md).
	LeanSale bool `env:"INVENTORY_LEAN_SALE" envDefault:"true" help:"record new holds as the lean sale does: one narrow row in the sale's commit, the order and its reservations projected after it (every node reads both ways); false while a fleet is rolled from a release before the lean sale, whose nodes cannot read it"`
	// LeanCampaigns has a lean sale record a campaign's holds lean too,
	// numbered by their campaign (docs/design.md "The lean sale"); the
	// default. Releases before it project a campaign's hold as a sale of
	// its SKU: off while a fleet is rolled from one of them.
	LeanCampaigns bool `env:"INVENTORY_LEAN_CAMPAIGNS" envDefault:"true" help:"with INVENTORY_LEAN_SALE, record a campaign's holds lean too (numbered by their campaign); false while a fleet is rolled from a release before it, whose nodes would project them as sales of the SKU"`
	// Retention is how long finished history (applied outbox rows, ledger
	// rows, stock movements) is kept before one node prunes it, every
	// RetentionInterval. Exactly once never depends on what it prunes.
	Retention time.Duration `env:"INVENTORY_RETENTION" envDefault:"720h" help:"how long finished history is kept (at least 1h): applied outbox rows, ledger rows, movements folded into an opening balance"`
	// WebhookAllowHTTP and WebhookAllowPrivate loosen what a webhook may
	// target (tests, a receiver on the same host or network).
	WebhookAllowHTTP    bool `env:"INVENTORY_WEBHOOK_ALLOW_HTTP" envDefault:"false" help:"let webhooks deliver over plain http (default: https only)"`
	WebhookAllowPrivate bool `env:"INVENTORY_WEBHOOK_ALLOW_PRIVATE" envDefault:"false" help:"let webhooks target loopback, private, link-local and metadata addresses (default: refused, at subscription and at delivery)"`
	// A webhook delivery attempt ends after WebhookTimeout; a failed one is
	// retried after a jittered backoff doubling from 1s up to
	// WebhookMaxBackoff, never given up; a subscription whose oldest
	// undelivered event has failed for WebhookFailingAfter is marked failing.
	WebhookTimeout      time.Duration `env:"INVENTORY_WEBHOOK_TIMEOUT" envDefault:"5s" help:"the deadline of one webhook delivery attempt (100ms to 1m)"`
	WebhookMaxBackoff   time.Duration `env:"INVENTORY_WEBHOOK_MAX_BACKOFF" envDefault:"10m" help:"the longest wait between a failing webhook's attempts (1s to 1h); they never stop"`
	WebhookFailingAfter time.Duration `env:"INVENTORY_WEBHOOK_FAILING_AFTER" envDefault:"15m" help:"how long a webhook's oldest undelivered event may keep failing before the subscription is marked failing (1m to 24h)"`
	// EventRetention is how long stock events stay in the replay feed.
	EventRetention    time.Duration `env:"INVENTORY_EVENT_RETENTION" envDefault:"168h" help:"how long stock events stay in the replay feed (at least 168h, 7 days)"`
	RetentionInterval time.Duration `env:"INVENTORY_RETENTION_INTERVAL" envDefault:"10m" help:"how often one node prunes it"`
	// SweepInterval is how often one node sweeps the database for unpaid
	// orders past their deadline that the delay queue missed.
	SweepInterval time.Duration `env:"INVENTORY_SWEEP_INTERVAL" envDefault:"30s" help:"how often one node sweeps for unpaid orders the delay queue missed (100ms to 1h)"`
	// RealignInterval is how often one node realigns every SKU whose Redis
	// value differs from the database.
	RealignInterval time.Duration `env:"INVENTORY_REALIGN_INTERVAL" envDefault:"30s" help:"how often one node realigns SKUs whose Redis value drifted (100ms to 1h)"`
	// InstanceName tells this node's RocketMQ clients apart (default: host and pid).
	InstanceName string `env:"INVENTORY_INSTANCE" help:"names this node's RocketMQ clients (default: host and pid)"`
}

// Command is what a command of inventoryd needs from the configuration.
type Command string

const (
	// Serve needs every server and every secret, or none of the servers
	// (embedded mode).
	Serve Command = "serve"
	// Migrate needs the database; the RocketMQ name server is optional
	// (the topic is created when it is set).
	Migrate Command = "migrate"
	// Reconcile needs Redis and the database, nothing else.
	Reconcile Command = "reconcile"
)

// Commands are the commands ValidateFor knows, in the order help lists them.
var Commands = []Command{Serve, Migrate, Reconcile}

// LoadConfig parses the environment and validates it for serving.
func LoadConfig() (Config, error) {
	cfg, err := ParseConfig()
	if err != nil {
		return Config{}, err
	}
	return cfg, cfg.Validate()
}

// ParseConfig parses the environment, with the defaults, without requiring a
// complete real-mode configuration (for commands that need only part of it).
func ParseConfig() (Config, error) {
	cfg, err := env.ParseAs[Config]()
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	return cfg, nil
}

// Defaults is the configuration with every default and nothing of the
// environment: what an in-process caller (a benchmark) starts from to
// serve as the service would by default.
func Defaults() Config {
	cfg, err := env.ParseAsWithOptions[Config](env.Options{Environment: map[string]string{}})
	if err != nil { // every default parses (TestDefaultsParseWithoutTheEnvironment)
		panic(fmt.Sprintf("config: the defaults do not parse: %v", err))
	}
	return cfg
}

// Validate checks the configuration for serving. Real mode needs every
// server and every secret: the service refuses to start half-configured.
func (c Config) Validate() error { return c.ValidateFor(Serve) }

// ValidateFor checks the configuration for cmd on its own, without
// connecting to anything: what `inventoryd config check` runs.
func (c Config) ValidateFor(cmd Command) error {
	if !slices.Contains(Commands, cmd) {
		return fmt.Errorf("config: no command %q (one of %v)", cmd, Commands)
	}
	if err := c.validateAddresses(); err != nil {
		return err
	}
	switch cmd {
	case Migrate:
		if c.MySQLDSN == "" {
			return errors.New("config: migrate needs INVENTORY_MYSQL_DSN")
		}
		return nil
	case Reconcile:
		var missing []string
		if c.RedisURL == "" && len(c.RedisCluster) == 0 {
			missing = append(missing, "INVENTORY_REDIS_URL or INVENTORY_REDIS_CLUSTER")
		}
		if c.MySQLDSN == "" {
			missing = append(missing, "INVENTORY_MYSQL_DSN")
		}
		if len(missing) > 0 {
			return fmt.Errorf("config: reconcile checks Redis against the database and needs %v", missing)
		}
		return nil
	}
	if c.OrderTTL < time.Second || c.OrderTTL > 7*24*time.Hour {
		return fmt.Errorf("config: INVENTORY_ORDER_TTL must be between 1s and 168h, got %s", c.OrderTTL)
	}
	if c.MaxHold != 0 && (c.MaxHold < max(c.OrderTTL, inventory.MinHold) || c.MaxHold > 7*24*time.Hour) { // 0: the default
		return fmt.Errorf("config: INVENTORY_MAX_HOLD must be between max(INVENTORY_ORDER_TTL, 10s) and 168h, got %s", c.MaxHold)
	}
	if c.RequestTimeout != 0 && (c.RequestTimeout < 10*time.Millisecond || c.RequestTimeout > time.Minute) { // 0: the default
		return fmt.Errorf("config: INVENTORY_REQUEST_TIMEOUT must be between 10ms and 1m, got %s", c.RequestTimeout)
	}
	if c.ShutdownTimeout <= 0 {
		return errors.New("config: INVENTORY_SHUTDOWN_TIMEOUT must be positive")
	}
	if c.Retention != 0 && c.Retention < time.Hour { // 0: the default
		return fmt.Errorf("config: INVENTORY_RETENTION must be at least 1h (and longer than the broker keeps messages), got %s", c.Retention)
	}
	if c.EventRetention != 0 && c.EventRetention < 7*24*time.Hour { // 0: the default
		return fmt.Errorf("config: INVENTORY_EVENT_RETENTION must be at least 168h (7 days: the replay feed's promise), got %s", c.EventRetention)
	}
	if c.RetentionInterval != 0 && c.RetentionInterval < time.Second {
		return fmt.Errorf("config: INVENTORY_RETENTION_INTERVAL must be at least 1s, got %s", c.RetentionInterval)
	}
	for name, d := range map[string]time.Duration{"INVENTORY_SWEEP_INTERVAL": c.SweepInterval, "INVENTORY_REALIGN_INTERVAL": c.RealignInterval,
		"INVENTORY_SOLDOUT_TTL": c.SoldOutTTL} {
		if d != 0 && (d < 100*time.Millisecond || d > time.Hour) { // 0: the default
			return fmt.Errorf("config: %s must be between 100ms and 1h, got %s", name, d)
		}
	}
	for _, b := range []struct {
		name     string
		d        time.Duration
		min, max time.Duration
	}{
		{"INVENTORY_WEBHOOK_TIMEOUT", c.WebhookTimeout, 100 * time.Millisecond, time.Minute},
		{"INVENTORY_WEBHOOK_MAX_BACKOFF", c.WebhookMaxBackoff, time.Second, time.Hour},
		{"INVENTORY_WEBHOOK_FAILING_AFTER", c.WebhookFailingAfter, time.Minute, 24 * time.Hour},
	} {
		if b.d != 0 && (b.d < b.min || b.d > b.max) { // 0: the default
			return fmt.Errorf("config: %s must be between %s and %s, got %s", b.name, b.min, b.max, b.d)
		}
	}
	if c.BuyerTokenMaxTTL != 0 && (c.BuyerTokenMaxTTL < time.Minute || c.BuyerTokenMaxTTL > 7*24*time.Hour) {
		return fmt.Errorf("config: INVENTORY_BUYER_TOKEN_MAX_TTL must be between 1m and 168h, got %s", c.BuyerTokenMaxTTL)
	}
	if c.SeckillRate <= 0 {
		return errors.New("config: INVENTORY_SECKILL_RATE must be positive")
	}
	if c.Embedded() {
		return c.validateSecrets()
	}
	var missing []string
	if c.RedisURL == "" && len(c.RedisCluster) == 0 {
		missing = append(missing, "INVENTORY_REDIS_URL or INVENTORY_REDIS_CLUSTER")
	}
	if c.MySQLDSN == "" {
		missing = append(missing, "INVENTORY_MYSQL_DSN")
	}
	if len(c.RocketMQNamesrv) == 0 {
		missing = append(missing, "INVENTORY_ROCKETMQ_NAMESRV")
	}
	for name, set := range map[string]bool{
		"INVENTORY_ADMIN_TOKEN": c.AdminToken != "", "INVENTORY_CLIENT_TOKENS": len(c.ClientTokens) > 0,
		"INVENTORY_PAYMENT_SECRET": c.PaymentSecret != "", "INVENTORY_BUYER_KEY": c.BuyerKey != "",
	} {
		if !set {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return fmt.Errorf("config: with external servers configured, these are required too: %v", missing)
	}
	return c.validateSecrets()
}

// validateAddresses checks that the server addresses given parse, so a typo
// is found by `config check` rather than at the first connection.
func (c Config) validateAddresses() error {
	if c.RedisURL != "" && len(c.RedisCluster) > 0 {
		return errors.New("config: set INVENTORY_REDIS_URL or INVENTORY_REDIS_CLUSTER, not both")
	}
	if c.RedisURL != "" {
		if _, err := redis.ParseURL(c.RedisURL); err != nil {
			return fmt.Errorf("config: INVENTORY_REDIS_URL: %w", err)
		}
	}
	for _, addr := range append(slices.Clone(c.RedisCluster), c.RocketMQNamesrv...) {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return fmt.Errorf("config: %q is not a host:port address (INVENTORY_REDIS_CLUSTER, INVENTORY_ROCKETMQ_NAMESRV)", addr)
		}
	}
	if c.MySQLDSN != "" {
		if _, err := mysql.ParseDSN(c.MySQLDSN); err != nil {
			return fmt.Errorf("config: INVENTORY_MYSQL_DSN: %w", err)
		}
	}
	if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
		return fmt.Errorf("config: INVENTORY_HTTP_ADDR %q is not a listen address such as :8080 or 127.0.0.1:8080", c.HTTPAddr)
	}
	return nil
}

// Summary describes what the configuration points cmd at, without a secret:
// what `inventoryd config check` prints.
func (c Config) Summary(cmd Command) string {
	var parts []string
	if cmd == Serve && c.Embedded() {
		return "embedded mode (in-process Redis, SQLite, queue); listen " + c.HTTPAddr
	}
	if c.RedisURL != "" && cmd != Migrate {
		u, _ := redis.ParseURL(c.RedisURL)
		parts = append(parts, fmt.Sprintf("Redis %s db %d", u.Addr, u.DB))
	}
	if len(c.RedisCluster) > 0 && cmd != Migrate {
		parts = append(parts, "Redis Cluster "+strings.Join(c.RedisCluster, ","))
	}
	if m, err := mysql.ParseDSN(c.MySQLDSN); err == nil && c.MySQLDSN != "" {
		parts = append(parts, fmt.Sprintf("MySQL %s/%s as %s", m.Addr, m.DBName, m.User))
	}
	if len(c.RocketMQNamesrv) > 0 && cmd != Reconcile {
		parts = append(parts, fmt.Sprintf("RocketMQ %s topic %s", strings.Join(c.RocketMQNamesrv, ","), c.RocketMQTopic))
	}
	if cmd == Serve {
		parts = append(parts, "listen "+c.HTTPAddr, fmt.Sprintf("%d client credential(s)", len(c.ClientTokens)))
	}
	return strings.Join(parts, "; ")
}

// Help lists every variable with its default and meaning, for --help.
func Help() string {
	var b strings.Builder
	t := reflect.TypeFor[Config]()
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		if name == "" {
			continue
		}
		def := f.Tag.Get("envDefault")
		if def == "" {
			def = "-"
		}
		fmt.Fprintf(&b, "  %-32s %-16s %s\n", name, def, f.Tag.Get("help"))
	}
	return b.String()
}

// validateSecrets refuses weak or reused secrets, in embedded mode too when
// they are supplied (generated ones are strong).
func (c Config) validateSecrets() error {
	seen := map[string]string{}
	check := func(name, v string) error {
		if v == "" {
			return nil
		}
		if err := strongSecret(v); err != nil {
			return fmt.Errorf("config: %s: %w", name, err)
		}
		if other, ok := seen[v]; ok {
			return fmt.Errorf("config: %s must differ from %s", name, other)
		}
		seen[v] = name
		return nil
	}
	var errs []error
	errs = append(errs, check("INVENTORY_ADMIN_TOKEN", c.AdminToken), check("INVENTORY_PAYMENT_SECRET", c.PaymentSecret))
	for i, t := range c.ClientTokens {
		errs = append(errs, check(fmt.Sprintf("INVENTORY_CLIENT_TOKENS[%d]", i), t))
	}
	if !identity.IsPublicKey(c.BuyerKey) {
		errs = append(errs, check("INVENTORY_BUYER_KEY", c.BuyerKey))
	}
	if _, err := httpapi.ParseCIDRs(c.TrustedProxies); err != nil {
		errs = append(errs, fmt.Errorf("config: INVENTORY_TRUSTED_PROXIES: %w", err))
	}
	return errors.Join(errs...)
}

// strongSecret accepts a secret of at least 32 characters drawn from at
// least 12 different ones (a random hex or base64 string of 16+ bytes
// passes; "aaaa...", "1234..." and words padded out do not).
func strongSecret(v string) error {
	if len(v) < 32 {
		return fmt.Errorf("must be at least 32 characters (got %d); generate one with: openssl rand -hex 32", len(v))
	}
	distinct := map[rune]bool{}
	for _, r := range v {
		distinct[r] = true
	}
	if len(distinct) < 12 {
		return errors.New("is too repetitive to be a secret; generate one with: openssl rand -hex 32")
	}
	return nil
}

// Embedded reports whether no external server is configured, in which case
// the service runs on its in-process stand-ins.
func (c Config) Embedded() bool {
	return c.RedisURL == "" && len(c.RedisCluster) == 0 && c.MySQLDSN == "" && len(c.RocketMQNamesrv) == 0
}
