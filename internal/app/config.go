package app

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/acme/inventory/internal/httpapi"
	"github.com/acme/inventory/internal/identity"
)

// Config is read from the environment (docs/SPEC.md section 6).
type Config struct {
	HTTPAddr        string   `env:"INVENTORY_HTTP_ADDR" envDefault:":8080"`
	RedisURL        string   `env:"INVENTORY_REDIS_URL"`
	RedisCluster    []string `env:"INVENTORY_REDIS_CLUSTER" envSeparator:","`
	MySQLDSN        string   `env:"INVENTORY_MYSQL_DSN"`
	RocketMQNamesrv []string `env:"INVENTORY_ROCKETMQ_NAMESRV" envSeparator:","`
	RocketMQTopic   string   `env:"INVENTORY_ROCKETMQ_TOPIC" envDefault:"inventory_stock"`
	AdminToken      string   `env:"INVENTORY_ADMIN_TOKEN"`
	// ClientTokens are the client credentials (comma-separated; several at
	// once so one can be rotated without downtime).
	ClientTokens  []string `env:"INVENTORY_CLIENT_TOKENS" envSeparator:","`
	PaymentSecret string   `env:"INVENTORY_PAYMENT_SECRET"`
	// BuyerKey verifies the buyer tokens the storefront signs: an HMAC secret
	// (HS256) or a PEM public key (RS256, PS256, ES256, EdDSA).
	BuyerKey string `env:"INVENTORY_BUYER_KEY"`
	// A buyer token must name BuyerTokenAudience in aud and
	// BuyerTokenIssuer as iss, and expire within BuyerTokenMaxTTL of when it
	// is checked (zero values: identity's defaults).
	BuyerTokenAudience string        `env:"INVENTORY_BUYER_TOKEN_AUDIENCE" envDefault:"inventory"`
	BuyerTokenIssuer   string        `env:"INVENTORY_BUYER_TOKEN_ISSUER" envDefault:"storefront"`
	BuyerTokenMaxTTL   time.Duration `env:"INVENTORY_BUYER_TOKEN_MAX_TTL" envDefault:"24h"`
	// TrustedProxies (CIDRs or addresses) may set X-Forwarded-For; by
	// default the connection's remote address is the client.
	TrustedProxies  []string      `env:"INVENTORY_TRUSTED_PROXIES" envSeparator:","`
	OrderTTL        time.Duration `env:"INVENTORY_ORDER_TTL" envDefault:"15m"`
	SeckillRate     float64       `env:"INVENTORY_SECKILL_RATE" envDefault:"50"`
	ShutdownTimeout time.Duration `env:"INVENTORY_SHUTDOWN_TIMEOUT" envDefault:"15s"`
	// Retention is how long finished history (applied outbox rows, ledger
	// rows, stock movements) is kept before one node prunes it, every
	// RetentionInterval. It must exceed the broker's message retention.
	Retention         time.Duration `env:"INVENTORY_RETENTION" envDefault:"720h"`
	RetentionInterval time.Duration `env:"INVENTORY_RETENTION_INTERVAL" envDefault:"10m"`
	// SweepInterval is how often one node sweeps the database for unpaid
	// orders past their deadline that the delay queue missed.
	SweepInterval time.Duration `env:"INVENTORY_SWEEP_INTERVAL" envDefault:"30s"`
	// RealignInterval is how often one node realigns every SKU whose Redis
	// value differs from the database.
	RealignInterval time.Duration `env:"INVENTORY_REALIGN_INTERVAL" envDefault:"30s"`
	// InstanceName tells this node's RocketMQ clients apart (default: host and pid).
	InstanceName string `env:"INVENTORY_INSTANCE"`
}

// LoadConfig parses the environment and validates it.
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

// Validate checks the configuration on its own. Real mode needs every server
// and both secrets: the service refuses to start half-configured.
func (c Config) Validate() error {
	if c.RedisURL != "" && len(c.RedisCluster) > 0 {
		return errors.New("config: set INVENTORY_REDIS_URL or INVENTORY_REDIS_CLUSTER, not both")
	}
	if c.OrderTTL < time.Second || c.OrderTTL > 7*24*time.Hour {
		return fmt.Errorf("config: INVENTORY_ORDER_TTL must be between 1s and 168h, got %s", c.OrderTTL)
	}
	if c.ShutdownTimeout <= 0 {
		return errors.New("config: INVENTORY_SHUTDOWN_TIMEOUT must be positive")
	}
	if c.Retention != 0 && c.Retention < time.Hour { // 0: the default
		return fmt.Errorf("config: INVENTORY_RETENTION must be at least 1h (and longer than the broker keeps messages), got %s", c.Retention)
	}
	if c.RetentionInterval != 0 && c.RetentionInterval < time.Second {
		return fmt.Errorf("config: INVENTORY_RETENTION_INTERVAL must be at least 1s, got %s", c.RetentionInterval)
	}
	for name, d := range map[string]time.Duration{"INVENTORY_SWEEP_INTERVAL": c.SweepInterval, "INVENTORY_REALIGN_INTERVAL": c.RealignInterval} {
		if d != 0 && (d < 100*time.Millisecond || d > time.Hour) { // 0: the default
			return fmt.Errorf("config: %s must be between 100ms and 1h, got %s", name, d)
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
