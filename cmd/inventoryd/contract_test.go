package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/client"
	"github.com/acme/inventory/migrations"
	"github.com/acme/inventory/testkit/testenv"
)

// flushRedis empties the e2e Redis database under a running service: the
// loss of every key, as after a restart without persistence.
func flushRedis(t *testing.T) {
	t.Helper()
	opt, err := redis.ParseURL(testenv.RedisURL())
	require.NoError(t, err)
	opt.DB = testenv.RedisDB(t)
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	require.NoError(t, rdb.FlushDB(context.Background()).Err())
}

// Who may do what, through the real binary on the real servers: every
// route refuses anonymous callers (401 with WWW-Authenticate) and changes
// nothing; either configured client credential works; a buyer cannot act as
// another.
func TestContractCredentials(t *testing.T) {
	env, db := realEnv(t)
	p := start(t, env...)
	ctx := t.Context()
	st, body := p.answer(p.api.PutSKUWithResponse(ctx, "TEE", nil, client.PutSKUJSONRequestBody{Stock: 10}, client.BearerAuth(adminToken)))
	require.Equal(t, 200, st, body)
	count := func() string {
		var n [3]int
		require.NoError(t, db.QueryRow(`SELECT (SELECT COUNT(*) FROM orders), (SELECT COUNT(*) FROM stock_reservations), (SELECT reserved FROM skus WHERE sku = 'TEE')`).Scan(&n[0], &n[1], &n[2]))
		return fmt.Sprint(n)
	}
	before := count()
	// Raw: every route with a missing, wrong or malformed Authorization, a
	// bad header rather than a call the checkout backend makes.
	for _, r := range []struct{ method, path, body string }{
		{"PUT", "/v1/skus/TEE", `{"stock":1}`},
		{"POST", "/v1/skus/TEE/adjust", `{"delta":1,"reason":"x"}`},
		{"GET", "/v1/skus/TEE", ``},
		{"GET", "/v1/skus", ``},
		{"GET", "/v1/skus/TEE/movements", ``},
		{"POST", "/v1/stock/deduct", `{"sku":"TEE","qty":1,"token":"a"}`},
		{"POST", "/v1/stock/commit", `{"sku":"TEE","token":"a"}`},
		{"POST", "/v1/stock/release", `{"sku":"TEE","token":"a"}`},
		{"POST", "/v1/orders", `{"user_id":"alice","items":[{"sku":"TEE","qty":1}]}`},
		{"GET", "/v1/orders", ``},
		{"GET", "/v1/orders/x", ``},
		{"POST", "/v1/orders/x/cancel", ``},
		{"POST", "/v1/orders/x/refund", ``},
		{"POST", "/v1/seckill/TEE/buy", `{"user_id":"alice"}`},
		{"POST", "/v1/payments/callback", `{"order_id":"x","payment_id":"p","status":"SUCCESS"}`},
	} {
		for _, auth := range []string{"", "Bearer wrong-token", "Bearer " + paymentSecret, clientToken} {
			h := http.Header{"X-Buyer-Token": {p.buyer("alice")}}
			if auth != "" {
				h.Set("Authorization", auth)
			}
			resp, raw := p.send(r.method, r.path, r.body, h)
			require.Equal(t, 401, resp.StatusCode, "%s %s with %q: %s", r.method, r.path, auth, raw)
			require.NotEmpty(t, resp.Header.Get("WWW-Authenticate"), "%s %s", r.method, r.path)
			require.Contains(t, string(raw), `"code":"unauthorized"`)
		}
	}
	require.Equal(t, before, count(), "refused requests changed nothing")

	// Rotation: both configured client credentials work at once.
	for _, tok := range []string{clientToken, clientToken2} {
		st, body = p.answer(p.api.GetSKUWithResponse(ctx, "TEE", nil, client.BearerAuth(tok)))
		require.Equal(t, 200, st, body)
	}
	// A buyer cannot order, buy or cancel as another.
	bobs := client.CreateOrderJSONRequestBody{UserId: new("bob"), Items: []client.Item{{Sku: "TEE", Qty: 1}}}
	st, body = p.answer(p.api.CreateOrderWithResponse(ctx, nil, bobs, p.as("mallory")))
	require.Equal(t, 403, st, body)
	st, body = p.answer(p.api.SeckillBuyWithResponse(ctx, "TEE", nil, client.SeckillBuyJSONRequestBody{UserId: new("bob")}, p.as("mallory")))
	require.Equal(t, 403, st, body)
	st, order := p.answer(p.api.CreateOrderWithResponse(ctx, nil, bobs, p.as("bob")))
	require.Equal(t, 201, st, order)
	st, body = p.answer(p.api.CancelOrderWithResponse(ctx, order["id"].(string), nil, p.as("mallory")))
	require.Equal(t, 403, st, body)
	require.Equal(t, "forbidden", errCode(body))
	st, body = p.answer(p.api.CancelOrderWithResponse(ctx, order["id"].(string), nil, p.as("bob")))
	require.Equal(t, 200, st, body)
	p.stop()
	stdout, stderr := p.output()
	for _, secret := range []string{adminToken, clientToken, clientToken2, paymentSecret, buyerKey} {
		require.NotContains(t, stdout+stderr, secret, "secrets never reach the output")
	}
}

// Weak secrets stop the real binary before it touches anything.
func TestContractRefusesWeakSecrets(t *testing.T) {
	env, _ := realEnv(t)
	for _, weak := range []string{"INVENTORY_CLIENT_TOKENS=" + clientToken + ",short", "INVENTORY_ADMIN_TOKEN=" + strings.Repeat("ab", 20)} {
		cmd := exec.Command(binary(t))
		cmd.Env = append(append([]string{}, env...), "INVENTORY_HTTP_ADDR=127.0.0.1:0", weak)
		out, err := cmd.CombinedOutput()
		require.Error(t, err, weak)
		require.Contains(t, string(out), "openssl rand -hex 32", string(out))

		// The embedded default refuses a weak secret it is given too.
		cmd = exec.Command(binary(t))
		cmd.Env = []string{"INVENTORY_HTTP_ADDR=127.0.0.1:0", weak}
		out, err = cmd.CombinedOutput()
		require.Error(t, err, weak)
		require.Contains(t, string(out), "openssl rand -hex 32", string(out))
	}
}

// The per-user limit holds on both purchase paths, from 50 connections at
// once, survives Redis losing everything (the database is its record), and
// comes back when an order is cancelled.
func TestContractPerUserLimit(t *testing.T) {
	env, db := realEnv(t)
	p := start(t, env...)
	ctx := t.Context()
	st, body := p.answer(p.api.PutSKUWithResponse(ctx, "PHONE", nil, client.PutSKUJSONRequestBody{Stock: 100, PerUserLimit: new(int64(2))}, client.BearerAuth(adminToken)))
	require.Equal(t, 200, st, body)
	// buy and order are greedy's purchase of one PHONE through either path.
	buy := func() (int, map[string]any) {
		return p.answer(p.api.SeckillBuyWithResponse(ctx, "PHONE", nil, client.SeckillBuyJSONRequestBody{UserId: new("greedy")}, p.as("greedy")))
	}
	order := func() (int, map[string]any) {
		one := client.CreateOrderJSONRequestBody{UserId: new("greedy"), Items: []client.Item{{Sku: "PHONE", Qty: 1}}}
		return p.answer(p.api.CreateOrderWithResponse(ctx, nil, one, p.as("greedy")))
	}

	var mu sync.Mutex
	codes := map[int]int{}
	var ids []string
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			var st int
			var body map[string]any
			if i%2 == 0 {
				st, body = buy()
			} else {
				st, body = order()
			}
			mu.Lock()
			defer mu.Unlock()
			codes[st]++
			if st == 201 {
				ids = append(ids, body["id"].(string))
			} else {
				require.Equal(t, "conflict", errCode(body), "%d: %v", st, body)
			}
		}(i)
	}
	wg.Wait()
	require.Equal(t, map[int]int{201: 2, 409: 48}, codes)
	p.requireSKU(skuView("PHONE", 100, 2, 98, 2))

	flushRedis(t)
	for _, purchase := range []struct {
		path string
		send func() (int, map[string]any)
	}{{"/v1/seckill/PHONE/buy", buy}, {"/v1/orders", order}} {
		st, got := purchase.send()
		require.Equal(t, 409, st, "%s after the Redis loss: %v", purchase.path, got)
		require.Equal(t, "buyer greedy reached the per-user limit of 2 for PHONE", got["error"].(map[string]any)["message"])
	}
	st, body = p.answer(p.api.CancelOrderWithResponse(ctx, ids[0], nil, p.as("greedy")))
	require.Equal(t, 200, st, body)
	// An order's extension through the real service (on MariaDB its
	// UPDATE and the read of the answer go as one multi-statement text):
	// the order with its new deadline, the same one for a retried key, 409
	// for the cancelled order.
	key := client.IdempotencyKey("ext-1")
	extend := func(id string) (int, map[string]any) {
		return p.answer(p.api.ExtendOrderWithResponse(ctx, id, &client.ExtendOrderParams{IdempotencyKey: &key},
			client.ExtendOrderJSONRequestBody{Seconds: 1800}, p.as("greedy")))
	}
	st, first := extend(ids[1])
	require.Equal(t, 200, st, first)
	require.Equal(t, ids[1], first["id"])
	require.Equal(t, "PENDING", first["status"])
	require.Equal(t, []any{map[string]any{"sku": "PHONE", "qty": float64(1)}}, first["items"])
	st, again := extend(ids[1])
	require.Equal(t, 200, st, again)
	require.Equal(t, first, again, "a retry with the same key answers the same order and deadline")
	st, body = extend(ids[0])
	require.Equal(t, 409, st, body)
	require.Equal(t, "conflict", errCode(body))
	st, body = buy()
	require.Equal(t, 201, st, "the cancelled unit comes back to the buyer's limit: %v", body)
	var counted int
	require.NoError(t, db.QueryRow(`SELECT qty FROM buyer_quotas WHERE sku = 'PHONE' AND user_id = 'greedy'`).Scan(&counted))
	require.Equal(t, 2, counted)
	p.requireSKU(skuView("PHONE", 100, 2, 98, 2))
}

// HTTP conventions through the real binary: 201 + Location, X-Request-ID
// echoed, 413, 405 with its own code and Allow, spoofed forwarding headers
// not believed by the seckill rate limit, and 429 with Retry-After.
func TestContractHTTPConventions(t *testing.T) {
	env, _ := realEnv(t)
	// A rate no loaded machine's slowness refills between two requests: one
	// token (burst 1), the next in 100 s.
	p := start(t, append(env, "INVENTORY_SECKILL_RATE=0.01")...)
	ctx := t.Context()
	st, body := p.answer(p.api.PutSKUWithResponse(ctx, "TEE", nil, client.PutSKUJSONRequestBody{Stock: 100}, client.BearerAuth(adminToken)))
	require.Equal(t, 200, st, body)

	created, err := p.api.CreateOrderWithResponse(ctx, &client.CreateOrderParams{XRequestID: new("trace-1")},
		client.CreateOrderJSONRequestBody{Items: []client.Item{{Sku: "TEE", Qty: 1}}}, p.as("alice"))
	st, order := p.answer(created, err)
	require.Equal(t, 201, st, order)
	require.Regexp(t, `^/v1/orders/[0-9a-f-]{36}$`, created.Headers201.Location)
	require.Equal(t, "trace-1", created.Headers201.XRequestID)
	// Raw: the Location is followed as a link, not rebuilt from the order's id.
	st, got := p.call("GET", created.Headers201.Location, "")
	require.Equal(t, 200, st, got)

	// Raw: too large a body, a method the path does not have, spoofed
	// forwarding headers.
	resp, raw := p.send("POST", "/v1/stock/deduct", `{"sku":"TEE","qty":1,"token":"`+strings.Repeat("x", 1<<17)+`"}`, http.Header{"Authorization": {"Bearer " + clientToken}})
	require.Equal(t, 413, resp.StatusCode, string(raw))
	require.Contains(t, string(raw), `"code":"payload_too_large"`)
	resp, raw = p.send("DELETE", "/v1/orders/x", "", http.Header{"Authorization": {"Bearer " + clientToken}})
	require.Equal(t, 405, resp.StatusCode, string(raw))
	require.Contains(t, string(raw), `"code":"method_not_allowed"`)
	require.Contains(t, resp.Header.Get("Allow"), "GET")

	codes := map[int]int{}
	for i := 0; i < 6; i++ {
		h := http.Header{"Authorization": {"Bearer " + clientToken}, "X-Buyer-Token": {p.buyer(fmt.Sprintf("u%d", i))},
			"X-Forwarded-For": {fmt.Sprintf("203.0.113.%d", i)}, "X-Real-Ip": {fmt.Sprintf("203.0.113.%d", i)}}
		resp, raw := p.send("POST", "/v1/seckill/TEE/buy", `{}`, h)
		codes[resp.StatusCode]++
		if resp.StatusCode == 429 {
			require.Equal(t, "100", resp.Header.Get("Retry-After"))
			require.Contains(t, string(raw), `"code":"rate_limited"`)
		}
	}
	require.Equal(t, map[int]int{201: 1, 429: 5}, codes, "one bucket for one address, however it dresses up")
}

// A payment provider retries webhooks: a callback replayed after the refund
// is answered from the order and pages nobody (nothing logged at error).
func TestContractReplayedCallbackAfterRefundIsQuiet(t *testing.T) {
	env, _ := realEnv(t)
	p := start(t, env...)
	ctx := t.Context()
	admin := client.BearerAuth(adminToken)
	st, body := p.answer(p.api.PutSKUWithResponse(ctx, "TEE", nil, client.PutSKUJSONRequestBody{Stock: 10}, admin))
	require.Equal(t, 200, st, body)
	st, order := p.answer(p.api.CreateOrderWithResponse(ctx, nil,
		client.CreateOrderJSONRequestBody{UserId: new("alice"), Items: []client.Item{{Sku: "TEE", Qty: 2}}}, p.as("alice")))
	require.Equal(t, 201, st, order)
	id := order["id"].(string)
	cb := client.PaymentCallbackJSONRequestBody{OrderId: id, PaymentId: "pay-r", Status: client.PaymentCallbackJSONBodyStatusSUCCESS}
	st, body = p.answer(p.api.PaymentCallbackWithResponse(ctx, signedAt(time.Now()), cb, signedBy(paymentSecret)))
	require.Equal(t, 200, st, body)
	p.waitSKU(skuView("TEE", 8, 0, 8, 0), 60*time.Second, "the payment is applied")
	st, body = p.answer(p.api.RefundOrderWithResponse(ctx, id, nil, admin))
	require.Equal(t, 200, st, body)
	p.waitSKU(skuView("TEE", 10, 0, 10, 0), 60*time.Second, "the refund is applied")
	for i := 0; i < 3; i++ {
		st, body = p.answer(p.api.PaymentCallbackWithResponse(ctx, signedAt(time.Now()), cb, signedBy(paymentSecret)))
		require.Equal(t, 200, st, body)
		require.Equal(t, "REFUNDED", body["status"])
	}
	p.requireSKU(skuView("TEE", 10, 0, 10, 0))
	p.stop()
	_, stderr := p.output()
	require.NotContains(t, stderr, `"level":"ERROR"`, stderr)
}

// migrate down rolls back one step, a contract step first; --all rolls
// back everything; up again restores the schema, and contract contracts
// it.
func TestContractMigrateDown(t *testing.T) {
	dsn := testenv.MySQLDatabase(t)
	db, err := sql.Open("mysql", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	migrate := func(args ...string) string {
		cmd := exec.Command(binary(t), append([]string{"migrate"}, args...)...)
		cmd.Env = []string{"INVENTORY_MYSQL_DSN=" + dsn}
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, string(out))
		return string(out)
	}
	version := func() int {
		var v int
		require.NoError(t, db.QueryRow(`SELECT COALESCE(MAX(version_id), 0) FROM goose_db_version WHERE is_applied`).Scan(&v))
		return v
	}
	// below is the version before v: numbers may skip one (a migration
	// another branch took).
	p, err := migrations.Provider(db, migrations.MySQL)
	require.NoError(t, err)
	below := func(v int) int {
		prev := 0
		for _, s := range p.ListSources() {
			if int(s.Version) < v {
				prev = int(s.Version)
			}
		}
		return prev
	}
	migrate("up") // a new database: contracted too
	top := version()
	require.GreaterOrEqual(t, top, 16)
	require.Equal(t, "migrate: rolled back contract step 2\n", migrate("down"))
	require.Equal(t, "migrate: rolled back contract step 1\n", migrate("down"))
	require.Equal(t, top, version())
	require.Equal(t, fmt.Sprintf("migrate: rolled back version %d\n", top), migrate("down"))
	require.Equal(t, below(top), version())
	require.Equal(t, fmt.Sprintf("migrate: rolled back version %d\n", below(top)), migrate("down"))
	require.Equal(t, below(below(top)), version())
	migrate("up") // no longer new: the contract waits to be asked for
	require.Equal(t, top, version())
	require.Equal(t, "migrate: contracted (2 steps applied)\n", migrate("contract"))
	require.Equal(t, "migrate: contracted (0 steps applied)\n", migrate("contract"))
	require.Equal(t, "migrate: rolled back every migration\n", migrate("down", "--all"))
	require.Equal(t, 0, version())
	require.Equal(t, "migrate: nothing to roll back\n", migrate("down"))
	cmd := exec.Command(binary(t), "migrate", "up", "--all")
	cmd.Env = []string{"INVENTORY_MYSQL_DSN=" + dsn}
	out, err := cmd.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "--all goes with down")
}

// make run says it is building before the first (slow) build, then serves
// and prints its banner.
func TestMakeRunSaysItIsBuilding(t *testing.T) {
	cmd := exec.Command("make", "-s", "run")
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "INVENTORY_HTTP_ADDR=127.0.0.1:0")
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // make, the script and the server: stop them all
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		_ = cmd.Wait()
	})
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "export INVENTORY_URL=") },
		3*time.Minute, 100*time.Millisecond, "the banner appears")
	text := out.String()
	building := strings.Index(text, "building inventoryd")
	require.GreaterOrEqual(t, building, 0, text)
	require.Less(t, building, strings.Index(text, "export INVENTORY_URL="), "it says so before anything else")
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// With a trusted proxy configured, its X-Forwarded-For names the client:
// buyers behind it each get their own bucket.
func TestContractTrustedProxy(t *testing.T) {
	env, _ := realEnv(t)
	p := start(t, append(env, "INVENTORY_SECKILL_RATE=1", "INVENTORY_TRUSTED_PROXIES=127.0.0.1")...)
	st, body := p.answer(p.api.PutSKUWithResponse(t.Context(), "TEE", nil, client.PutSKUJSONRequestBody{Stock: 100}, client.BearerAuth(adminToken)))
	require.Equal(t, 200, st, body)
	// Raw: the proxy's X-Forwarded-For, which the client does not send.
	codes := map[int]int{}
	for i := 0; i < 6; i++ {
		h := http.Header{"Authorization": {"Bearer " + clientToken}, "X-Buyer-Token": {p.buyer(fmt.Sprintf("u%d", i))},
			"X-Forwarded-For": {fmt.Sprintf("203.0.113.%d", i)}}
		resp, _ := p.send("POST", "/v1/seckill/TEE/buy", `{}`, h)
		codes[resp.StatusCode]++
	}
	require.Equal(t, map[int]int{201: 6}, codes)
}
