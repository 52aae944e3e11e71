package httpapi_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A SKU answer carries its version as a strong ETag; PUT and adjust with
// If-Match apply only while the SKU is still at one of the listed versions
// (412 precondition_failed otherwise, nothing changed), so two operators
// editing one SKU cannot silently overwrite each other. Reservations do not
// change the version: buyers buying never fail an operator's write.
func TestIfMatchOnSKUWrites(t *testing.T) {
	a := embeddedApp(t)
	h := storefront(t, a)
	admin := []string{"Authorization", "Bearer " + a.Cfg.AdminToken}
	etag := func(method, path, body string, header ...string) (int, string, string) {
		t.Helper()
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Add(header[i], header[i+1])
		}
		rec := httptest.NewRecorder()
		validating(t, h).ServeHTTP(rec, req)
		checkAnswer(t, rec)
		return rec.Code, rec.Header().Get("ETag"), rec.Body.String()
	}
	code, v1, _ := etag("GET", "/v1/skus/DEMO-PHONE", "")
	require.Equal(t, 200, code)
	require.Equal(t, `"10.1"`, v1, "on_hand 10, per-user limit 1")

	// Buyers reserving do not move the version.
	code, _ = call(t, h, "POST", "/v1/orders", `{"user_id":"alice","items":[{"sku":"DEMO-PHONE","qty":1}]}`)
	require.Equal(t, 201, code)
	_, v, _ := etag("GET", "/v1/skus/DEMO-PHONE", "")
	require.Equal(t, v1, v)

	// Operator A adjusts under the version it read; B's PUT under the same,
	// now stale, version is refused and changes nothing.
	code, v2, _ := etag("POST", "/v1/skus/DEMO-PHONE/adjust", `{"delta":5,"reason":"restock"}`, append(admin, "If-Match", v1)...)
	require.Equal(t, 200, code)
	require.Equal(t, `"15.1"`, v2)
	before := state(t, h)
	code, _, body := etag("PUT", "/v1/skus/DEMO-PHONE", `{"stock":12,"per_user_limit":1}`, append(admin, "If-Match", v1)...)
	require.Equal(t, 412, code, body)
	require.JSONEq(t, errBody("precondition_failed", "precondition failed: DEMO-PHONE is at version 15.1 now"), body)
	code, _, _ = etag("POST", "/v1/skus/DEMO-PHONE/adjust", `{"delta":-1,"reason":"damaged"}`, append(admin, "If-Match", v1)...)
	require.Equal(t, 412, code)
	require.Equal(t, before, state(t, h), "refused writes changed nothing")

	// A list matches any of its tags; * any existing SKU; a weak tag never
	// (If-Match compares strongly); a malformed header is invalid.
	code, v3, _ := etag("PUT", "/v1/skus/DEMO-PHONE", `{"stock":12,"per_user_limit":1}`, append(admin, "If-Match", `"1.1", `+v2)...)
	require.Equal(t, 200, code)
	require.Equal(t, `"12.1"`, v3)
	code, _, _ = etag("PUT", "/v1/skus/DEMO-PHONE", `{"stock":12,"per_user_limit":2}`, append(admin, "If-Match", "W/"+v3)...)
	require.Equal(t, 412, code)
	code, _, _ = etag("PUT", "/v1/skus/DEMO-PHONE", `{"stock":12,"per_user_limit":2}`, append(admin, "If-Match", "*")...)
	require.Equal(t, 200, code)
	code, _, body = etag("PUT", "/v1/skus/NEW-SKU", `{"stock":1}`, append(admin, "If-Match", "*")...)
	require.Equal(t, 412, code, "* needs the SKU to exist")
	require.JSONEq(t, errBody("precondition_failed", "precondition failed: NEW-SKU does not exist"), body)
	code, _, _ = etag("PUT", "/v1/skus/DEMO-PHONE", `{"stock":12}`, append(admin, "If-Match", "12.2")...)
	require.Equal(t, 400, code, "an unquoted tag")
	code, _, _ = etag("GET", "/v1/skus/NEW-SKU", "")
	require.Equal(t, 404, code)

	// Without If-Match, writes apply as before.
	code, v4, _ := etag("PUT", "/v1/skus/DEMO-PHONE", `{"stock":20,"per_user_limit":2}`, admin...)
	require.Equal(t, 200, code)
	require.Equal(t, `"20.2"`, v4)
}
