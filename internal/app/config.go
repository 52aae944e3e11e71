package app

import (
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
	AdminToken      string        `env:"INVENTORY_ADMIN_TOKEN"`
	PaymentSecret   string        `env:"INVENTORY_PAYMENT_SECRET"`
	OrderTTL        time.Duration `env:"INVENTORY_ORDER_TTL" envDefault:"15m"`
	ShutdownTimeout time.Duration `env:"INVENTORY_SHUTDOWN_TIMEOUT" envDefault:"15s"`
}

// LoadConfig parses the environment and validates what it can on its own.
func LoadConfig() (Config, error) {
	cfg, err := env.ParseAs[Config]()
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	return cfg, cfg.Validate()
}

func (c Config) Validate() error {
	if c.RedisURL != "" && len(c.RedisCluster) > 0 {
		return fmt.Errorf("config: set INVENTORY_REDIS_URL or INVENTORY_REDIS_CLUSTER, not both")
	}
	if c.OrderTTL < time.Second || c.OrderTTL > 7*24*time.Hour {
		return fmt.Errorf("config: INVENTORY_ORDER_TTL must be between 1s and 168h, got %s", c.OrderTTL)
	}
	if c.ShutdownTimeout <= 0 {
		return fmt.Errorf("config: INVENTORY_SHUTDOWN_TIMEOUT must be positive")
	}
	return nil
}

// Embedded reports whether no external server is configured, in which case
// the service runs on its in-process stand-ins.
func (c Config) Embedded() bool {
	return c.RedisURL == "" && len(c.RedisCluster) == 0 && c.MySQLDSN == "" && len(c.RocketMQNamesrv) == 0
}
