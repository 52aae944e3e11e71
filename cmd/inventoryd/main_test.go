package main

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/client"
	"github.com/acme/inventory/testkit/testenv"
)

const (
	adminToken    = "e2e-admin-5b0e1c9f7a2d4e6b8c3f1a0d9e7b5c2a"
	clientToken   = "e2e-client-1f3e5d7c9b2a4f6e8d0c1b3a5f7e9d2c"
	clientToken2  = "e2e-client-9c8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f"
	paymentSecret = "e2e-payment-8d6f4b2a0c9e7d5b3f1a8c6e4d2b0f9a"
	buyerKey      = "e2e-buyers-3a5c7e9f1b2d4f6a8c0e2d4b6f8a1c3e"
)

// realEnv prepares a fresh database and topic (both made by the binary's
// migrate, as a user would) and Redis database, and returns the environment
// that points inventoryd at them.
func realEnv(t *testing.T) (env []string, db *sql.DB) {
	t.Helper()
	dsn := testenv.MySQLDatabase(t)
	topic := testenv.Unique("e2e")
	migrate := exec.Command(binary(t), "migrate", "up")
	migrate.Env = []string{"INVENTORY_MYSQL_DSN=" + dsn,
		"INVENTORY_ROCKETMQ_NAMESRV=" + testenv.RocketMQNamesrv(), "INVENTORY_ROCKETMQ_TOPIC=" + topic}
	out, err := migrate.CombinedOutput()
	require.NoError(t, err, string(out))
	require.Contains(t, string(out), "rocketmq: created topic "+topic+" with 8 queues", string(out))
	db, err = sql.Open("mysql", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })

	testenv.Redis(t) // flushed
	opt, err := redis.ParseURL(testenv.RedisURL())
	require.NoError(t, err)
	return []string{
		fmt.Sprintf("INVENTORY_REDIS_URL=redis://%s/%d", opt.Addr, testenv.RedisDB(t)),
		"INVENTORY_MYSQL_DSN=" + dsn,
		"INVENTORY_ROCKETMQ_NAMESRV=" + testenv.RocketMQNamesrv(),
		"INVENTORY_ROCKETMQ_TOPIC=" + topic,
		"INVENTORY_ADMIN_TOKEN=" + adminToken,
		"INVENTORY_CLIENT_TOKENS=" + clientToken + "," + clientToken2,
		"INVENTORY_PAYMENT_SECRET=" + paymentSecret,
		"INVENTORY_BUYER_KEY=" + buyerKey,
		"INVENTORY_SECKILL_RATE=1000",
		// These tests assert outcomes, not latency: a deadline far above
		// any answer on a loaded machine (TestPartitionIsAnsweredAndHealsByItself
		// runs the default).
		"INVENTORY_REQUEST_TIMEOUT=30s",
	}, db
}

// Every route, every error code and every documented bad input, against the
// real binary on the real servers. Each rejected request changes nothing.
func TestServeRealServers(t *testing.T) {
	env, db := realEnv(t)
	p := start(t, env...)
	ctx := t.Context()
	admin := client.BearerAuth(adminToken)
	auth := []string{"Authorization", "Bearer " + adminToken} // for raw requests

	st, body := p.answer(p.api.PutSKUWithResponse(ctx, "TEE", nil, client.PutSKUJSONRequestBody{Stock: 10, PerUserLimit: new(int64(0))}, admin))
	require.Equal(t, 200, st, body)
	require.Equal(t, skuView("TEE", 10, 0, 10, 0), body)
	st, _ = p.answer(p.api.PutSKUWithResponse(ctx, "PHONE", nil, client.PutSKUJSONRequestBody{Stock: 2, PerUserLimit: new(int64(1))}, admin))
	require.Equal(t, 200, st)

	// state is what a rejected request must leave untouched.
	state := func() string {
		_, tee := p.sku("TEE")
		_, phone := p.sku("PHONE")
		var orders, outbox, reservations int
		waitProjected(t, db) // the lean sale's orders and reservations are written after its commit
		require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM orders`).Scan(&orders))
		require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM stock_outbox`).Scan(&outbox))
		require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM stock_reservations`).Scan(&reservations))
		return fmt.Sprint(tee, phone, orders, outbox, reservations)
	}

	// The token API: a deduction holds units (reserved), a replay takes
	// nothing more, a release gives them back once.
	sent := time.Now()
	st, body = p.answer(p.api.DeductStockWithResponse(ctx, nil, client.DeductStockJSONRequestBody{Sku: "TEE", Qty: 2, Token: "d1"}))
	require.Equal(t, 200, st, body)
	first := body
	require.Equal(t, 8.0, body["result"], body)
	ends, err := time.Parse(time.RFC3339Nano, body["expires_at"].(string))
	require.NoError(t, err)
	require.WithinRange(t, ends, sent.Add(15*time.Minute-time.Second), time.Now().Add(15*time.Minute), "the hold ends the order TTL later")
	p.requireSKU(skuView("TEE", 10, 2, 8, 0))
	st, body = p.answer(p.api.DeductStockWithResponse(ctx, nil, client.DeductStockJSONRequestBody{Sku: "TEE", Qty: 2, Token: "d1"}))
	require.Equal(t, 200, st, body)
	require.Equal(t, first, body, "a replay returns the same outcome")
	p.requireSKU(skuView("TEE", 10, 2, 8, 0))
	st, body = p.answer(p.api.ReleaseStockWithResponse(ctx, nil, client.ReleaseStockJSONRequestBody{Sku: "TEE", Token: "d1"}))
	require.Equal(t, 200, st, body)
	require.Equal(t, map[string]any{"released": 2.0}, body)
	p.requireSKU(skuView("TEE", 10, 0, 10, 0))
	st, body = p.answer(p.api.ReleaseStockWithResponse(ctx, nil, client.ReleaseStockJSONRequestBody{Sku: "TEE", Token: "d1"}))
	require.Equal(t, 200, st, body)
	require.Equal(t, map[string]any{"released": 0.0}, body)
	p.requireSKU(skuView("TEE", 10, 0, 10, 0))

	// Deduct, commit: the sale reaches the database through RocketMQ, which
	// takes the units from on_hand and the reservation from reserved at once.
	st, body = p.answer(p.api.DeductStockWithResponse(ctx, nil, client.DeductStockJSONRequestBody{Sku: "TEE", Qty: 2, Token: "d2"}))
	require.Equal(t, 200, st, body)
	require.Equal(t, 8.0, body["result"], body)
	p.requireSKU(skuView("TEE", 10, 2, 8, 0))
	st, body = p.answer(p.api.CommitStockWithResponse(ctx, nil, client.CommitStockJSONRequestBody{Sku: "TEE", Token: "d2"}))
	require.Equal(t, 200, st, body)
	require.Equal(t, map[string]any{"committed": 2.0}, body)
	st, body = p.answer(p.api.CommitStockWithResponse(ctx, nil, client.CommitStockJSONRequestBody{Sku: "TEE", Token: "d2"}))
	require.Equal(t, 200, st, body)
	require.Equal(t, map[string]any{"committed": 2.0}, body, "a replayed commit returns the quantity again")
	p.waitSKU(skuView("TEE", 8, 0, 8, 0), 60*time.Second, "the commit reaches the database through RocketMQ")
	st, body = p.answer(p.api.ReleaseStockWithResponse(ctx, nil, client.ReleaseStockJSONRequestBody{Sku: "TEE", Token: "d2"}))
	require.Equal(t, 409, st, body)
	require.Equal(t, "conflict", errCode(body), "a sold reservation cannot be released")
	p.requireSKU(skuView("TEE", 8, 0, 8, 0))

	aliceOrder := client.CreateOrderJSONRequestBody{UserId: new("alice"), Items: []client.Item{{Sku: "TEE", Qty: 3}}}
	st, order := p.answer(p.api.CreateOrderWithResponse(ctx, &client.CreateOrderParams{IdempotencyKey: new("k1")}, aliceOrder, p.as("alice")))
	require.Equal(t, 201, st, order)
	require.Equal(t, "PENDING", order["status"])
	id := order["id"].(string)
	st, again := p.answer(p.api.CreateOrderWithResponse(ctx, &client.CreateOrderParams{IdempotencyKey: new("k1")}, aliceOrder, p.as("alice")))
	require.Equal(t, 201, st)
	require.Equal(t, id, again["id"], "the idempotency key returns the same order")
	p.requireSKU(skuView("TEE", 8, 3, 5, 0))

	// An order's id (or its late-payment token) used as a token-API token
	// names nothing: the release gives back 0 and the order keeps its units.
	for _, tok := range []string{id, id + ".late"} {
		st, body = p.answer(p.api.ReleaseStockWithResponse(ctx, nil, client.ReleaseStockJSONRequestBody{Sku: "TEE", Token: tok}))
		require.Equal(t, 200, st, body)
		require.Equal(t, map[string]any{"released": 0.0}, body, tok)
		p.requireSKU(skuView("TEE", 8, 3, 5, 0))
	}
	st, body = p.answer(p.api.GetOrderWithResponse(ctx, id, nil))
	require.Equal(t, 200, st, body)
	require.Equal(t, "PENDING", body["status"])

	// The payment provider's callback, replayed as it was signed.
	pay := client.PaymentCallbackJSONRequestBody{OrderId: id, PaymentId: "pay-1", Status: client.PaymentCallbackJSONBodyStatusSUCCESS}
	payAt := signedAt(time.Now())
	st, paid := p.answer(p.api.PaymentCallbackWithResponse(ctx, payAt, pay, signedBy(paymentSecret)))
	require.Equal(t, 200, st, paid)
	require.Equal(t, "PAID", paid["status"])
	st, replay := p.answer(p.api.PaymentCallbackWithResponse(ctx, payAt, pay, signedBy(paymentSecret)))
	require.Equal(t, 200, st, "a replayed callback is answered from the order")
	require.Equal(t, paid["paid_at"], replay["paid_at"])
	p.waitSKU(skuView("TEE", 5, 0, 5, 0), 60*time.Second, "the payment reaches the database through RocketMQ")

	st, body = p.answer(p.api.RefundOrderWithResponse(ctx, id, nil, admin))
	require.Equal(t, 200, st, body)
	require.Equal(t, "REFUNDED", body["status"])
	p.waitSKU(skuView("TEE", 8, 0, 8, 0), 60*time.Second, "the refund restores the database and Redis")

	st, bob := p.answer(p.api.CreateOrderWithResponse(ctx, nil, client.CreateOrderJSONRequestBody{UserId: new("bob"), Items: []client.Item{{Sku: "TEE", Qty: 1}}}, p.as("bob")))
	require.Equal(t, 201, st, bob)
	p.requireSKU(skuView("TEE", 8, 1, 7, 0))
	st, body = p.answer(p.api.CancelOrderWithResponse(ctx, bob["id"].(string), nil, p.as("bob")))
	require.Equal(t, 200, st)
	require.Equal(t, "CANCELLED", body["status"])
	st, body = p.answer(p.api.GetOrderWithResponse(ctx, bob["id"].(string), nil))
	require.Equal(t, 200, st)
	require.Equal(t, "CANCELLED", body["status"])
	p.requireSKU(skuView("TEE", 8, 0, 8, 0))

	buy := func(sku, user string) (int, map[string]any) {
		return p.answer(p.api.SeckillBuyWithResponse(ctx, sku, nil, client.SeckillBuyJSONRequestBody{UserId: new(user)}, p.as(user)))
	}
	st, _ = buy("PHONE", "u1")
	require.Equal(t, 201, st)
	st, body = buy("PHONE", "u1")
	require.Equal(t, 409, st)
	require.Equal(t, "conflict", errCode(body), "per-user limit")
	st, _ = buy("PHONE", "u2")
	require.Equal(t, 201, st)
	st, body = buy("PHONE", "u3")
	require.Equal(t, 409, st)
	require.Equal(t, "insufficient_stock", errCode(body), "sold out")
	p.requireSKU(skuView("PHONE", 2, 2, 0, 1))
	st, _ = p.answer(p.api.AdjustSKUWithResponse(ctx, "PHONE", nil, client.AdjustSKUJSONRequestBody{Delta: 1, Reason: "restock"}, admin))
	require.Equal(t, 200, st)
	p.requireSKU(skuView("PHONE", 3, 2, 1, 1))
	st, body = buy("PHONE", "u3")
	require.Equal(t, 201, st, "the restock cleared the sold-out flag: %v", body)
	p.requireSKU(skuView("PHONE", 3, 3, 0, 1))

	// Every documented bad input: its answer, and nothing changed. What the
	// checkout backend (or an operator, or the payment provider) could send
	// goes through the generated client. What it cannot send by design stays
	// raw (p.call): a body that is no value of the request's type (malformed
	// JSON, a wrong type, a missing, unknown or null field, a number past
	// int64, too large a body), a missing, stale or wrong signature on the
	// callback, a route the document does not have.
	before := state()
	big := `{"sku":"TEE","qty":1,"token":"` + strings.Repeat("x", 70<<10) + `"}`
	cb := fmt.Sprintf(`{"order_id":%q,"payment_id":"pay-1","status":"SUCCESS"}`, id) // pay's bytes
	hdr := signed(paymentSecret, time.Now(), cb)
	stale := signed(paymentSecret, time.Now().Add(-10*time.Minute), cb)
	wrongSig := []string{"X-Timestamp", hdr[1], "X-Signature", strings.Repeat("ab", 32)}
	raw := func(method, path, body string, header ...string) func() (int, map[string]any) {
		return func() (int, map[string]any) { return p.call(method, path, body, header...) }
	}
	cases := []struct {
		name   string
		send   func() (int, map[string]any)
		status int
		code   string
	}{
		{"malformed JSON", raw("POST", "/v1/stock/deduct", `{"sku":`), 400, "invalid_argument"},
		{"not an object", raw("POST", "/v1/stock/deduct", `[1,2]`), 400, "invalid_argument"},
		{"empty body", raw("POST", "/v1/stock/deduct", ``), 400, "invalid_argument"},
		{"trailing data", raw("POST", "/v1/stock/deduct", `{"sku":"TEE","qty":1,"token":"t"} {}`), 400, "invalid_argument"},
		{"qty as string", raw("POST", "/v1/stock/deduct", `{"sku":"TEE","qty":"1","token":"t"}`), 400, "invalid_argument"},
		{"qty as float", raw("POST", "/v1/stock/deduct", `{"sku":"TEE","qty":1.5,"token":"t"}`), 400, "invalid_argument"},
		{"negative qty", func() (int, map[string]any) {
			return p.answer(p.api.DeductStockWithResponse(ctx, nil, client.DeductStockJSONRequestBody{Sku: "TEE", Qty: -1, Token: "t"}))
		}, 400, "invalid_argument"},
		{"zero qty", func() (int, map[string]any) {
			return p.answer(p.api.DeductStockWithResponse(ctx, nil, client.DeductStockJSONRequestBody{Sku: "TEE", Qty: 0, Token: "t"}))
		}, 400, "invalid_argument"},
		{"huge qty", raw("POST", "/v1/stock/deduct", `{"sku":"TEE","qty":99999999999999999999,"token":"t"}`), 400, "invalid_argument"},
		{"missing token", raw("POST", "/v1/stock/deduct", `{"sku":"TEE","qty":1}`), 400, "invalid_argument"},
		{"unknown field", raw("POST", "/v1/stock/deduct", `{"sku":"TEE","qty":1,"token":"t","x":1}`), 400, "invalid_argument"},
		{"bad token", func() (int, map[string]any) {
			return p.answer(p.api.DeductStockWithResponse(ctx, nil, client.DeductStockJSONRequestBody{Sku: "TEE", Qty: 1, Token: "a b"}))
		}, 400, "invalid_argument"},
		{"body too large", raw("POST", "/v1/stock/deduct", big), 413, "payload_too_large"},
		{"unknown sku", func() (int, map[string]any) {
			return p.answer(p.api.DeductStockWithResponse(ctx, nil, client.DeductStockJSONRequestBody{Sku: "NOPE", Qty: 1, Token: "t"}))
		}, 404, "not_found"},
		{"unknown sku get", func() (int, map[string]any) { return p.sku("NOPE") }, 404, "not_found"},
		{"bad sku in path", func() (int, map[string]any) { return p.sku("BAD{x}") }, 400, "invalid_argument"},
		{"release: missing token", raw("POST", "/v1/stock/release", `{"sku":"TEE"}`), 400, "invalid_argument"},
		{"release: unknown sku", func() (int, map[string]any) {
			return p.answer(p.api.ReleaseStockWithResponse(ctx, nil, client.ReleaseStockJSONRequestBody{Sku: "NOPE", Token: "t"}))
		}, 404, "not_found"},
		{"release: bad token", func() (int, map[string]any) {
			return p.answer(p.api.ReleaseStockWithResponse(ctx, nil, client.ReleaseStockJSONRequestBody{Sku: "TEE", Token: "a b"}))
		}, 400, "invalid_argument"},
		{"deduct: released token", func() (int, map[string]any) {
			return p.answer(p.api.DeductStockWithResponse(ctx, nil, client.DeductStockJSONRequestBody{Sku: "TEE", Qty: 2, Token: "d1"}))
		}, 409, "conflict"},
		{"deduct: token reused for another qty", func() (int, map[string]any) {
			return p.answer(p.api.DeductStockWithResponse(ctx, nil, client.DeductStockJSONRequestBody{Sku: "TEE", Qty: 3, Token: "d2"}))
		}, 409, "conflict"},
		{"commit: missing token", raw("POST", "/v1/stock/commit", `{"sku":"TEE"}`), 400, "invalid_argument"},
		{"commit: unknown token", func() (int, map[string]any) {
			return p.answer(p.api.CommitStockWithResponse(ctx, nil, client.CommitStockJSONRequestBody{Sku: "TEE", Token: "never"}))
		}, 404, "not_found"},
		{"commit: released token", func() (int, map[string]any) {
			return p.answer(p.api.CommitStockWithResponse(ctx, nil, client.CommitStockJSONRequestBody{Sku: "TEE", Token: "d1"}))
		}, 409, "conflict"},
		{"commit: an order's id", func() (int, map[string]any) {
			return p.answer(p.api.CommitStockWithResponse(ctx, nil, client.CommitStockJSONRequestBody{Sku: "TEE", Token: id}))
		}, 409, "conflict"},
		{"admin: a client credential", func() (int, map[string]any) {
			return p.answer(p.api.PutSKUWithResponse(ctx, "TEE", nil, client.PutSKUJSONRequestBody{Stock: 1}))
		}, 403, "forbidden"},
		{"admin: wrong token", func() (int, map[string]any) {
			return p.answer(p.api.PutSKUWithResponse(ctx, "TEE", nil, client.PutSKUJSONRequestBody{Stock: 1}, client.BearerAuth("nope")))
		}, 401, "unauthorized"},
		{"admin: bad stock", func() (int, map[string]any) {
			return p.answer(p.api.PutSKUWithResponse(ctx, "TEE", nil, client.PutSKUJSONRequestBody{Stock: -5}, admin))
		}, 400, "invalid_argument"},
		{"admin: missing stock", raw("PUT", "/v1/skus/TEE", `{}`, auth...), 400, "invalid_argument"},
		{"admin: below committed", func() (int, map[string]any) {
			return p.answer(p.api.AdjustSKUWithResponse(ctx, "PHONE", nil, client.AdjustSKUJSONRequestBody{Delta: -3, Reason: "x"}, admin))
		}, 409, "conflict"},
		{"admin: adjust unknown", func() (int, map[string]any) {
			return p.answer(p.api.AdjustSKUWithResponse(ctx, "NOPE", nil, client.AdjustSKUJSONRequestBody{Delta: 1, Reason: "x"}, admin))
		}, 404, "not_found"},
		{"refund: a client credential", func() (int, map[string]any) { return p.answer(p.api.RefundOrderWithResponse(ctx, id, nil)) }, 403, "forbidden"},
		{"refund: not paid", func() (int, map[string]any) { return p.answer(p.api.RefundOrderWithResponse(ctx, id, nil, admin)) }, 409, "conflict"},
		{"order: no items", func() (int, map[string]any) {
			return p.answer(p.api.CreateOrderWithResponse(ctx, nil, client.CreateOrderJSONRequestBody{UserId: new("u"), Items: []client.Item{}}, p.as("u")))
		}, 400, "invalid_argument"},
		{"order: item without qty", raw("POST", "/v1/orders", `{"user_id":"u","items":[{"sku":"TEE"}]}`), 400, "invalid_argument"},
		{"order: huge qty", func() (int, map[string]any) {
			return p.answer(p.api.CreateOrderWithResponse(ctx, nil, client.CreateOrderJSONRequestBody{UserId: new("u"), Items: []client.Item{{Sku: "TEE", Qty: 100000}}}, p.as("u")))
		}, 400, "invalid_argument"},
		{"order: no buyer token", func() (int, map[string]any) {
			return p.answer(p.api.CreateOrderWithResponse(ctx, nil, client.CreateOrderJSONRequestBody{Items: []client.Item{{Sku: "TEE", Qty: 1}}}))
		}, 401, "unauthorized"},
		{"order: another buyer's user_id", func() (int, map[string]any) {
			return p.answer(p.api.CreateOrderWithResponse(ctx, nil, client.CreateOrderJSONRequestBody{UserId: new("bob"), Items: []client.Item{{Sku: "TEE", Qty: 1}}}, p.as("mallory")))
		}, 403, "forbidden"},
		{"order: not enough", func() (int, map[string]any) {
			return p.answer(p.api.CreateOrderWithResponse(ctx, nil, client.CreateOrderJSONRequestBody{UserId: new("u"), Items: []client.Item{{Sku: "TEE", Qty: 11}}}, p.as("u")))
		}, 409, "insufficient_stock"},
		{"order: unknown", func() (int, map[string]any) { return p.answer(p.api.GetOrderWithResponse(ctx, "nope", nil)) }, 404, "not_found"},
		{"cancel: refunded order", func() (int, map[string]any) {
			return p.answer(p.api.CancelOrderWithResponse(ctx, id, nil, p.as("alice")))
		}, 409, "conflict"},
		{"cancel: another buyer's order", func() (int, map[string]any) {
			return p.answer(p.api.CancelOrderWithResponse(ctx, id, nil, p.as("mallory")))
		}, 403, "forbidden"},
		{"callback: unsigned", raw("POST", "/v1/payments/callback", cb), 401, "unauthorized"},
		{"callback: wrong signature", raw("POST", "/v1/payments/callback", cb, wrongSig...), 401, "unauthorized"},
		{"callback: stale timestamp", raw("POST", "/v1/payments/callback", cb, stale...), 401, "unauthorized"},
		{"callback: body not signed", raw("POST", "/v1/payments/callback", cb+" ", hdr...), 401, "unauthorized"},
		{"callback: bad status", func() (int, map[string]any) {
			maybe := client.PaymentCallbackJSONRequestBody{OrderId: id, PaymentId: "pay-1", Status: "MAYBE"}
			return p.answer(p.api.PaymentCallbackWithResponse(ctx, signedAt(time.Now()), maybe, signedBy(paymentSecret)))
		}, 400, "invalid_argument"},
		{"callback: unknown order", func() (int, map[string]any) {
			unknownOrder := client.PaymentCallbackJSONRequestBody{OrderId: "nope", PaymentId: "pay-9", Status: client.PaymentCallbackJSONBodyStatusSUCCESS}
			return p.answer(p.api.PaymentCallbackWithResponse(ctx, signedAt(time.Now()), unknownOrder, signedBy(paymentSecret)))
		}, 404, "not_found"},
		{"seckill: no buyer token", func() (int, map[string]any) {
			return p.answer(p.api.SeckillBuyWithResponse(ctx, "TEE", nil, client.SeckillBuyJSONRequestBody{}))
		}, 401, "unauthorized"},
		{"seckill: sold out", func() (int, map[string]any) { return buy("PHONE", "u4") }, 409, "insufficient_stock"},
		{"unknown route", raw("GET", "/v1/nothing", ``), 404, "not_found"},
		{"admin: null per_user_limit", raw("PUT", "/v1/skus/PHONE", `{"stock":3,"per_user_limit":null}`, auth...), 400, "invalid_argument"},
		{"adjust: null reference", raw("POST", "/v1/skus/PHONE/adjust", `{"delta":1,"reason":"x","reference":null}`, auth...), 400, "invalid_argument"},
		{"seckill: null user_id", raw("POST", "/v1/seckill/PHONE/buy", `{"user_id":null}`, "X-Buyer-Token", p.buyer("u9")), 400, "invalid_argument"},
		{"orders: created_to past 9999 in UTC", func() (int, map[string]any) {
			to := time.Date(9999, 12, 31, 23, 0, 0, 0, time.FixedZone("", -2*60*60)) // 9999-12-31T23:00:00-02:00
			return p.answer(p.api.ListOrdersWithResponse(ctx, &client.ListOrdersParams{CreatedTo: &to}))
		}, 400, "invalid_argument"},
		{"orders: created_from before 0001 in UTC", func() (int, map[string]any) {
			from := time.Date(1, 1, 1, 0, 0, 0, 0, time.FixedZone("", 60*60)) // 0001-01-01T00:00:00+01:00
			return p.answer(p.api.ListOrdersWithResponse(ctx, &client.ListOrdersParams{CreatedFrom: &from}))
		}, 400, "invalid_argument"},
	}
	for _, c := range cases {
		st, body := c.send()
		require.Equal(t, c.status, st, "%s: %v", c.name, body)
		require.Equal(t, c.code, errCode(body), c.name)
		msg, _ := body["error"].(map[string]any)["message"].(string)
		require.NotEmpty(t, msg, "%s: a clear message", c.name)
		require.Equal(t, before, state(), "%s changed state", c.name)
	}

	// A percent-encoded path names the same SKU and order (RFC 3986): raw,
	// since the client spells a path one way.
	st, body = p.call("GET", "/v1/skus/PH%4FNE", "")
	require.Equal(t, 200, st, body)
	require.Equal(t, "PHONE", body["sku"])
	st, body = p.call("GET", "/v1/orders/%"+fmt.Sprintf("%02X", id[0])+id[1:], "")
	require.Equal(t, 200, st, body)
	require.Equal(t, id, body["id"])

	st, body = p.answer(p.api.ReadyzWithResponse(ctx, nil))
	require.Equal(t, 200, st)
	require.Equal(t, map[string]any{"redis": "ok", "database": "ok", "sync": "ok"}, body)
	resp, err := http.Get(p.base + "/metrics")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	resp, err = http.Get(p.base + "/openapi.yaml")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)

	p.stop()
	stdout, stderr := p.output()
	for _, secret := range []string{adminToken, paymentSecret} {
		require.NotContains(t, stdout+stderr, secret, "secrets never reach the output")
	}
}

// In real mode the service refuses to start without its secrets.
func TestRefusesToStartWithoutSecrets(t *testing.T) {
	cmd := exec.Command(binary(t))
	cmd.Env = []string{"INVENTORY_REDIS_URL=redis://127.0.0.1:6379/5", "INVENTORY_MYSQL_DSN=x:y@tcp(127.0.0.1:3306)/z",
		"INVENTORY_ROCKETMQ_NAMESRV=127.0.0.1:9876", "INVENTORY_HTTP_ADDR=127.0.0.1:0"}
	out, err := cmd.CombinedOutput()
	require.Error(t, err)
	for _, name := range []string{"INVENTORY_ADMIN_TOKEN", "INVENTORY_CLIENT_TOKENS", "INVENTORY_PAYMENT_SECRET", "INVENTORY_BUYER_KEY"} {
		require.Contains(t, string(out), name)
	}
}

// The embedded default, as `make run` starts it: a checkout from a new SKU to
// the database stock, through the API alone.
func TestEmbeddedCheckout(t *testing.T) {
	p := start(t)
	exports := p.exports()
	admin, secret := exports["ADMIN_TOKEN"], exports["PAYMENT_SECRET"]
	require.Equal(t, p.base, exports["INVENTORY_URL"])

	ctx := t.Context()
	st, body := p.answer(p.api.PutSKUWithResponse(ctx, "WALK", nil, client.PutSKUJSONRequestBody{Stock: 5}, client.BearerAuth(admin)))
	require.Equal(t, 200, st, body)
	walk := client.CreateOrderJSONRequestBody{Items: []client.Item{{Sku: "WALK", Qty: 2}}}
	st, order := p.answer(p.api.CreateOrderWithResponse(ctx, nil, walk, client.BuyerToken(exports["ALICE_TOKEN"])))
	require.Equal(t, 201, st, order)
	require.Equal(t, "alice", order["user_id"], "the buyer is the one the token names")
	p.requireSKU(skuView("WALK", 5, 2, 3, 0))
	pay := client.PaymentCallbackJSONRequestBody{OrderId: order["id"].(string), PaymentId: "walk-pay", Status: client.PaymentCallbackJSONBodyStatusSUCCESS}
	st, paid := p.answer(p.api.PaymentCallbackWithResponse(ctx, signedAt(time.Now()), pay, signedBy(secret)))
	require.Equal(t, 200, st, paid)
	require.Equal(t, "PAID", paid["status"])
	p.waitSKU(skuView("WALK", 3, 0, 3, 0), 20*time.Second, "the embedded queue applied the payment to the embedded database")
	_, demo := p.sku("DEMO-EBOOK")
	require.Equal(t, true, demo["unlimited"], "demo SKUs are seeded")
	p.stop()
}

// A second migrate finds the topic the first one created and leaves it.
func TestMigrateKeepsExistingTopic(t *testing.T) {
	env, _ := realEnv(t)
	migrate := exec.Command(binary(t), "migrate", "up")
	migrate.Env = env
	out, err := migrate.CombinedOutput()
	require.NoError(t, err, string(out))
	require.Regexp(t, `rocketmq: topic e2e_\d+ exists, left as it is`, string(out))
}

func TestMigrateRejectsUnknownDirection(t *testing.T) {
	out, err := exec.Command(binary(t), "migrate", "sideways").CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), `invalid argument "sideways"`)
}

// Two nodes on the same servers: node A answers a sold-out SKU from its local
// flag; a restock through node B clears that flag on A (the flag's own TTL is
// set to an hour here, so only B's restock can clear it, however slow the
// machine). Then reconcile, through the binary, finds no
// drift, reports an injected one (exit 2), repairs it, and finds none again;
// and a Redis that lost everything is rebuilt from the database, reservations
// included.
func TestTwoNodesAndReconcile(t *testing.T) {
	env, _ := realEnv(t)
	a := start(t, append(env, "INVENTORY_INSTANCE=node-a", "INVENTORY_SOLDOUT_TTL=1h")...)
	b := start(t, append(env, "INVENTORY_INSTANCE=node-b", "INVENTORY_SOLDOUT_TTL=1h")...)
	ctx := t.Context()
	admin := client.BearerAuth(adminToken)
	st, _ := a.answer(a.api.PutSKUWithResponse(ctx, "PHONE", nil, client.PutSKUJSONRequestBody{Stock: 1}, admin))
	require.Equal(t, 200, st)

	// buy is a seckill purchase of PHONE through node p for user.
	buy := func(p *proc, user string) (int, map[string]any) {
		return p.answer(p.api.SeckillBuyWithResponse(ctx, "PHONE", nil, client.SeckillBuyJSONRequestBody{UserId: new(user)}, p.as(user)))
	}
	st, first := buy(a, "u1")
	require.Equal(t, 201, st, first)
	st, _ = buy(a, "u2")
	require.Equal(t, 409, st, "sold out: node A raises its flag")
	st, body := buy(a, "u3")
	require.Equal(t, 409, st)
	require.Equal(t, "insufficient_stock", errCode(body))
	require.Contains(t, metrics(t, a), "inventory_seckill_soldout_flag_hits_total 1", "u3 was answered by the flag")

	st, _ = b.answer(b.api.AdjustSKUWithResponse(ctx, "PHONE", nil, client.AdjustSKUJSONRequestBody{Delta: 1, Reason: "restock"}, admin))
	require.Equal(t, 200, st)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if st, _ = buy(a, "u4"); st == 201 {
			break
		}
		require.True(t, time.Now().Before(deadline), "node A's flag was not cleared by node B's restock")
	}
	b.requireSKU(skuView("PHONE", 2, 2, 0, 0))
	a.stop()
	b.stop()

	reconcile := func(args ...string) (int, []map[string]any) {
		t.Helper()
		cmd := exec.Command(binary(t), append([]string{"reconcile"}, args...)...)
		cmd.Env = env
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else {
			require.NoError(t, err, stderr.String())
		}
		var reports []map[string]any
		for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
			if line == "" {
				continue
			}
			var r map[string]any
			require.NoError(t, json.Unmarshal([]byte(line), &r), "a JSON line: %q", line)
			reports = append(reports, r)
		}
		return code, reports
	}
	code, out := reconcile()
	require.Equal(t, 0, code, out)
	require.Empty(t, out)

	opt, err := redis.ParseURL(testenv.RedisURL())
	require.NoError(t, err)
	opt.DB = testenv.RedisDB(t) // the service's database, not flushed
	svc := redis.NewClient(opt)
	defer svc.Close()
	require.Equal(t, "0", svc.HGet(ctx, "inv:{PHONE}:stock", "a").Val(), "Redis holds on_hand - reserved")

	// Redis drifts: 3 units it does not have.
	require.NoError(t, svc.HSet(ctx, "inv:{PHONE}:stock", "a", 3).Err())
	drift := map[string]any{"sku": "PHONE", "on_hand": 2.0, "reserved": 2.0, "live_reservations": 2.0,
		"available": 0.0, "redis_available": 3.0, "buyers_differ": 0.0, "anomalies": 0.0, "problem": "redis", "repaired": false}
	code, out = reconcile()
	require.Equal(t, 2, code, out)
	require.Equal(t, []map[string]any{drift}, out)
	require.Equal(t, "3", svc.HGet(ctx, "inv:{PHONE}:stock", "a").Val(), "reconcile without --repair changes nothing")

	drift["repaired"] = true
	code, out = reconcile("--repair")
	require.Equal(t, 0, code, out)
	require.Equal(t, []map[string]any{drift}, out)
	require.Equal(t, "0", svc.HGet(ctx, "inv:{PHONE}:stock", "a").Val(), "the repair realigned Redis from the database")
	code, out = reconcile()
	require.Equal(t, 0, code, out)
	require.Empty(t, out)

	c := start(t, append(env, "INVENTORY_INSTANCE=node-c")...)
	c.requireSKU(skuView("PHONE", 2, 2, 0, 0))

	// Redis loses everything: a SKU it does not hold is not a drift, and the
	// next use initialises it from the database, counting the reservations.
	require.NoError(t, svc.FlushDB(ctx).Err())
	code, out = reconcile()
	require.Equal(t, 0, code, out)
	require.Empty(t, out)
	c.requireSKU(skuView("PHONE", 2, 2, 0, 0))
	st, body = buy(c, "u5")
	require.Equal(t, 409, st, body)
	require.Equal(t, "insufficient_stock", errCode(body), "the two held units stay held after the loss")
	st, body = c.answer(c.api.CancelOrderWithResponse(ctx, first["id"].(string), nil, c.as("u1")))
	require.Equal(t, 200, st, body)
	require.Equal(t, "CANCELLED", body["status"])
	c.requireSKU(skuView("PHONE", 2, 1, 1, 0))
	c.stop()
	code, out = reconcile()
	require.Equal(t, 0, code, out)
	require.Empty(t, out)
}

func metrics(t *testing.T, p *proc) string {
	t.Helper()
	resp, err := http.Get(p.base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	var b strings.Builder
	_, err = io.Copy(&b, resp.Body)
	require.NoError(t, err)
	return b.String()
}
