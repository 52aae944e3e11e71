package httpapi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/app"
	"github.com/acme/inventory/internal/httpapi"
	"github.com/acme/inventory/testkit/testenv"
)

// send serves one request on h exactly as given and returns the recorder.
func send(t *testing.T, h http.Handler, method, path, body string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	h = validating(t, h) // the exchange is checked against openapi.yaml
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	checkAnswer(t, rec)
	return rec
}

// No state-changing route is open to anonymous callers: client routes take
// a client credential (any of those configured, or the admin token), admin
// routes the admin token only; a 401 names the scheme, and a client
// credential on an admin route is 403.
func TestCredentials(t *testing.T) {
	a, err := app.New(context.Background(), app.Config{
		HTTPAddr: "127.0.0.1:0", OrderTTL: 15 * time.Minute, ShutdownTimeout: 5 * time.Second, SeckillRate: 1e6,
		ClientTokens: []string{"c1-5b0e1c9f7a2d4e6b8c3f1a0d9e7b5c2a", "c2-1f3e5d7c9b2a4f6e8d0c1b3a5f7e9d2c"},
	}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	require.NoError(t, a.Start(context.Background()))
	t.Cleanup(func() { _ = a.Shutdown(context.Background()) })
	require.NoError(t, a.Seed(context.Background()))
	h := a.Handler()
	before := state(t, storefront(t, a))
	bearer := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }
	alice := []string{"X-Buyer-Token", buyerToken(t, a, "alice")}
	order := `{"user_id":"alice","items":[{"sku":"DEMO-TSHIRT","qty":1}]}`

	clientRoutes := []struct{ method, path, body string }{
		{"GET", "/v1/skus/DEMO-TSHIRT", ""},
		{"POST", "/v1/stock/deduct", `{"sku":"DEMO-TSHIRT","qty":1,"token":"x"}`},
		{"POST", "/v1/stock/commit", `{"sku":"DEMO-TSHIRT","token":"x"}`},
		{"POST", "/v1/stock/release", `{"sku":"DEMO-TSHIRT","token":"x"}`},
		{"POST", "/v1/orders", order},
		{"GET", "/v1/orders/o1", ""},
		{"POST", "/v1/orders/o1/cancel", ""},
		{"POST", "/v1/seckill/DEMO-TSHIRT/buy", `{"user_id":"alice"}`},
		{"GET", "/v1/skus", ""},
		{"GET", "/v1/orders", ""},
	}
	adminRoutes := []struct{ method, path, body string }{
		{"PUT", "/v1/skus/DEMO-TSHIRT", `{"stock":5}`},
		{"POST", "/v1/skus/DEMO-TSHIRT/adjust", `{"delta":5,"reason":"restock"}`},
		{"POST", "/v1/orders/o1/refund", ""},
		{"GET", "/v1/skus/DEMO-TSHIRT/movements", ""},
	}
	for _, r := range clientRoutes {
		for _, hdr := range [][]string{nil, bearer("nope"), bearer(""), {"Authorization", a.Cfg.ClientTokens[0]}, {"Authorization", "Basic " + a.Cfg.ClientTokens[0]}} {
			rec := send(t, h, r.method, r.path, r.body, append(hdr, alice...)...)
			require.Equal(t, 401, rec.Code, "%s %s %v: %s", r.method, r.path, hdr, rec.Body)
			require.Equal(t, `Bearer realm="inventory"`, rec.Header().Get("WWW-Authenticate"))
		}
	}
	for _, r := range adminRoutes {
		for _, hdr := range [][]string{nil, bearer("nope")} {
			rec := send(t, h, r.method, r.path, r.body, hdr...)
			require.Equal(t, 401, rec.Code, "%s %s %v: %s", r.method, r.path, hdr, rec.Body)
			require.Equal(t, `Bearer realm="inventory"`, rec.Header().Get("WWW-Authenticate"))
		}
		// A client credential is known, and not allowed here: 403, no challenge.
		for _, tok := range a.Cfg.ClientTokens {
			rec := send(t, h, r.method, r.path, r.body, bearer(tok)...)
			require.Equal(t, 403, rec.Code, "%s %s: %s", r.method, r.path, rec.Body)
			require.JSONEq(t, errBody("forbidden", "this route needs the admin token; a client credential may not call it"), rec.Body.String())
			require.Empty(t, rec.Header().Get("WWW-Authenticate"))
		}
	}
	require.Equal(t, before, state(t, storefront(t, a)), "refused requests changed nothing")

	// Both client credentials work (rotation), and so does the admin token.
	for _, tok := range []string{a.Cfg.ClientTokens[0], a.Cfg.ClientTokens[1], a.Cfg.AdminToken} {
		rec := send(t, h, "GET", "/v1/skus/DEMO-TSHIRT", "", bearer(tok)...)
		require.Equal(t, 200, rec.Code, rec.Body.String())
	}
	rec := send(t, h, "POST", "/v1/orders", order, append(bearer(a.Cfg.ClientTokens[1]), alice...)...)
	require.Equal(t, 201, rec.Code, rec.Body.String())

	// The callback's 401 names its own scheme.
	rec = send(t, h, "POST", "/v1/payments/callback", `{}`)
	require.Equal(t, 401, rec.Code)
	require.Equal(t, `HMAC-SHA256 realm="payments", headers="X-Timestamp X-Signature"`, rec.Header().Get("WWW-Authenticate"))
}

// A buyer cannot act as another: the buyer is the subject of a token signed
// with the configured key, a body user_id must match it, and an order is
// cancelled by its buyer (or an admin) only.
func TestBuyerIdentity(t *testing.T) {
	a := embeddedApp(t)
	h := a.Handler()
	client := []string{"Authorization", "Bearer " + a.Cfg.ClientTokens[0]}
	with := func(tok string) []string { return append(append([]string{}, client...), "X-Buyer-Token", tok) }
	// sign signs claims for this service from the storefront (the default
	// aud and iss) unless they say otherwise ("-": left out).
	sign := func(method jwt.SigningMethod, key any, claims jwt.MapClaims) string {
		for name, def := range map[string]string{"aud": "inventory", "iss": "storefront"} {
			if claims[name] == nil {
				claims[name] = def
			} else if claims[name] == "-" {
				delete(claims, name)
			}
		}
		tok, err := jwt.NewWithClaims(method, claims).SignedString(key)
		require.NoError(t, err)
		return tok
	}
	exp := time.Now().Add(time.Hour).Unix()
	key := []byte(a.Cfg.BuyerKey)
	unsigned, err := jwt.NewWithClaims(jwt.SigningMethodNone, jwt.MapClaims{"sub": "alice", "exp": exp}).SignedString(jwt.UnsafeAllowNoneSignatureType)
	require.NoError(t, err)
	before := state(t, storefront(t, a))
	for name, c := range map[string]struct {
		token, want string
	}{
		"missing":       {"", "invalid buyer token: the X-Buyer-Token header is required"},
		"garbage":       {"not-a-jwt", "invalid buyer token: it is malformed or not yet valid"},
		"other key":     {sign(jwt.SigningMethodHS256, []byte("another-key-0123456789abcdefghijklmnop"), jwt.MapClaims{"sub": "alice", "exp": exp}), "invalid buyer token: its signature does not verify with the configured key"},
		"alg none":      {unsigned, "invalid buyer token: its signature does not verify with the configured key"},
		"HS384":         {sign(jwt.SigningMethodHS384, key, jwt.MapClaims{"sub": "alice", "exp": exp}), "invalid buyer token: its signature does not verify with the configured key"},
		"expired":       {sign(jwt.SigningMethodHS256, key, jwt.MapClaims{"sub": "alice", "exp": time.Now().Add(-time.Hour).Unix()}), "invalid buyer token: it has expired"},
		"no exp":        {sign(jwt.SigningMethodHS256, key, jwt.MapClaims{"sub": "alice"}), "invalid buyer token: it must carry exp"},
		"not yet valid": {sign(jwt.SigningMethodHS256, key, jwt.MapClaims{"sub": "alice", "exp": exp, "nbf": exp - 60}), "invalid buyer token: it is malformed or not yet valid"},
		"bad subject":   {sign(jwt.SigningMethodHS256, key, jwt.MapClaims{"sub": "a b", "exp": exp}), "invalid buyer token: its sub must be a user id (1-64 characters of A-Z a-z 0-9 . _ : -)"},
		"empty subject": {sign(jwt.SigningMethodHS256, key, jwt.MapClaims{"exp": exp}), "invalid buyer token: its sub must be a user id (1-64 characters of A-Z a-z 0-9 . _ : -)"},
		"ten years":     {sign(jwt.SigningMethodHS256, key, jwt.MapClaims{"sub": "alice", "exp": time.Now().AddDate(10, 0, 0).Unix()}), "invalid buyer token: its exp is more than 24h ahead; sign buyer tokens for less"},
		"other aud":     {sign(jwt.SigningMethodHS256, key, jwt.MapClaims{"sub": "alice", "exp": exp, "aud": "search"}), `invalid buyer token: its aud must name "inventory"`},
		"no aud":        {sign(jwt.SigningMethodHS256, key, jwt.MapClaims{"sub": "alice", "exp": exp, "aud": "-"}), `invalid buyer token: its aud must name "inventory"`},
		"other iss":     {sign(jwt.SigningMethodHS256, key, jwt.MapClaims{"sub": "alice", "exp": exp, "iss": "elsewhere"}), `invalid buyer token: its iss must be "storefront"`},
		"no iss":        {sign(jwt.SigningMethodHS256, key, jwt.MapClaims{"sub": "alice", "exp": exp, "iss": "-"}), `invalid buyer token: its iss must be "storefront"`},
	} {
		for _, path := range []string{"/v1/orders", "/v1/seckill/DEMO-TSHIRT/buy"} {
			body := `{"items":[{"sku":"DEMO-TSHIRT","qty":1}]}`
			if strings.Contains(path, "seckill") {
				body = `{}`
			}
			rec := send(t, h, "POST", path, body, with(c.token)...)
			require.Equal(t, 401, rec.Code, "%s %s: %s", name, path, rec.Body)
			require.JSONEq(t, errBody("unauthorized", c.want), rec.Body.String(), name)
			require.Equal(t, `JWT realm="buyer", header="X-Buyer-Token"`, rec.Header().Get("WWW-Authenticate"))
		}
	}
	// A body naming another user than the token: 403, nothing reserved.
	rec := send(t, h, "POST", "/v1/orders", `{"user_id":"bob","items":[{"sku":"DEMO-TSHIRT","qty":1}]}`, with(buyerToken(t, a, "mallory"))...)
	require.Equal(t, 403, rec.Code, rec.Body.String())
	require.JSONEq(t, errBody("forbidden", "user_id does not match the buyer the X-Buyer-Token names"), rec.Body.String())
	rec = send(t, h, "POST", "/v1/seckill/DEMO-PHONE/buy", `{"user_id":"bob"}`, with(buyerToken(t, a, "mallory"))...)
	require.Equal(t, 403, rec.Code, rec.Body.String())
	require.Equal(t, before, state(t, storefront(t, a)), "refused requests changed nothing")

	// The token alone names the buyer.
	rec = send(t, h, "POST", "/v1/orders", `{"items":[{"sku":"DEMO-TSHIRT","qty":1}]}`, with(buyerToken(t, a, "bob"))...)
	require.Equal(t, 201, rec.Code, rec.Body.String())
	id := orderOf(t, rec.Body.String())["id"].(string)
	require.Equal(t, "bob", orderOf(t, rec.Body.String())["user_id"])

	// Only bob (or an admin) cancels bob's order.
	rec = send(t, h, "POST", "/v1/orders/"+id+"/cancel", "", with(buyerToken(t, a, "mallory"))...)
	require.Equal(t, 403, rec.Code, rec.Body.String())
	require.JSONEq(t, errBody("forbidden", "the order belongs to another buyer"), rec.Body.String())
	rec = send(t, h, "POST", "/v1/orders/"+id+"/cancel", "", client...)
	require.Equal(t, 401, rec.Code, rec.Body.String())
	rec = send(t, h, "GET", "/v1/orders/"+id, "", client...)
	require.Equal(t, "PENDING", orderOf(t, rec.Body.String())["status"])
	rec = send(t, h, "POST", "/v1/orders/"+id+"/cancel", "", with(buyerToken(t, a, "bob"))...)
	require.Equal(t, 200, rec.Code, rec.Body.String())
	require.Equal(t, "CANCELLED", orderOf(t, rec.Body.String())["status"])

	rec = send(t, h, "POST", "/v1/orders", `{"items":[{"sku":"DEMO-TSHIRT","qty":1}]}`, with(buyerToken(t, a, "carol"))...)
	require.Equal(t, 201, rec.Code, rec.Body.String())
	id = orderOf(t, rec.Body.String())["id"].(string)
	rec = send(t, h, "POST", "/v1/orders/"+id+"/cancel", "", "Authorization", "Bearer "+a.Cfg.AdminToken)
	require.Equal(t, 200, rec.Code, rec.Body.String())
}

// The HTTP conventions clients rely on: 201 with Location, X-Request-ID
// accepted (when sane) and echoed, 413 for an oversized body, 405 with its
// own code and Allow, Retry-After on 429.
func TestHTTPConventions(t *testing.T) {
	a := embeddedApp(t)
	h := storefront(t, a)

	rec := send(t, h, "POST", "/v1/orders", `{"user_id":"alice","items":[{"sku":"DEMO-TSHIRT","qty":1}]}`, "X-Request-ID", "req-42.a:b")
	require.Equal(t, 201, rec.Code, rec.Body.String())
	id := orderOf(t, rec.Body.String())["id"].(string)
	require.Equal(t, "/v1/orders/"+id, rec.Header().Get("Location"))
	require.Equal(t, "req-42.a:b", rec.Header().Get("X-Request-ID"))
	got := send(t, h, "GET", rec.Header().Get("Location"), "")
	require.Equal(t, 200, got.Code)
	require.Equal(t, id, orderOf(t, got.Body.String())["id"])

	rec = send(t, h, "POST", "/v1/seckill/DEMO-TSHIRT/buy", `{"user_id":"bob"}`)
	require.Equal(t, 201, rec.Code, rec.Body.String())
	require.Equal(t, "/v1/orders/"+orderOf(t, rec.Body.String())["id"].(string), rec.Header().Get("Location"))

	for _, bad := range []string{"", "has space", strings.Repeat("x", 129), "new\nline", "é"} {
		rec = send(t, h, "GET", "/healthz", "", "X-Request-ID", bad)
		require.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`, rec.Header().Get("X-Request-ID"), "%q is replaced by a fresh id", bad)
	}

	before := state(t, h)
	big := `{"sku":"DEMO-TSHIRT","qty":1,"token":"` + strings.Repeat("x", 70<<10) + `"}`
	for _, path := range []string{"/v1/stock/deduct", "/v1/orders", "/v1/payments/callback", "/v1/seckill/DEMO-TSHIRT/buy"} {
		rec = send(t, h, "POST", path, big)
		require.Equal(t, 413, rec.Code, path)
		require.JSONEq(t, errBody("payload_too_large", "request body larger than 65536 bytes"), rec.Body.String())
	}
	require.Equal(t, before, state(t, h))

	rec = send(t, h, "DELETE", "/v1/skus/DEMO-TSHIRT", "")
	require.Equal(t, 405, rec.Code)
	require.Equal(t, "method_not_allowed", orderOf(t, rec.Body.String())["error"].(map[string]any)["code"])
	require.ElementsMatch(t, []string{"GET", "PUT", "OPTIONS"}, strings.Split(strings.ReplaceAll(rec.Header().Get("Allow"), " ", ""), ","))
}

// The seckill rate limit counts the connection's address: X-Forwarded-For
// and X-Real-IP cannot buy a client a fresh bucket. A configured trusted
// proxy's X-Forwarded-For is believed (its client is the address it names);
// an untrusted one's is not. A 429 says when to retry.
func TestSeckillRateLimitTrustsOnlyConfiguredProxies(t *testing.T) {
	for _, c := range []struct {
		name    string
		proxies []string
		want    map[int]int
	}{
		{"default: remote address", nil, map[int]int{201: 1, 429: 9}},
		{"untrusted proxy", []string{"198.51.100.0/24"}, map[int]int{201: 1, 429: 9}},
		{"trusted proxy", []string{"192.0.2.7"}, map[int]int{201: 10}},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, err := app.New(context.Background(), app.Config{
				// A rate no loaded machine's slowness refills between two requests.
				HTTPAddr: "127.0.0.1:0", OrderTTL: 15 * time.Minute, ShutdownTimeout: 5 * time.Second, SeckillRate: 0.01,
				TrustedProxies: c.proxies,
			}, slog.New(slog.DiscardHandler))
			require.NoError(t, err)
			require.NoError(t, a.Start(context.Background()))
			t.Cleanup(func() { _ = a.Shutdown(context.Background()) })
			require.NoError(t, a.Seed(context.Background()))
			h := storefront(t, a)
			codes := map[int]int{}
			for i := 0; i < 10; i++ {
				req := httptest.NewRequest("POST", "/v1/seckill/DEMO-TSHIRT/buy", bytes.NewBufferString(fmt.Sprintf(`{"user_id":"u%d"}`, i)))
				req.RemoteAddr = "192.0.2.7:1234"
				req.Header.Set("X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i))
				req.Header.Set("X-Real-IP", fmt.Sprintf("203.0.113.%d", i))
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				checkAnswer(t, rec)
				codes[rec.Code]++
				if rec.Code == 429 {
					require.Equal(t, "100", rec.Header().Get("Retry-After"))
					require.JSONEq(t, errBody("rate_limited", "too many requests from this client; slow down"), rec.Body.String())
				}
			}
			require.Equal(t, c.want, codes)
		})
	}
}

// A failed request's log line carries the request id the caller sent, so an
// operator can find it from the client's report.
func TestRequestIDInLogs(t *testing.T) {
	var logs testenv.Logs
	a, err := app.New(context.Background(), app.Config{
		HTTPAddr: "127.0.0.1:0", OrderTTL: 15 * time.Minute, ShutdownTimeout: 5 * time.Second, SeckillRate: 1e6,
	}, slog.New(slog.NewJSONHandler(&logs, nil)))
	require.NoError(t, err)
	require.NoError(t, a.Start(context.Background()))
	require.NoError(t, a.Seed(context.Background()))
	h := storefront(t, a)
	require.NoError(t, a.Shutdown(context.Background())) // the database and Redis go away under the handler
	rec := send(t, h, "GET", "/v1/skus/DEMO-TSHIRT", "", "X-Request-ID", "trace-7f3a")
	require.Equal(t, 503, rec.Code, rec.Body.String())
	require.Equal(t, "trace-7f3a", rec.Header().Get("X-Request-ID"))
	require.Contains(t, logs.String(), `"msg":"dependency unavailable","request_id":"trace-7f3a"`)
}

// A broker outage degrades the sync, not the API: /readyz stays 200 and says
// so; a dependency the API needs makes it 503.
func TestReadinessDegradesTheSyncNotTheAPI(t *testing.T) {
	var redisDown error
	s := httpapi.New(httpapi.Config{
		Ready: func(context.Context) map[string]error { return map[string]error{"redis": redisDown, "database": nil} },
		Degraded: func(context.Context) map[string]error {
			return map[string]error{"sync": errors.New("12 stock messages unsent for over a minute")}
		},
	}, httpapi.Services{}, nil)
	readyz := func() *httptest.ResponseRecorder {
		// Not send: /readyz answers its map also on 503 (openapi.yaml), where
		// checkAnswer expects the error shape.
		rec := httptest.NewRecorder()
		validating(t, s.Handler()).ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
		return rec
	}
	rec := readyz()
	require.Equal(t, 200, rec.Code)
	require.JSONEq(t, `{"redis":"ok","database":"ok","sync":"degraded: 12 stock messages unsent for over a minute"}`, rec.Body.String())
	redisDown = errors.New("dial tcp 127.0.0.1:6379: connection refused")
	rec = readyz()
	require.Equal(t, 503, rec.Code)
	require.JSONEq(t, `{"redis":"dial tcp 127.0.0.1:6379: connection refused","database":"ok","sync":"degraded: 12 stock messages unsent for over a minute"}`, rec.Body.String())
}

// Requests without an X-Request-ID get one each, never the same twice, even
// from concurrent requests.
func TestRequestIDsAreUnique(t *testing.T) {
	h := embeddedApp(t).Handler()
	const n = 400
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids[i] = send(t, h, "GET", "/healthz", "").Header().Get("X-Request-ID")
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, id := range ids {
		require.NotEmpty(t, id)
		require.False(t, seen[id], "id %q given twice", id)
		seen[id] = true
	}
}
