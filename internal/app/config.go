package app

import (
	"errors"
	"fmt"
	"time"

	"github.com/caarlos0/env/v11"
)

// Config is read from the environment (SPEC section 6).
type Config struct {
	HTTPAddr        string        `env:"INVENTORY_HTTP_ADDR" envDefault:":8080"`
	RedisURL        string        `env:"INVENTORY_REDIS_URL"`
	RedisCluster    []string      `env:"INVENTORY_REDIS_CLUSTER" envSeparator:","`
	MySQLDSN        string        `env:"INVENTORY_MYSQL_DSN"`
	RocketMQNamesrv []string      `env:"INVENTORY_ROCKETMQ_NAMESRV" envSeparator:","`
	RocketMQTopic   string        `env:"INVENTORY_ROCKETMQ_TOPIC" envDefault:"inventory_stock"`
	AdminToken      string        `env:"INVENTORY_ADMIN_TOKEN"`
	PaymentSecret   string        `env:"INVENTORY_PAYMENT_SECRET"`
	OrderTTL        time.Duration `env:"INVENTORY_ORDER_TTL" envDefault:"15m"`
	SeckillRate     float64       `env:"INVENTORY_SECKILL_RATE" envDefault:"50"`
	ShutdownTimeout time.Duration `env:"INVENTORY_SHUTDOWN_TIMEOUT" envDefault:"15s"`
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
	if c.SeckillRate <= 0 {
		return errors.New("config: INVENTORY_SECKILL_RATE must be positive")
	}
	if c.Embedded() {
		return nil
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
	if c.AdminToken == "" {
		missing = append(missing, "INVENTORY_ADMIN_TOKEN")
	}
	if c.PaymentSecret == "" {
		missing = append(missing, "INVENTORY_PAYMENT_SECRET")
	}
	if len(missing) > 0 {
		return fmt.Errorf("config: with external servers configured, these are required too: %v", missing)
	}
	if len(c.AdminToken) < 16 || len(c.PaymentSecret) < 16 {
		return errors.New("config: INVENTORY_ADMIN_TOKEN and INVENTORY_PAYMENT_SECRET must be at least 16 characters")
	}
	return nil
}

// Embedded reports whether no external server is configured, in which case
// the service runs on its in-process stand-ins.
func (c Config) Embedded() bool {
	return c.RedisURL == "" && len(c.RedisCluster) == 0 && c.MySQLDSN == "" && len(c.RocketMQNamesrv) == 0
}
