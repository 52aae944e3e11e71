package httpapi_test

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// JSON null is a value of the wrong type, not "absent": a field is given
// with a value of its type or left out. Each null is refused with 400 and
// names the field; nothing changes (before issue 21, per_user_limit:null
// silently removed a SKU's limit and user_id:null was taken as absent).
func TestNullIsRefused(t *testing.T) {
	a := embeddedApp(t)
	h := storefront(t, a)
	admin := []string{"Authorization", "Bearer " + a.Cfg.AdminToken}
	alice := []string{"X-Buyer-Token", buyerToken(t, a, "alice")}
	before := state(t, h)
	msg := func(field string) string {
		return errBody("invalid_argument", `field "`+field+`" must not be null (leave it out, or give it a value)`)
	}
	for _, c := range []struct {
		method, path, body, field string
		header                    []string
	}{
		{"PUT", "/v1/skus/DEMO-PHONE", `{"stock":10,"per_user_limit":null}`, "per_user_limit", admin},
		{"PUT", "/v1/skus/DEMO-PHONE", `{"stock":null}`, "stock", admin},
		{"POST", "/v1/skus/DEMO-PHONE/adjust", `{"delta":5,"reason":"restock","reference":null}`, "reference", admin},
		{"POST", "/v1/skus/DEMO-PHONE/adjust", `{"delta":5,"reason":null}`, "reason", admin},
		{"POST", "/v1/orders", `{"user_id":null,"items":[{"sku":"DEMO-TSHIRT","qty":1}]}`, "user_id", alice},
		{"POST", "/v1/orders", `{"items":[{"sku":"DEMO-TSHIRT","qty":1},{"sku":"DEMO-EBOOK","qty":null}]}`, "items[1].qty", alice},
		{"POST", "/v1/orders", `{"items":null}`, "items", alice},
		{"POST", "/v1/seckill/DEMO-PHONE/buy", `{"user_id":null}`, "user_id", alice},
		{"POST", "/v1/stock/deduct", `{"sku":"DEMO-TSHIRT","qty":1,"token":null}`, "token", nil},
		{"POST", "/v1/stock/release", `{"sku":null,"token":"t"}`, "sku", nil},
	} {
		expect(t, h, c.method, c.path, c.body, 400, msg(c.field), c.header...)
	}
	// The body itself null: not an object.
	for _, path := range []string{"/v1/seckill/DEMO-PHONE/buy", "/v1/stock/deduct"} {
		expect(t, h, "POST", path, `null`, 400, errBody("invalid_argument", "request body must be a JSON object"), alice...)
	}
	require.Equal(t, before, state(t, h), "refused requests changed nothing")
	expect(t, h, "GET", "/v1/skus/DEMO-PHONE", "", 200, skuBody("DEMO-PHONE", 10, 0, 10, 10, 1), "the limit is still there")

	// Left out, an optional field takes its default: no limit, no reference.
	expect(t, h, "PUT", "/v1/skus/DEMO-PHONE", `{"stock":10}`, 200, skuBody("DEMO-PHONE", 10, 0, 10, 10, 0), admin...)
	expect(t, h, "POST", "/v1/skus/DEMO-PHONE/adjust", `{"delta":5,"reason":"restock"}`, 200, skuBody("DEMO-PHONE", 15, 0, 15, 15, 0), admin...)
}

// A path segment is read percent-decoded: DEMO%2DTSHIRT and DEMO-TSHIRT are
// the same characters (RFC 3986), so they name the same SKU; the same for
// order ids. A segment that decodes to something invalid is still 400.
func TestPercentEncodedPathSegments(t *testing.T) {
	a := embeddedApp(t)
	h := storefront(t, a)
	admin := []string{"Authorization", "Bearer " + a.Cfg.AdminToken}
	tshirt := skuBody("DEMO-TSHIRT", 100, 0, 100, 100, 0)
	expect(t, h, "GET", "/v1/skus/DEMO-TSHIRT", "", 200, tshirt)
	expect(t, h, "GET", "/v1/skus/DEMO%2DTSHIRT", "", 200, tshirt)
	expect(t, h, "GET", "/v1/skus/%44EMO-TSHIRT", "", 200, tshirt)
	expect(t, h, "PUT", "/v1/skus/DEMO%2dTSHIRT", `{"stock":90}`, 200, skuBody("DEMO-TSHIRT", 90, 0, 90, 90, 0), admin...)
	expect(t, h, "POST", "/v1/skus/DEMO%2DTSHIRT/adjust", `{"delta":1,"reason":"restock"}`, 200, skuBody("DEMO-TSHIRT", 91, 0, 91, 91, 0), admin...)
	code, body := call(t, h, "GET", "/v1/skus/DEMO%2DTSHIRT/movements", "", admin...)
	require.Equal(t, 200, code, body)

	code, body = call(t, h, "POST", "/v1/seckill/DEMO%2DPHONE/buy", `{"user_id":"alice"}`)
	require.Equal(t, 201, code, body)
	o := orderOf(t, body)
	require.Equal(t, "DEMO-PHONE", o["items"].([]any)[0].(map[string]any)["sku"])
	id := o["id"].(string)
	escaped := "%" + hexByte(id[0]) + id[1:] // its first character as %XX
	require.NotEqual(t, id, escaped)
	code, body = call(t, h, "GET", "/v1/orders/"+escaped, "")
	require.Equal(t, 200, code, body)
	require.Equal(t, id, orderOf(t, body)["id"])
	code, body = call(t, h, "POST", "/v1/orders/"+escaped+"/cancel", "", "X-Buyer-Token", buyerToken(t, a, "alice"))
	require.Equal(t, 200, code, body)
	require.Equal(t, "CANCELLED", orderOf(t, body)["status"])

	for _, bad := range []string{"BAD%7Bx%7D", "DEMO%2FTSHIRT"} {
		code, body = call(t, h, "GET", "/v1/skus/"+bad, "")
		require.Equal(t, 400, code, "%s: %s", bad, body)
		require.Contains(t, body, `"code":"invalid_argument"`, bad)
	}
}

func hexByte(b byte) string {
	const digits = "0123456789ABCDEF"
	return string([]byte{digits[b>>4], digits[b&0xf]})
}

// A created_from or created_to whose offset carries it out of the years
// 0001-9999 in UTC is refused with 400 (it answered 500 before issue 21);
// the extremes inside the range answer a correct page.
func TestOrderListTimesOutOfRange(t *testing.T) {
	a := embeddedApp(t)
	h := storefront(t, a)
	code, body := call(t, h, "POST", "/v1/orders", `{"user_id":"alice","items":[{"sku":"DEMO-TSHIRT","qty":1}]}`)
	require.Equal(t, 201, code, body)
	id := orderOf(t, body)["id"].(string)
	for _, q := range []string{"created_to=9999-12-31T23:00:00-02:00", "created_from=0001-01-01T00:00:00%2B01:00",
		"created_to=9999-12-31T23:59:59-00:01", "created_from=0000-12-31T23:00:00Z"} {
		name := "created_to"
		if q[:12] == "created_from" {
			name = "created_from"
		}
		expect(t, h, "GET", "/v1/orders?"+q, "", 400, errBody("invalid_argument", name+" must fall within the years 0001 to 9999 in UTC"))
	}
	for _, q := range []string{"created_to=9999-12-31T23:59:59.999999Z", "created_from=0001-01-01T00:00:01Z",
		"created_from=0001-01-01T00:00:00-01:00&created_to=9999-12-31T23:00:00%2B02:00"} {
		code, body := call(t, h, "GET", "/v1/orders?"+q, "")
		require.Equal(t, 200, code, "%s: %s", q, body)
		items := orderOf(t, body)["items"].([]any)
		require.Len(t, items, 1, q)
		require.Equal(t, id, items[0].(map[string]any)["id"], q)
	}
}
