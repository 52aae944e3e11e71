package httpapi_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/arbiter"
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
