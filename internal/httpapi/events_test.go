package httpapi_test

import (
	"testing"

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
