package httpapi_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// countBody is a count request's JSON.
func countBody(id string, at time.Time, lines string) string {
	return fmt.Sprintf(`{"count_id":%q,"counted_at":%q,"lines":[%s]}`, id, at.UTC().Format(time.RFC3339Nano), lines)
}

// The counts route is the admin's; bad input is 400 (413 past the size)
// and applies nothing, whatever line is bad; a count applies, answers each
// line, and answers a replay the same; its progress is readable.
func TestCountsRoute(t *testing.T) {
	a := embeddedApp(t)
	h := storefront(t, a)
	admin := []string{"Authorization", "Bearer " + a.Cfg.AdminToken}
	expect(t, h, "PUT", "/v1/skus/CNT-A", `{"stock":10}`, 200, skuBody("CNT-A", 10, 0, 10, 10, 0), admin...)
	time.Sleep(2 * time.Millisecond)
	at := time.Now().UTC()
	time.Sleep(2 * time.Millisecond)
	before := state(t, h) + fmt.Sprint(call(t, h, "GET", "/v1/skus/CNT-A", ""))

	code, _ := call(t, h, "POST", "/v1/stock/counts", countBody("c1", at, `{"sku":"CNT-A","counted":7}`))
	require.Equal(t, 403, code, "a client credential may not post a count")
	code, _ = call(t, h, "GET", "/v1/stock/counts/c1", "")
	require.Equal(t, 403, code)

	for _, c := range []struct{ body, msg string }{
		{countBody("c1", at, `{"sku":"CNT-A","counted":7},{"sku":"DEMO-PHONE","counted":-1}`), "line 2: counted must be between 0 and 1000000000000, got -1"},
		{countBody("c1", at, `{"sku":"CNT-A","counted":7},{"sku":"DEMO-PHONE","counted":"ten"}`), `field "lines.counted" must be an integer`},
		{countBody("c1", at, `{"sku":"CNT-A","counted":1.5}`), `field "lines.counted" must be an integer`},
		{countBody("c1", at, `{"sku":"CNT-A","counted":7,"location":"WH1"}`), `unknown field "location"`},
		{countBody("c1", at, `{"sku":"CNT-A","counted":7},{"sku":"CNT-A","counted":8}`), "line 2: CNT-A is counted on line 1 too; a count has one line per SKU"},
		{countBody("c1", at, `{"sku":"CNT-A"}`), "lines[0] needs sku and counted"},
		{countBody("c1", at, `{"sku":"CNT-A","counted":null}`), `field "lines[0].counted" must not be null (leave it out, or give it a value)`},
		{countBody("c1", at, ``), "a count request has 1 to 10000 lines, got 0 (send a larger count as several requests of the same count_id, each with its offset)"},
		{`{"count_id":"c1","lines":[{"sku":"CNT-A","counted":7}]}`, "missing required field(s): counted_at"},
		{`{"count_id":"c1","counted_at":"yesterday","lines":[{"sku":"CNT-A","counted":7}]}`, "counted_at must be an RFC 3339 time, e.g. 2025-01-02T02:00:00Z"},
	} {
		expect(t, h, "POST", "/v1/stock/counts", c.body, 400, errBody("invalid_argument", c.msg), admin...)
	}
	lines := make([]string, 10_001)
	for i := range lines {
		lines[i] = fmt.Sprintf(`{"sku":"S%d","counted":1}`, i)
	}
	code, body := call(t, h, "POST", "/v1/stock/counts", countBody("c1", at, strings.Join(lines, ",")), admin...)
	require.Equal(t, 413, code, body)
	require.Contains(t, body, "a count request carries at most 10000 lines")
	require.Equal(t, before, state(t, h)+fmt.Sprint(call(t, h, "GET", "/v1/skus/CNT-A", "")), "refused requests changed nothing")
	code, _ = call(t, h, "GET", "/v1/stock/counts/c1", "", admin...)
	require.Equal(t, 404, code, "and left no count")

	req := countBody("c1", at, `{"sku":"CNT-A","counted":7},{"sku":"NOPE","counted":3}`)
	code, first := call(t, h, "POST", "/v1/stock/counts", req, admin...)
	require.Equal(t, 200, code, first)
	var res struct {
		Totals map[string]int64
		Lines  []struct {
			Line    int64
			SKU     string
			Outcome string
			Applied int64
			Status  int
			Error   *struct{ Code string }
		}
	}
	require.NoError(t, json.Unmarshal([]byte(first), &res))
	require.Equal(t, "corrected", res.Lines[0].Outcome)
	require.EqualValues(t, -3, res.Lines[0].Applied)
	require.Equal(t, "unknown", res.Lines[1].Outcome)
	require.Equal(t, 404, res.Lines[1].Status)
	require.Equal(t, "not_found", res.Lines[1].Error.Code)
	expect(t, h, "GET", "/v1/skus/CNT-A", "", 200, skuBody("CNT-A", 7, 0, 7, 7, 0))

	expect(t, h, "POST", "/v1/stock/counts", req, 200, first, admin...) // a replay: the first answer
	code, _ = call(t, h, "POST", "/v1/stock/counts", countBody("c1", at, `{"sku":"CNT-A","counted":6},{"sku":"NOPE","counted":3}`), admin...)
	require.Equal(t, 409, code, "another body under the count's lines")
	expect(t, h, "GET", "/v1/skus/CNT-A", "", 200, skuBody("CNT-A", 7, 0, 7, 7, 0))

	code, body = call(t, h, "GET", "/v1/stock/counts/c1", "", admin...)
	require.Equal(t, 200, code, body)
	var p struct {
		Lines int64
		Done  bool
		Pages []map[string]int64
	}
	require.NoError(t, json.Unmarshal([]byte(body), &p))
	require.Equal(t, int64(2), p.Lines)
	require.True(t, p.Done)
	require.Equal(t, []map[string]int64{{"offset": 0, "lines": 2, "applied": 2}}, p.Pages)

	code, body = call(t, h, "GET", "/v1/skus/CNT-A/movements", "", admin...)
	require.Equal(t, 200, code, body)
	require.Contains(t, body, `"kind":"COUNT","on_hand_delta":-3,"reserved_delta":0`)
	require.Contains(t, body, `"reference":"count:c1:1"`)
}

// The shipped signal: a paid order ships once (a replay answers it as it
// is), with a client credential; a pending or refunded order does not.
func TestShipRoute(t *testing.T) {
	a := embeddedApp(t)
	h := storefront(t, a)
	admin := []string{"Authorization", "Bearer " + a.Cfg.AdminToken}
	code, body := call(t, h, "POST", "/v1/orders", `{"user_id":"alice","items":[{"sku":"DEMO-TSHIRT","qty":2}]}`)
	require.Equal(t, 201, code, body)
	var o struct {
		ID        string
		Status    string
		ShippedAt *time.Time `json:"shipped_at"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &o))
	code, body = call(t, h, "POST", "/v1/orders/"+o.ID+"/ship", "")
	require.Equal(t, 409, code, body)
	require.Contains(t, body, "is PENDING: only a PAID order ships")
	code, body = pay(t, a, o.ID, "pay-ship-1")
	require.Equal(t, 200, code, body)
	code, first := call(t, h, "POST", "/v1/orders/"+o.ID+"/ship", "")
	require.Equal(t, 200, code, first)
	require.NoError(t, json.Unmarshal([]byte(first), &o))
	require.Equal(t, "PAID", o.Status)
	require.NotNil(t, o.ShippedAt)
	code, again := call(t, h, "POST", "/v1/orders/"+o.ID+"/ship", "")
	require.Equal(t, 200, code)
	require.JSONEq(t, first, again)
	code, body = call(t, h, "POST", "/v1/orders/"+o.ID+"/refund", "", admin...)
	require.Equal(t, 200, code, body)
	code, body = call(t, h, "POST", "/v1/orders/"+o.ID+"/ship", "")
	require.Equal(t, 409, code, body)
	require.Contains(t, body, "a refunded order cannot be shipped")
	code, _ = call(t, h, "POST", "/v1/orders/no-such/ship", "")
	require.Equal(t, 404, code)
}
