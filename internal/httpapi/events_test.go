package httpapi_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/client"
	"github.com/acme/inventory/internal/app"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/testkit/testenv"
)

// A put sets the low-stock threshold with the stock (a put sets every
// setting: one left out is 0, none); the SKU's answer shows it while one is
// set, and a put that takes the threshold to available announces
// sku.low_stock in its transaction.
func TestLowStockThresholdThroughTheAPI(t *testing.T) {
	a := embeddedApp(t)
	h := storefront(t, a)
	auth := []string{"Authorization", "Bearer " + a.Cfg.AdminToken}
	code, body := call(t, h, "PUT", "/v1/skus/LOW", `{"stock":10,"low_stock_threshold":3}`, auth...)
	require.Equal(t, 200, code, body)
	require.JSONEq(t, `{"sku":"LOW","on_hand":10,"reserved":0,"available":10,"redis_available":10,"unlimited":false,
		"per_user_limit":0,"low_stock_threshold":3}`, body)
	expect(t, h, "PUT", "/v1/skus/LOW", `{"stock":3,"low_stock_threshold":3}`, 200,
		`{"sku":"LOW","on_hand":3,"reserved":0,"available":3,"redis_available":3,"unlimited":false,"per_user_limit":0,"low_stock_threshold":3}`, auth...)
	events, err := arbiter.EventsOf(a.DB()).OfSKU("LOW")
	require.NoError(t, err)
	require.Len(t, events, 1)
	require.Equal(t, arbiter.EventLowStock, events[0].Type)
	require.EqualValues(t, 3, events[0].Available)
	expect(t, h, "PUT", "/v1/skus/LOW", `{"stock":3}`, 200, skuBody("LOW", 3, 0, 3, 3, 0), auth...)
	code, body = call(t, h, "PUT", "/v1/skus/LOW", `{"stock":3,"low_stock_threshold":-1}`, auth...)
	require.Equal(t, 400, code, body)
}

// The replay feed pages the numbered events in id order, after the last id
// a reader has, for every SKU or one; an event is there once the events
// job numbered it, and a malformed after is refused.
func TestEventFeedThroughTheAPI(t *testing.T) {
	a := embeddedApp(t)
	h := storefront(t, a)
	auth := []string{"Authorization", "Bearer " + a.Cfg.AdminToken}
	for _, put := range []string{`{"stock":0}`, `{"stock":2}`, `{"stock":0}`} {
		code, body := call(t, h, "PUT", "/v1/skus/FEED", put, auth...)
		require.Equal(t, 200, code, body)
	}
	for _, put := range []string{`{"stock":1}`, `{"stock":1,"low_stock_threshold":1}`} {
		code, body := call(t, h, "PUT", "/v1/skus/OTHER", put, auth...)
		require.Equal(t, 200, code, body)
	}
	feed := func(query string) []arbiter.Event {
		t.Helper()
		code, body := call(t, h, "GET", "/v1/events"+query, "")
		require.Equal(t, 200, code, body)
		var p struct{ Items []arbiter.Event }
		require.NoError(t, json.Unmarshal([]byte(body), &p))
		return p.Items
	}
	thresholds := func(evs []arbiter.Event) (out []string) {
		for _, e := range evs {
			if e.Type != arbiter.EventLevelChanged {
				out = append(out, e.SKU+" "+e.Type)
			}
		}
		return out
	}
	// The app's events job numbers them within about 200 ms.
	want := []string{"FEED sku.back_in_stock", "FEED sku.sold_out", "OTHER sku.low_stock"}
	require.Eventually(t, func() bool { return slices.Equal(want, thresholds(feed("?limit=500"))) }, 5*time.Second, 20*time.Millisecond)
	all := feed("?limit=500")
	page := feed("?limit=1")
	require.Equal(t, all[:1], page)
	require.Equal(t, all[1:], feed("?after="+strconv.FormatInt(*page[0].ID, 10)))
	require.Empty(t, feed("?after="+strconv.FormatInt(*all[len(all)-1].ID, 10)), "at the head")
	onlyFeed := feed("?sku=FEED")
	require.Equal(t, want[:2], thresholds(onlyFeed), "FEED's events only")
	for i, e := range onlyFeed {
		require.EqualValues(t, i+1, e.Seq, "in seq order")
	}

	expect(t, h, "GET", "/v1/events?after=-1", "", 400, errBody("invalid_argument", "after must be an event id (an integer, 0 or above)"))
	expect(t, h, "GET", "/v1/events?after=x", "", 400, errBody("invalid_argument", "after must be an event id (an integer, 0 or above)"))
	code, _ := call(t, h, "GET", "/v1/events?limit=501", "")
	require.Equal(t, 400, code)
	code, _ = call(t, http.Handler(a.Handler()), "GET", "/v1/events", "")
	require.Equal(t, 401, code, "the feed is for clients")
}

// Webhook subscriptions through the API (admin): a put is answered with
// the subscription and its delivery state, never its secret; what is
// refused (not https, a target on loopback, private, link-local or
// metadata addresses, by name too, an unknown event, a short secret) is a
// 400 that keeps nothing.
func TestWebhooksThroughTheAPI(t *testing.T) {
	a := embeddedApp(t)
	h := storefront(t, a)
	auth := []string{"Authorization", "Bearer " + a.Cfg.AdminToken}
	secret := strings.Repeat("s3cr3t", 6)
	put := func(id, url, events, secret string) (int, string) {
		return call(t, h, "PUT", "/v1/webhooks/"+id, `{"url":"`+url+`","secret":"`+secret+`","events":`+events+`}`, auth...)
	}
	for url, msg := range map[string]string{
		"http://93.184.215.14/hook":                 "url must be https",
		"https://127.0.0.1/hook":                    "loopback, private, link-local or metadata",
		"https://localhost:8443/hook":               "loopback, private, link-local or metadata",
		"https://10.0.0.8/hook":                     "loopback, private, link-local or metadata",
		"https://169.254.169.254/latest/meta-data/": "loopback, private, link-local or metadata",
		"https://[::1]/hook":                        "loopback, private, link-local or metadata",
		"https://user:pass@93.184.215.14/hook":      "must not carry credentials",
		"not a url":                                 "absolute https URL",
	} {
		code, body := put("w", url, `["sku.sold_out"]`, secret)
		require.Equal(t, 400, code, "%s: %s", url, body)
		require.Contains(t, body, msg, url)
	}
	code, body := put("w", "https://93.184.215.14/hook", `["sku.sold_out","sku.restocked"]`, secret)
	require.Equal(t, 400, code, body)
	require.Contains(t, body, `unknown event \"sku.restocked\"`)
	code, body = put("w", "https://93.184.215.14/hook", `["sku.sold_out"]`, "short")
	require.Equal(t, 400, code, body)
	require.Contains(t, body, "secret must be 32 to 255 characters")
	code, body = call(t, h, "GET", "/v1/webhooks", "", auth...)
	require.Equal(t, 200, code, body)
	require.JSONEq(t, `{"items":[]}`, body, "nothing refused was kept")

	code, body = put("w", "https://93.184.215.14/hook", `["sku.sold_out","sku.back_in_stock","sku.sold_out"]`, secret)
	require.Equal(t, 200, code, body)
	require.NotContains(t, body, secret)
	var v map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &v))
	require.Equal(t, "active", v["state"])
	require.Equal(t, []any{"sku.back_in_stock", "sku.sold_out"}, v["events"])
	require.Equal(t, []any{}, v["skus"])
	require.EqualValues(t, 0, v["backlog"])
	code, body = call(t, h, "GET", "/v1/webhooks/w", "", auth...)
	require.Equal(t, 200, code, body)
	require.NotContains(t, body, secret)
	code, body = call(t, h, "GET", "/v1/webhooks", "", auth...)
	require.Equal(t, 200, code, body)
	require.Contains(t, body, `"id":"w"`)
	code, body = call(t, h, "GET", "/v1/webhooks/w", "")
	require.Equal(t, 403, code, "subscriptions are the admin's: %s", body)

	code, body = call(t, h, "DELETE", "/v1/webhooks/w", "", auth...)
	require.Equal(t, 200, code, body)
	require.Contains(t, body, `"id":"w"`)
	code, body = call(t, h, "GET", "/v1/webhooks/w", "", auth...)
	require.Equal(t, 404, code, body)
	code, body = call(t, h, "DELETE", "/v1/webhooks/w", "", auth...)
	require.Equal(t, 404, code, body)
}

// Deliveries through the API on the embedded default, as docs/examples.md
// walks them (plain http and a loopback receiver allowed by the
// operator): a subscription's events reach the receiver as the feed
// serves them, byte for byte, signed so the client's VerifyWebhook
// accepts them; its state shows where it is; resume is the admin's and
// answers the subscription; the secret shows in no answer and no log
// line; the metrics count the deliveries and the oldest undelivered age.
func TestWebhookDeliveriesThroughTheAPI(t *testing.T) {
	var logs testenv.Logs
	a, err := app.New(context.Background(), app.Config{
		HTTPAddr: "127.0.0.1:0", OrderTTL: 15 * time.Minute, ShutdownTimeout: 5 * time.Second, SeckillRate: 1e6,
		WebhookAllowHTTP: true, WebhookAllowPrivate: true,
	}, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	require.NoError(t, err)
	require.NoError(t, a.Start(context.Background()))
	t.Cleanup(func() { _ = a.Shutdown(context.Background()) })
	h := storefront(t, a)
	auth := []string{"Authorization", "Bearer " + a.Cfg.AdminToken}
	secret := "hooksecret-" + strings.Repeat("9f8e7d", 6)

	var mu sync.Mutex
	var bodies []string
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err == nil {
			_, err = client.VerifyWebhook([]byte(secret), r.Header, body, time.Now(), 0)
		}
		if err != nil {
			t.Errorf("a delivery does not verify: %v", err)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		mu.Lock()
		bodies = append(bodies, string(body))
		mu.Unlock()
	}))
	defer receiver.Close()
	code, body := call(t, h, "PUT", "/v1/webhooks/shop", `{"url":"`+receiver.URL+`/stock","secret":"`+secret+`","events":["sku.sold_out","sku.back_in_stock"],"skus":["HOOK"]}`, auth...)
	require.Equal(t, 200, code, body)
	for _, put := range []string{`{"stock":1}`, `{"stock":0}`, `{"stock":2}`} {
		code, body := call(t, h, "PUT", "/v1/skus/HOOK", put, auth...)
		require.Equal(t, 200, code, body)
	}
	code, body = call(t, h, "PUT", "/v1/skus/OTHER", `{"stock":0}`, auth...)
	require.Equal(t, 200, code, body)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(bodies) == 2
	}, 30*time.Second, 10*time.Millisecond, "sold out and back in stock delivered")
	code, body = call(t, h, "GET", "/v1/events?sku=HOOK", "")
	require.Equal(t, 200, code, body)
	var feed struct{ Items []json.RawMessage }
	require.NoError(t, json.Unmarshal([]byte(body), &feed))
	var subscribed []string
	for _, item := range feed.Items {
		var e arbiter.Event
		require.NoError(t, json.Unmarshal(item, &e))
		if e.Type != arbiter.EventLevelChanged {
			subscribed = append(subscribed, string(item))
		}
	}
	mu.Lock()
	require.Equal(t, subscribed, bodies, "the feed's objects, byte for byte, in its order")
	mu.Unlock()

	var v map[string]any
	require.Eventually(t, func() bool {
		code, body = call(t, h, "GET", "/v1/webhooks/shop", "", auth...)
		require.Equal(t, 200, code, body)
		require.NoError(t, json.Unmarshal([]byte(body), &v))
		return v["backlog"] == 0.0 && v["last_success_at"] != nil
	}, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, "active", v["state"])
	require.EqualValues(t, 0, v["attempts"])
	require.Positive(t, v["delivered_id"])
	require.NotContains(t, body, secret)

	code, body = call(t, h, "POST", "/v1/webhooks/shop/resume", "", auth...)
	require.Equal(t, 200, code, body)
	require.Contains(t, body, `"state":"active"`)
	require.NotContains(t, body, secret)
	code, body = call(t, h, "POST", "/v1/webhooks/nope/resume", "", auth...)
	require.Equal(t, 404, code, body)
	code, body = call(t, h, "POST", "/v1/webhooks/shop/resume", "")
	require.Equal(t, 403, code, "resume is the admin's: %s", body)

	rec := httptest.NewRecorder()
	a.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	require.Equal(t, 200, rec.Code)
	body = rec.Body.String()
	require.Contains(t, body, `inventory_webhook_deliveries_total{result="delivered"} 2`)
	require.Contains(t, body, `inventory_webhook_deliveries_total{result="refused"} 0`)
	require.Contains(t, body, `inventory_webhook_oldest_undelivered_seconds{subscription="shop"} 0`)
	require.NotContains(t, logs.String(), secret, "the secret is never logged")
}
