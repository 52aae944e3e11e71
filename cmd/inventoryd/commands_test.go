package main

import (
	"cmp"
	"net"
	"os/exec"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/app"
)

// run runs the binary with exactly env and returns its exit code and output.
func run(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(binary(t), args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	}
	require.NoError(t, err, string(out))
	return 0, string(out)
}

// --version names the build: a version, and the Go it was built with.
func TestVersion(t *testing.T) {
	code, out := run(t, nil, "--version")
	require.Equal(t, 0, code, out)
	require.Regexp(t, `^inventoryd \S+.* go1\.\d+`, out)
}

// serve --help lists every variable of the configuration with its default.
func TestServeHelpListsConfiguration(t *testing.T) {
	code, out := run(t, nil, "serve", "--help")
	require.Equal(t, 0, code, out)
	typ := reflect.TypeFor[app.Config]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		require.Regexp(t, `(?m)^  `+name+` +`+regexp.QuoteMeta(cmp.Or(f.Tag.Get("envDefault"), "-"))+` +\S`, out, name)
	}
}

// An address in use says which variable moves the service elsewhere.
func TestAddressInUseNamesTheVariable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	code, out := run(t, []string{"INVENTORY_HTTP_ADDR=" + ln.Addr().String()})
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "address already in use")
	require.Contains(t, out, "set INVENTORY_HTTP_ADDR to another address")
}

// config check validates an environment for a command without connecting:
// exit 0 and what it points at (no secret), or exit 1 and what is wrong.
func TestConfigCheck(t *testing.T) {
	full := []string{"INVENTORY_REDIS_URL=redis://127.0.0.1:6379/3", "INVENTORY_MYSQL_DSN=u:dbpass@tcp(db:3306)/inv",
		"INVENTORY_ROCKETMQ_NAMESRV=mq:9876", "INVENTORY_ADMIN_TOKEN=" + adminToken, "INVENTORY_CLIENT_TOKENS=" + clientToken,
		"INVENTORY_PAYMENT_SECRET=" + paymentSecret, "INVENTORY_BUYER_KEY=" + buyerKey}
	code, out := run(t, full, "config", "check")
	require.Equal(t, 0, code, out)
	require.Equal(t, "config: ok for serve: Redis 127.0.0.1:6379 db 3; MySQL db:3306/inv as u; RocketMQ mq:9876 topic inventory_stock; listen :8080; 1 client credential(s)\n", out)
	for _, secret := range []string{adminToken, clientToken, paymentSecret, buyerKey, "dbpass"} {
		require.NotContains(t, out, secret)
	}
	code, out = run(t, nil, "config", "check")
	require.Equal(t, 0, code, out)
	require.Equal(t, "config: ok for serve: embedded mode (in-process Redis, SQLite, queue); listen :8080\n", out)

	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{full[:3], nil, "INVENTORY_ADMIN_TOKEN"},
		{append(full[1:], "INVENTORY_ADMIN_TOKEN=change-me-admin-token"), nil, "INVENTORY_REDIS_URL or INVENTORY_REDIS_CLUSTER"},
		{append(slices.Clone(full), "INVENTORY_ADMIN_TOKEN=change-me-admin-token"), nil, "INVENTORY_ADMIN_TOKEN: must be at least 32 characters (got 21)"},
		{append(slices.Clone(full), "INVENTORY_MYSQL_DSN=not a dsn"), nil, "INVENTORY_MYSQL_DSN: invalid DSN"},
		{append(slices.Clone(full), "INVENTORY_REDIS_URL=http://x"), nil, "INVENTORY_REDIS_URL"},
		{append(slices.Clone(full), "INVENTORY_HTTP_ADDR=8080"), nil, `INVENTORY_HTTP_ADDR "8080" is not a listen address`},
		{append(slices.Clone(full), "INVENTORY_BUYER_TOKEN_MAX_TTL=720h"), nil, "INVENTORY_BUYER_TOKEN_MAX_TTL must be between 1m and 168h, got 720h0m0s"},
		{nil, []string{"migrate"}, "migrate needs INVENTORY_MYSQL_DSN"},
		{full[2:3], []string{"reconcile"}, "reconcile checks Redis against the database and needs [INVENTORY_REDIS_URL or INVENTORY_REDIS_CLUSTER INVENTORY_MYSQL_DSN]"},
		{nil, []string{"sideways"}, `invalid argument "sideways"`},
	} {
		code, out := run(t, c.env, append([]string{"config", "check"}, c.args...)...)
		require.Equal(t, 1, code, "%v %v: %s", c.env, c.args, out)
		require.Contains(t, out, c.want, "%v %v", c.env, c.args)
	}

	// Migrate and reconcile need only what they use.
	code, out = run(t, full[1:2], "config", "check", "migrate")
	require.Equal(t, 0, code, out)
	require.Equal(t, "config: ok for migrate: MySQL db:3306/inv as u\n", out)
	code, out = run(t, full[:2], "config", "check", "reconcile")
	require.Equal(t, 0, code, out)
	require.Equal(t, "config: ok for reconcile: Redis 127.0.0.1:6379 db 3; MySQL db:3306/inv as u\n", out)
}

// reconcile reads Redis and the database only: it runs with those two
// variables and no secret or broker.
func TestReconcileNeedsOnlyRedisAndDatabase(t *testing.T) {
	env, _ := realEnv(t)
	var only []string
	for _, kv := range env {
		if strings.HasPrefix(kv, "INVENTORY_REDIS_URL=") || strings.HasPrefix(kv, "INVENTORY_MYSQL_DSN=") {
			only = append(only, kv)
		}
	}
	require.Len(t, only, 2)
	code, out := run(t, only, "reconcile")
	require.Equal(t, 0, code, out)
	require.Empty(t, out, "nothing to report on a fresh database")
}

// In embedded mode secrets given in the environment are used instead of
// generated ones, so a restart keeps a second shell's exports working (the
// README's "pin the secrets"): two starts, the same exports.
func TestEmbeddedSecretsPinned(t *testing.T) {
	pinned := []string{"INVENTORY_ADMIN_TOKEN=" + adminToken, "INVENTORY_CLIENT_TOKENS=" + clientToken,
		"INVENTORY_PAYMENT_SECRET=" + paymentSecret, "INVENTORY_BUYER_KEY=" + buyerKey}
	for range 2 {
		p := start(t, pinned...)
		got := p.exports()
		require.Equal(t, adminToken, got["ADMIN_TOKEN"])
		require.Equal(t, clientToken, got["CLIENT_TOKEN"])
		require.Equal(t, paymentSecret, got["PAYMENT_SECRET"])
		require.Equal(t, buyerKey, got["BUYER_KEY"])
		p.stop()
	}
}
