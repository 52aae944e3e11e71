package httpapi_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A path parameter is percent-decoded exactly once (issue 29). A single
// encoding of a valid character is that character (RFC 3986: %2D is "-",
// %41 is "A"), so it names the same SKU or order; a double encoding
// (%252D) or a literal "%" (%25) decodes to a name with a "%" in it, which
// no SKU or order id can have: 400, and nothing is addressed. Before the
// fix, W%252DX set the stock of W-X: the router matched on the decoded path
// and the handler decoded the parameter again.
func TestPathParametersDecodedOnce(t *testing.T) {
	a := embeddedApp(t)
	h := storefront(t, a)
	admin := []string{"Authorization", "Bearer " + a.Cfg.AdminToken}
	for _, sku := range []string{"W-X", "A-1"} {
		expect(t, h, "PUT", "/v1/skus/"+sku, `{"stock":10}`, 200, skuBody(sku, 10, 0, 10, 10, 0), admin...)
	}
	// snapshot is every SKU and order as an admin lists them: what a refused
	// request must leave as it was.
	snapshot := func() string {
		_, skus := call(t, h, "GET", "/v1/skus?limit=500", "", admin...)
		_, orders := call(t, h, "GET", "/v1/orders?limit=500", "", admin...)
		return skus + orders
	}
	order := func() string {
		code, body := call(t, h, "POST", "/v1/orders", `{"user_id":"alice","items":[{"sku":"A-1","qty":1}]}`)
		require.Equal(t, 201, code, body)
		return orderOf(t, body)["id"].(string)
	}
	alice := []string{"X-Buyer-Token", buyerToken(t, a, "alice")}
	badSKU := func(name string) string {
		return errBody("invalid_argument", fmt.Sprintf("sku must be 1-64 characters of A-Z a-z 0-9 . _ -, got %q", name))
	}
	badID := errBody("invalid_argument", "order id must be 1-40 characters of A-Z a-z 0-9 . _ : -")

	// Spellings of a name: the same name, or refused.
	same := func(name string) []string {
		return []string{name, "%" + hexByte(name[0]) + name[1:], strings.ToLower("%"+hexByte(name[0])) + name[1:]}
	}
	refused := func(name string) map[string]string { // spelling -> the one decoding
		return map[string]string{
			"%25" + hexByte(name[0]) + name[1:]: "%" + hexByte(name[0]) + name[1:], // double-encoded
			name + "%25":                        name + "%",                        // a literal %
			"%2525" + name:                      "%25" + name,
		}
	}

	type route struct {
		method, path, body string
		header             []string
		// ok checks a request that names the same thing; name is the
		// parameter's one decoding.
		ok func(t *testing.T, code int, body, name string)
	}
	skuIs := func(status int) func(*testing.T, int, string, string) {
		return func(t *testing.T, code int, body, name string) {
			require.Equal(t, status, code, body)
			var v map[string]any
			require.NoError(t, json.Unmarshal([]byte(body), &v))
			if items, ok := v["items"].([]any); ok { // an order
				v = items[0].(map[string]any)
			}
			require.Equal(t, name, v["sku"], body)
		}
	}
	skuRoutes := []route{
		{"PUT", "/v1/skus/%s", `{"stock":10}`, admin, skuIs(200)},
		{"POST", "/v1/skus/%s/adjust", `{"delta":1,"reason":"restock"}`, admin, skuIs(200)},
		{"GET", "/v1/skus/%s", "", nil, skuIs(200)},
		{"GET", "/v1/skus/%s/movements", "", admin, func(t *testing.T, code int, body, name string) {
			require.Equal(t, 200, code, body)
			require.Contains(t, body, `"sku":"`+name+`"`)
		}},
		{"POST", "/v1/seckill/%s/buy", `{"user_id":"bob"}`, nil, skuIs(201)},
	}
	for _, r := range skuRoutes {
		for _, name := range []string{"W-X", "A-1"} {
			for _, s := range same(name) {
				code, body := call(t, h, r.method, fmt.Sprintf(r.path, s), r.body, r.header...)
				r.ok(t, code, body, name)
			}
			before := snapshot()
			for s, decoded := range refused(name) {
				path := fmt.Sprintf(r.path, s)
				expect(t, h, r.method, path, r.body, 400, badSKU(decoded), r.header...)
			}
			require.Equal(t, before, snapshot(), "%s %s: a refused spelling addressed nothing", r.method, r.path)
		}
	}

	orderRoutes := []route{
		{"GET", "/v1/orders/%s", "", nil, nil},
		{"POST", "/v1/orders/%s/cancel", "", alice, nil},
		{"POST", "/v1/orders/%s/refund", "", admin, nil},
	}
	for _, r := range orderRoutes {
		id := order()
		for i, s := range same(id) {
			code, body := call(t, h, r.method, fmt.Sprintf(r.path, s), r.body, r.header...)
			// A PENDING order is not refundable, and a cancelled one is not
			// cancelled again: a 409 that names the order addressed it.
			if r.path == "/v1/orders/%s/refund" || r.path == "/v1/orders/%s/cancel" && i > 0 {
				require.Equal(t, 409, code, body)
				require.Contains(t, body, `"code":"conflict"`)
				require.Contains(t, body, "order "+id+" is ")
				continue
			}
			require.Equal(t, 200, code, body)
			require.Equal(t, id, orderOf(t, body)["id"])
		}
		before := snapshot()
		for s := range refused(id) {
			expect(t, h, r.method, fmt.Sprintf(r.path, s), r.body, 400, badID, r.header...)
		}
		require.Equal(t, before, snapshot(), "%s %s: a refused spelling addressed nothing", r.method, r.path)
	}
}

// FuzzPathAddressesItsOneDecoding: whatever the path segment, a request
// that succeeds addresses the SKU its single percent-decoding names, and no
// other SKU changes. PUT sets a stock no earlier input set, so a write that
// reached the wrong SKU shows.
func FuzzPathAddressesItsOneDecoding(f *testing.F) {
	for _, s := range []string{"W-X", "W%2DX", "W%252DX", "%41-1", "%2541-1", "W%25", "A%2F1", "%57%2dX",
		"%2557%252DX", "W%2d%58", "..", "A-1%00", "%E2%82%AC", "W-X%2F..%2FA-1"} {
		f.Add(s)
	}
	a := embeddedApp(f)
	h := a.Handler()
	admin := "Bearer " + a.Cfg.AdminToken
	send := func(t *testing.T, method, path, body string) (int, map[string]any) {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", admin)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		require.NotEqual(t, http.StatusInternalServerError, rec.Code, rec.Body.String())
		var v map[string]any
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &v), rec.Body.String())
		return rec.Code, v
	}
	levels := func(t *testing.T) map[string]any { // every SKU's on_hand, page by page
		out := map[string]any{}
		for cursor := ""; ; {
			code, v := send(t, "GET", "/v1/skus?limit=500&cursor="+cursor, "")
			require.Equal(t, 200, code, v)
			for _, it := range v["items"].([]any) {
				m := it.(map[string]any)
				out[m["sku"].(string)] = m["on_hand"]
			}
			if cursor, _ = v["next_cursor"].(string); cursor == "" {
				return out
			}
		}
	}
	for _, sku := range []string{"W-X", "A-1"} {
		req := httptest.NewRequest("PUT", "/v1/skus/"+sku, strings.NewReader(`{"stock":10}`))
		req.Header.Set("Authorization", admin)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		require.Equal(f, 200, rec.Code, rec.Body.String())
	}
	stockValue := 100
	f.Fuzz(func(t *testing.T, seg string) {
		// Only segments a client can send as one: printable ASCII without
		// the delimiters that end a segment or a path.
		for i := 0; i < len(seg); i++ {
			if c := seg[i]; c <= ' ' || c >= 0x7f || c == '/' || c == '?' || c == '#' {
				return
			}
		}
		path := "/v1/skus/" + seg
		if _, err := url.ParseRequestURI(path); err != nil {
			return // not a request a server would parse
		}
		name, err := url.PathUnescape(seg)
		require.NoError(t, err, "ParseRequestURI accepted it")

		code, v := send(t, "GET", path, "")
		if code == 200 {
			require.Equal(t, name, v["sku"], "GET %s answered another SKU", path)
		}
		before := levels(t)
		stockValue++
		code, v = send(t, "PUT", path, fmt.Sprintf(`{"stock":%d}`, stockValue))
		after := levels(t)
		if code == 200 {
			require.Equal(t, name, v["sku"], "PUT %s set another SKU", path)
			require.Equal(t, float64(stockValue), after[name])
		}
		for sku, onHand := range before {
			if sku != name || code != 200 {
				require.Equal(t, onHand, after[sku], "PUT %s (%d) changed %s", path, code, sku)
			}
		}
	})
}

// An order id is at most 40 characters, as orders.id stores it: a longer
// one names no order that could exist and is refused as malformed (it was
// a 404 once, when the order layer's rule allowed 64); one of 40 that names
// no order is a 404.
func TestOrderIDLongerThanItsColumnIsMalformed(t *testing.T) {
	a := embeddedApp(t)
	h := storefront(t, a)
	admin := []string{"Authorization", "Bearer " + a.Cfg.AdminToken}
	badID := errBody("invalid_argument", "order id must be 1-40 characters of A-Z a-z 0-9 . _ : -")
	for _, n := range []int{41, 64, 65} {
		expect(t, h, "GET", "/v1/orders/"+strings.Repeat("a", n), "", 400, badID)
		expect(t, h, "POST", "/v1/orders/"+strings.Repeat("a", n)+"/refund", "", 400, badID, admin...)
	}
	code, body := call(t, h, "GET", "/v1/orders/"+strings.Repeat("a", 40), "")
	require.Equal(t, 404, code, body)
}
