package httpapi_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/identity"
)

type orderAnswer struct {
	ID        string    `json:"id"`
	Status    string    `json:"status"`
	ExpiresAt time.Time `json:"expires_at"`
	CreatedAt time.Time `json:"created_at"`
}

func orderAns(t *testing.T, body string) orderAnswer {
	t.Helper()
	var o orderAnswer
	require.NoError(t, json.Unmarshal([]byte(body), &o), body)
	return o
}

// Holds through the API: hold_seconds sizes an order's (and a seckill
// order's, and a token's) hold; an extension moves it for the order's buyer
// or an admin, answers a replayed key with the first deadline, and refuses
// (with the documented codes) everything else without changing anything.
func TestHoldsThroughTheAPI(t *testing.T) {
	a := embeddedApp(t)
	h := storefront(t, a)
	admin := "Bearer " + a.Cfg.AdminToken

	code, body := call(t, h, "POST", "/v1/orders", `{"user_id":"alice","items":[{"sku":"DEMO-TSHIRT","qty":1}],"hold_seconds":120}`)
	require.Equal(t, 201, code, body)
	o := orderAns(t, body)
	require.Equal(t, o.CreatedAt.Add(120*time.Second), o.ExpiresAt)

	code, body = call(t, h, "POST", "/v1/seckill/DEMO-TSHIRT/buy", `{"user_id":"bob","hold_seconds":60}`)
	require.Equal(t, 201, code, body)
	sk := orderAns(t, body)
	require.Equal(t, sk.CreatedAt.Add(60*time.Second), sk.ExpiresAt)

	for _, bad := range []struct{ body, msg string }{
		{`{"user_id":"alice","items":[{"sku":"DEMO-TSHIRT","qty":1}],"hold_seconds":5}`, "hold_seconds must be between 10 and 7200"},
		{`{"user_id":"alice","items":[{"sku":"DEMO-TSHIRT","qty":1}],"hold_seconds":7201}`, "hold_seconds must be between 10 and 7200"},
		{`{"user_id":"alice","items":[{"sku":"DEMO-TSHIRT","qty":1}],"hold_seconds":0}`, "hold_seconds must be a positive number of seconds"},
		{`{"user_id":"alice","items":[{"sku":"DEMO-TSHIRT","qty":1}],"hold_seconds":-3}`, "hold_seconds must be a positive number of seconds"},
		{`{"user_id":"alice","items":[{"sku":"DEMO-TSHIRT","qty":1}],"hold_seconds":99999999999999999}`, "hold_seconds must be between 10 and 7200"},
	} {
		expect(t, h, "POST", "/v1/orders", bad.body, 400, errBody("invalid_argument", bad.msg))
	}
	expect(t, h, "GET", "/v1/skus/DEMO-TSHIRT", "", 200, skuBody("DEMO-TSHIRT", 100, 2, 98, 98, 0))

	ext := "/v1/orders/" + o.ID + "/extend"
	alice, bob := buyerToken(t, a, "alice"), buyerToken(t, a, "bob")
	start := time.Now()
	code, body = call(t, h, "POST", ext, `{"seconds":600}`, identity.Header, alice, "Idempotency-Key", "x1")
	require.Equal(t, 200, code, body)
	first := orderAns(t, body)
	require.Equal(t, "PENDING", first.Status)
	require.False(t, first.ExpiresAt.Before(start.Add(600*time.Second).Truncate(time.Microsecond)), first.ExpiresAt)
	require.False(t, first.ExpiresAt.After(time.Now().Add(600*time.Second)), first.ExpiresAt)
	code, body = call(t, h, "POST", ext, `{"seconds":900}`, identity.Header, alice, "Idempotency-Key", "x1")
	require.Equal(t, 200, code, body)
	require.Equal(t, first.ExpiresAt, orderAns(t, body).ExpiresAt, "a replayed key answers the first deadline")
	code, body = call(t, h, "GET", "/v1/orders/"+o.ID, "")
	require.Equal(t, 200, code, body)
	require.Equal(t, first.ExpiresAt, orderAns(t, body).ExpiresAt)

	expect(t, h, "POST", ext, `{"seconds":600}`, 403, errBody("forbidden", "the order belongs to another buyer"), identity.Header, bob)
	expect(t, h, "POST", ext, `{"seconds":7201}`, 400, errBody("invalid_argument", "seconds must be between 10 and 7200"), identity.Header, alice)
	expect(t, h, "POST", ext, `{"seconds":0}`, 400, errBody("invalid_argument", "seconds must be a positive number of seconds"), identity.Header, alice)
	expect(t, h, "POST", ext, `{}`, 400, errBody("invalid_argument", "missing required field(s): seconds"), identity.Header, alice)
	expect(t, h, "POST", ext, `{"seconds":600}`, 401, errBody("unauthorized", "invalid buyer token: the X-Buyer-Token header is required"))
	code, body = call(t, h, "POST", ext, `{"seconds":7200}`, identity.Header, alice)
	require.Equal(t, 409, code, body)
	require.Contains(t, body, `"code":"conflict"`)
	require.Contains(t, body, "a hold can last at most 2h0m0s from the order's creation")
	code, body = call(t, h, "POST", "/v1/orders/nope/extend", `{"seconds":600}`, identity.Header, alice)
	require.Equal(t, 404, code, body)

	// An admin may extend any order; a cancelled order is not extended.
	code, body = call(t, h, "POST", "/v1/orders/"+sk.ID+"/extend", `{"seconds":300}`, "Authorization", admin)
	require.Equal(t, 200, code, body)
	require.True(t, orderAns(t, body).ExpiresAt.After(sk.ExpiresAt))
	code, body = call(t, h, "POST", "/v1/orders/"+sk.ID+"/cancel", "", identity.Header, bob)
	require.Equal(t, 200, code, body)
	expect(t, h, "POST", "/v1/orders/"+sk.ID+"/extend", `{"seconds":300}`, 409,
		errBody("conflict", "order "+sk.ID+" is CANCELLED"), identity.Header, bob)
	expect(t, h, "GET", "/v1/skus/DEMO-TSHIRT", "", 200, skuBody("DEMO-TSHIRT", 100, 1, 99, 99, 0))

	// The token API: a sized hold, extended, then refused once released.
	code, body = call(t, h, "POST", "/v1/stock/deduct", `{"sku":"DEMO-PHONE","qty":1,"token":"cart-1","hold_seconds":60}`)
	require.Equal(t, 200, code, body)
	var held struct {
		ExpiresAt time.Time `json:"expires_at"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &held))
	code, body = call(t, h, "POST", "/v1/stock/extend", `{"sku":"DEMO-PHONE","token":"cart-1","seconds":1800}`, "Idempotency-Key", "e1")
	require.Equal(t, 200, code, body)
	var moved struct {
		ExpiresAt time.Time `json:"expires_at"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &moved))
	require.True(t, moved.ExpiresAt.After(held.ExpiresAt.Add(25*time.Minute)), "%s then %s", held.ExpiresAt, moved.ExpiresAt)
	code, body = call(t, h, "POST", "/v1/stock/extend", `{"sku":"DEMO-PHONE","token":"cart-1","seconds":3600}`, "Idempotency-Key", "e1")
	require.Equal(t, 200, code, body)
	require.JSONEq(t, `{"expires_at":"`+moved.ExpiresAt.Format(time.RFC3339Nano)+`"}`, body, "a replayed key answers the first end")
	expect(t, h, "POST", "/v1/stock/extend", `{"sku":"DEMO-PHONE","token":"cart-2","seconds":60}`, 404,
		errBody("not_found", "no reservation of DEMO-PHONE with this token"))
	expect(t, h, "POST", "/v1/stock/extend", `{"sku":"DEMO-PHONE","token":"cart-1"}`, 400,
		errBody("invalid_argument", "missing required field(s): seconds"))
	expect(t, h, "POST", "/v1/stock/release", `{"sku":"DEMO-PHONE","token":"cart-1"}`, 200, `{"released":1}`)
	expect(t, h, "POST", "/v1/stock/extend", `{"sku":"DEMO-PHONE","token":"cart-1","seconds":60}`, 409,
		errBody("conflict", "reservation already released"))
	expect(t, h, "GET", "/v1/skus/DEMO-PHONE", "", 200, skuBody("DEMO-PHONE", 10, 0, 10, 10, 1))
}
