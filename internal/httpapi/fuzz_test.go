package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/app"
)

// embeddedApp is the embedded default in-process, seeded with the demo SKUs.
func embeddedApp(t testing.TB) *app.App {
	t.Helper()
	a, err := app.New(context.Background(), app.Config{
		HTTPAddr: "127.0.0.1:0", OrderTTL: 15 * time.Minute, ShutdownTimeout: 5 * time.Second, SeckillRate: 1e6,
	}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	require.NoError(t, a.Start(context.Background()))
	t.Cleanup(func() { _ = a.Shutdown(context.Background()) })
	require.NoError(t, a.Seed(context.Background()))
	return a
}

// state is what a rejected request must leave as it was.
func state(t testing.TB, h http.Handler) string {
	t.Helper()
	out := ""
	for _, sku := range []string{"DEMO-TSHIRT", "DEMO-PHONE", "DEMO-EBOOK"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/skus/"+sku, nil))
		out += rec.Body.String()
	}
	return out
}

// checkAnswer: never a 500, always JSON, an error body with a code when not 2xx.
func checkAnswer(t *testing.T, rec *httptest.ResponseRecorder) {
	require.NotEqual(t, http.StatusInternalServerError, rec.Code, rec.Body.String())
	var body map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), "answers are JSON: %q", rec.Body.String())
	if rec.Code >= 400 {
		e, ok := body["error"].(map[string]any)
		require.True(t, ok, "error shape: %v", body)
		require.NotEmpty(t, e["code"])
		require.NotEmpty(t, e["message"])
		require.NotRegexp(t, `(^|: )(inventory|stock|order|tokens|mq|identity|app): `, e["message"], "messages carry no Go package names")
	}
}

func fuzzRoute(f *testing.F, path string, seeds ...string) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	a := embeddedApp(f)
	h := storefront(f, a)
	f.Fuzz(func(t *testing.T, body []byte) {
		before := state(t, h)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", path, bytes.NewReader(body)))
		checkAnswer(t, rec)
		if rec.Code >= 400 {
			require.Equal(t, before, state(t, h), "a rejected request changed state: %q -> %d", body, rec.Code)
		}
	})
}

func FuzzDeductRoute(f *testing.F) {
	fuzzRoute(f, "/v1/stock/deduct",
		`{"sku":"DEMO-TSHIRT","qty":1,"token":"t1"}`, `{"sku":"DEMO-TSHIRT","qty":-1,"token":"t"}`,
		`{"sku":"DEMO-TSHIRT","qty":1e400,"token":"t"}`, `{"sku":"DEMO-PHONE","qty":11,"token":"t"}`,
		`{"sku":"NOPE","qty":1,"token":"t"}`, `{"sku":"DEMO-TSHIRT","qty":"1","token":"t"}`, `{"sku":null}`,
		`[]`, `{`, ``, `{"sku":"DEMO-TSHIRT","qty":1,"token":"t"}x`, "{\"sku\":\"\u0000\",\"qty\":1,\"token\":\"t\"}",
		`{"sku":"DEMO-EBOOK","qty":10000,"token":"u"}`, `{"sku":"DEMO-TSHIRT","qty":1,"token":"t","token":"t2"}`)
}

func FuzzOrderRoute(f *testing.F) {
	fuzzRoute(f, "/v1/orders",
		`{"user_id":"u1","items":[{"sku":"DEMO-TSHIRT","qty":1}]}`, `{"user_id":"u1","items":[]}`,
		`{"user_id":"u1","items":[{"sku":"DEMO-TSHIRT","qty":1},{"sku":"NOPE","qty":1}]}`,
		`{"user_id":"u1","items":[{"sku":"DEMO-PHONE","qty":5},{"sku":"DEMO-TSHIRT","qty":1}]}`,
		`{"user_id":"","items":[{"sku":"DEMO-TSHIRT","qty":1}]}`, `{"items":null}`, `{"user_id":1}`)
}

func FuzzPaymentCallback(f *testing.F) {
	for _, s := range []string{`{"order_id":"x","payment_id":"p","status":"SUCCESS"}`, `{`, ``} {
		f.Add([]byte(s), "1700000000", "00")
	}
	a := embeddedApp(f)
	h := storefront(f, a)
	f.Fuzz(func(t *testing.T, body []byte, ts, sig string) {
		before := state(t, h)
		req := httptest.NewRequest("POST", "/v1/payments/callback", bytes.NewReader(body))
		req.Header.Set("X-Timestamp", ts)
		req.Header.Set("X-Signature", sig)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		checkAnswer(t, rec)
		require.Equal(t, http.StatusUnauthorized, rec.Code, "an unsigned callback never gets through")
		require.Equal(t, before, state(t, h))
	})
}

// The same embedded app answers the documented errors of every route class.
func TestEmbeddedErrorShape(t *testing.T) {
	h := storefront(t, embeddedApp(t))
	for _, c := range []struct {
		method, path, body string
		status             int
	}{
		{"GET", "/v1/skus/NOPE", "", 404},
		{"PUT", "/v1/skus/X", `{"stock":1}`, 403}, // the storefront's client credential on an admin route
		{"POST", "/v1/orders", `{"user_id":"u","items":[{"sku":"DEMO-PHONE","qty":11}]}`, 409},
		{"DELETE", "/v1/orders/x", "", 405},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(c.method, c.path, bytes.NewBufferString(c.body)))
		require.Equal(t, c.status, rec.Code, fmt.Sprint(c, rec.Body.String()))
		checkAnswer(t, rec)
	}
}

// The seckill route limits each client; the answer is 429 rate_limited.
func TestSeckillRateLimit(t *testing.T) {
	a, err := app.New(context.Background(), app.Config{
		// A rate no loaded machine's slowness refills between two requests.
		HTTPAddr: "127.0.0.1:0", OrderTTL: 15 * time.Minute, ShutdownTimeout: 5 * time.Second, SeckillRate: 0.01,
	}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	require.NoError(t, a.Start(context.Background()))
	defer a.Shutdown(context.Background())
	require.NoError(t, a.Seed(context.Background()))
	h := storefront(t, a)
	codes := map[int]int{}
	for i := 0; i < 5; i++ {
		req := httptest.NewRequest("POST", "/v1/seckill/DEMO-TSHIRT/buy", bytes.NewBufferString(fmt.Sprintf(`{"user_id":"u%d"}`, i)))
		req.RemoteAddr = "192.0.2.7:1234"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		checkAnswer(t, rec)
		codes[rec.Code]++
		if rec.Code == 429 {
			require.Contains(t, rec.Body.String(), `"rate_limited"`)
		}
	}
	require.Equal(t, map[int]int{201: 1, 429: 4}, codes, "the burst (one at this rate), then 429")
}

// When the database goes away, requests that need it get 503 unavailable
// with Retry-After, not 500.
func TestDependencyDownIs503(t *testing.T) {
	a := embeddedApp(t)
	h := storefront(t, a)
	require.NoError(t, a.Shutdown(context.Background())) // closes Redis and the database under the handler
	for _, path := range []string{"/v1/skus/DEMO-TSHIRT", "/v1/orders/o1"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		require.Equal(t, http.StatusServiceUnavailable, rec.Code, "%s: %s", path, rec.Body.String())
		checkAnswer(t, rec)
		require.Contains(t, rec.Body.String(), `"unavailable"`)
		require.Equal(t, "1", rec.Header().Get("Retry-After"), "a 503 says when to retry (docs/SPEC.md section 5)")
	}
}
