package app

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/expiry"
	"github.com/acme/inventory/internal/httpapi"
	"github.com/acme/inventory/internal/identity"
	"github.com/acme/inventory/internal/maintenance"
	"github.com/acme/inventory/internal/webhooks/delivery"
)

const (
	strongA = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
	strongB = "a1b2c3d4e5f60718293a4b5c6d7e8f90"
	strongC = "9f8e7d6c5b4a39281706f5e4d3c2b1a0"
	strongD = "5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d"
	strongE = "e0d1c2b3a4958677869a5b4c3d2e1f0a"
)

func realConfig() Config {
	return Config{
		HTTPAddr: ":0", RedisURL: "redis://127.0.0.1:6379/0", MySQLDSN: "u:p@tcp(127.0.0.1:3306)/db",
		RocketMQNamesrv: []string{"127.0.0.1:9876"}, OrderTTL: 15 * time.Minute, ShutdownTimeout: time.Second,
		SeckillRate: 50, AdminToken: strongA, ClientTokens: []string{strongB, strongE}, PaymentSecret: strongC, BuyerKey: strongD,
	}
}

func TestRealModeNeedsEveryCredential(t *testing.T) {
	require.NoError(t, realConfig().Validate())
	for name, clear := range map[string]func(*Config){
		"INVENTORY_ADMIN_TOKEN":    func(c *Config) { c.AdminToken = "" },
		"INVENTORY_CLIENT_TOKENS":  func(c *Config) { c.ClientTokens = nil },
		"INVENTORY_PAYMENT_SECRET": func(c *Config) { c.PaymentSecret = "" },
		"INVENTORY_BUYER_KEY":      func(c *Config) { c.BuyerKey = "" },
	} {
		c := realConfig()
		clear(&c)
		err := c.Validate()
		require.Error(t, err, name)
		require.Contains(t, err.Error(), name)
	}
}

// Weak or reused secrets are refused, in real mode and in embedded mode when
// supplied; the message says which and how to make a good one.
func TestWeakSecretsAreRefused(t *testing.T) {
	weak := map[string]string{
		"short":       "abc123",
		"31 chars":    strongA[:31],
		"repetitive":  strings.Repeat("ab", 20),
		"padded word": "password" + strings.Repeat("1234", 6),
	}
	embedded := Config{HTTPAddr: ":0", OrderTTL: time.Minute, ShutdownTimeout: time.Second, SeckillRate: 1}
	for what, v := range weak {
		for _, mode := range []Config{realConfig(), embedded} {
			for field, set := range map[string]func(*Config){
				"INVENTORY_ADMIN_TOKEN":      func(c *Config) { c.AdminToken = v },
				"INVENTORY_CLIENT_TOKENS[1]": func(c *Config) { c.ClientTokens = []string{strongB, v} },
				"INVENTORY_PAYMENT_SECRET":   func(c *Config) { c.PaymentSecret = v },
				"INVENTORY_BUYER_KEY":        func(c *Config) { c.BuyerKey = v },
			} {
				c := mode
				set(&c)
				err := c.Validate()
				require.Error(t, err, "%s %s (embedded=%v)", what, field, c.Embedded())
				require.Contains(t, err.Error(), field)
				require.Contains(t, err.Error(), "openssl rand -hex 32")
			}
		}
	}
	c := realConfig()
	c.ClientTokens = []string{strongB, strongA}
	require.ErrorContains(t, c.Validate(), "INVENTORY_CLIENT_TOKENS[1] must differ from INVENTORY_ADMIN_TOKEN")
	c = realConfig()
	c.BuyerKey = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END PUBLIC KEY-----"
	require.NoError(t, c.Validate(), "a PEM public key is not a secret to measure")
	c = realConfig()
	c.EventRetention = 24 * time.Hour
	require.ErrorContains(t, c.Validate(), "INVENTORY_EVENT_RETENTION must be at least 168h")
	c.EventRetention = 0
	c.TrustedProxies = []string{"10.0.0.0/8", "192.0.2.1", "nonsense"}
	require.ErrorContains(t, c.Validate(), `INVENTORY_TRUSTED_PROXIES: "nonsense" is not an IP address or CIDR`)
}

// The defaults an operator reads in the configuration (--help, README) are
// the ones the components fall back to: written in two places for two
// readers, held equal here.
func TestConfigDefaultsAreTheComponents(t *testing.T) {
	for _, f := range reflect.VisibleFields(reflect.TypeFor[Config]()) {
		if name := f.Tag.Get("env"); name != "" {
			t.Setenv(name, "") // an empty value takes the default
			os.Unsetenv(name)
		}
	}
	c, err := ParseConfig()
	require.NoError(t, err)
	require.Equal(t, inventory.DefaultTTL, c.OrderTTL)
	require.Equal(t, expiry.DefaultSweepInterval, c.SweepInterval)
	require.Equal(t, maintenance.DefaultRealignInterval, c.RealignInterval)
	require.Equal(t, maintenance.DefaultRetentionHorizon, c.Retention)
	require.Equal(t, maintenance.DefaultRetentionInterval, c.RetentionInterval)
	require.Equal(t, maintenance.DefaultEventHorizon, c.EventRetention)
	require.Equal(t, identity.DefaultAudience, c.BuyerTokenAudience)
	require.Equal(t, identity.DefaultIssuer, c.BuyerTokenIssuer)
	require.Equal(t, identity.DefaultMaxTTL, c.BuyerTokenMaxTTL)
	require.Equal(t, DefaultSoldOutTTL, c.SoldOutTTL)
	require.Equal(t, httpapi.DefaultRequestTimeout, c.RequestTimeout)
	require.Equal(t, delivery.DefaultTimeout, c.WebhookTimeout)
	require.Equal(t, delivery.DefaultMaxBackoff, c.WebhookMaxBackoff)
	require.Equal(t, delivery.DefaultFailingAfter, c.WebhookFailingAfter)
}

// Defaults is the environment's defaults whatever the environment says:
// a benchmark's service sells as a deployed one would by default.
func TestDefaultsParseWithoutTheEnvironment(t *testing.T) {
	t.Setenv("INVENTORY_LEAN_SALE", "false")
	t.Setenv("INVENTORY_ORDER_TTL", "1m")
	d := Defaults()
	require.True(t, d.LeanSale, "the lean sale is the default")
	require.Equal(t, inventory.DefaultTTL, d.OrderTTL)
	parsed, err := ParseConfig()
	require.NoError(t, err)
	require.False(t, parsed.LeanSale, "ParseConfig reads the environment")
}

// The webhook delivery's bounds are checked before the service starts.
func TestConfigWebhookBounds(t *testing.T) {
	c := Config{HTTPAddr: ":8080", OrderTTL: time.Minute, ShutdownTimeout: time.Second, SeckillRate: 1}
	require.NoError(t, c.Validate())
	for field, msg := range map[*time.Duration]string{
		&c.WebhookTimeout:      "INVENTORY_WEBHOOK_TIMEOUT must be between 100ms and 1m0s",
		&c.WebhookMaxBackoff:   "INVENTORY_WEBHOOK_MAX_BACKOFF must be between 1s and 1h0m0s",
		&c.WebhookFailingAfter: "INVENTORY_WEBHOOK_FAILING_AFTER must be between 1m0s and 24h0m0s",
	} {
		*field = 2 * 24 * time.Hour
		require.ErrorContains(t, c.Validate(), msg)
		*field = 0
	}
}
