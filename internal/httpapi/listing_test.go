package httpapi_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/order"
)

func cursorOf(key string) string { return base64.RawURLEncoding.EncodeToString([]byte(key)) }

// listItem is a SKU as the listing shows it (no redis_available).
func listItem(sku string, onHand, reserved, available, limit int64) map[string]any {
	return map[string]any{"sku": sku, "on_hand": onHand, "reserved": reserved, "available": available,
		"unlimited": onHand == -1, "per_user_limit": limit}
}

func pageBody(t *testing.T, items []map[string]any, next string) string {
	t.Helper()
	p := map[string]any{"items": items}
	if items == nil {
		p["items"] = []any{}
	}
	if next != "" {
		p["next_cursor"] = next
	}
	b, err := json.Marshal(p)
	require.NoError(t, err)
	return string(b)
}

// listPage decodes a listing answer (position: the movements listing's).
type listPage[T any] struct {
	Items      []T    `json:"items"`
	NextCursor string `json:"next_cursor"`
	Position   int64  `json:"position"`
}

func getPage[T any](t *testing.T, h http.Handler, path string, header ...string) listPage[T] {
	t.Helper()
	code, body := call(t, h, "GET", path, "", header...)
	require.Equal(t, http.StatusOK, code, "GET %s -> %s", path, body)
	var p listPage[T]
	require.NoError(t, json.Unmarshal([]byte(body), &p))
	return p
}

// GET /v1/skus: SKU order, cursor pages, the low-stock filter, and every
// malformed parameter refused with 400.
func TestListSKUsHTTP(t *testing.T) {
	a := embeddedApp(t)
	h := a.Handler()
	auth := []string{"Authorization", "Bearer " + a.Cfg.AdminToken}
	_, err := a.Orders.Create(context.Background(), "alice", "", []inventory.Line{{SKU: "DEMO-PHONE", Qty: 1}})
	require.NoError(t, err)
	ebook := listItem("DEMO-EBOOK", -1, 0, -1, 0)
	phone := listItem("DEMO-PHONE", 10, 1, 9, 1)
	tshirt := listItem("DEMO-TSHIRT", 100, 0, 100, 0)
	watch := listItem("DEMO-WATCH", 20, 5, 15, 0) // 5 carved out by the demo campaign

	expect(t, h, "GET", "/v1/skus", "", 200, pageBody(t, []map[string]any{ebook, phone, tshirt, watch}, ""), auth...)
	expect(t, h, "GET", "/v1/skus?limit=2", "", 200, pageBody(t, []map[string]any{ebook, phone}, cursorOf("DEMO-PHONE")), auth...)
	expect(t, h, "GET", "/v1/skus?limit=3&cursor="+cursorOf("DEMO-PHONE"), "", 200, pageBody(t, []map[string]any{tshirt, watch}, ""), auth...)
	expect(t, h, "GET", "/v1/skus?cursor="+cursorOf("DEMO-WATCH"), "", 200, pageBody(t, nil, ""), auth...)
	expect(t, h, "GET", "/v1/skus?low_stock=9", "", 200, pageBody(t, []map[string]any{phone}, ""), auth...)
	expect(t, h, "GET", "/v1/skus?low_stock=8", "", 200, pageBody(t, nil, ""), auth...)
	expect(t, h, "GET", "/v1/skus?low_stock=100&limit=1", "", 200, pageBody(t, []map[string]any{phone}, cursorOf("DEMO-PHONE")), auth...)
	expect(t, h, "GET", "/v1/skus?low_stock=100&limit=2&cursor="+cursorOf("DEMO-PHONE"), "", 200, pageBody(t, []map[string]any{tshirt, watch}, ""), auth...)

	for _, c := range []struct{ query, msg string }{
		{"limit=0", "limit must be an integer between 1 and 500"},
		{"limit=501", "limit must be an integer between 1 and 500"},
		{"limit=x", "limit must be an integer between 1 and 500"},
		{"limit=", "limit must be an integer between 1 and 500"},
		{"low_stock=x", "low_stock must be an integer"},
		{"low_stock=", "low_stock must be given once, not empty"},
		{"low_stock=1&low_stock=2", "low_stock must be given once, not empty"},
		{"low_stock=-1", "low_stock must be between 0 and 1000000000000"},
		{"cursor=%21%21", "cursor is malformed; pass back a next_cursor unchanged"},
		{"cursor=" + cursorOf("-bad"), "cursor must name a SKU"},
	} {
		expect(t, h, "GET", "/v1/skus?"+c.query, "", 400, errBody("invalid_argument", c.msg), auth...)
	}
}

// GET /v1/orders: newest first, filters, cursor pages, and the parameters'
// errors.
func TestListOrdersHTTP(t *testing.T) {
	a := embeddedApp(t)
	h := a.Handler()
	auth := []string{"Authorization", "Bearer " + a.Cfg.AdminToken}
	ctx := context.Background()
	var ids []string
	for _, user := range []string{"alice", "bob", "alice", "alice"} {
		o, err := a.Orders.Create(ctx, user, "", []inventory.Line{{SKU: "DEMO-TSHIRT", Qty: 2}})
		require.NoError(t, err)
		ids = append(ids, o.ID)
	}
	_, err := a.Orders.Cancel(ctx, ids[2])
	require.NoError(t, err)
	first, err := a.Orders.Get(ctx, ids[0])
	require.NoError(t, err)

	idsOf := func(p listPage[order.Order]) []string {
		out := []string{}
		for _, o := range p.Items {
			out = append(out, o.ID)
		}
		return out
	}
	list := func(query string) listPage[order.Order] {
		t.Helper()
		return getPage[order.Order](t, h, "/v1/orders?"+query, auth...)
	}

	p := list("")
	require.Equal(t, []string{ids[3], ids[2], ids[1], ids[0]}, idsOf(p))
	require.Empty(t, p.NextCursor)
	require.Equal(t, []order.Item{{SKU: "DEMO-TSHIRT", Qty: 2}}, p.Items[3].Items, "items are loaded")
	require.Equal(t, "alice", p.Items[3].UserID)
	require.Equal(t, order.Cancelled, p.Items[1].Status)

	p = list("user_id=alice&limit=2")
	require.Equal(t, []string{ids[3], ids[2]}, idsOf(p))
	require.Equal(t, cursorOf(ids[2]), p.NextCursor)
	p = list("user_id=alice&limit=2&cursor=" + p.NextCursor)
	require.Equal(t, []string{ids[0]}, idsOf(p))
	require.Empty(t, p.NextCursor)

	require.Equal(t, []string{ids[3], ids[1], ids[0]}, idsOf(list("status=PENDING")))
	require.Equal(t, []string{ids[2]}, idsOf(list("status=CANCELLED&user_id=alice")))
	require.Equal(t, []string{}, idsOf(list("status=PAID")))
	window := func(from, to time.Time) string {
		return "created_from=" + url.QueryEscape(from.Format(time.RFC3339Nano)) + "&created_to=" + url.QueryEscape(to.Format(time.RFC3339Nano))
	}
	require.Equal(t, []string{ids[3], ids[2], ids[1], ids[0]},
		idsOf(list(window(first.CreatedAt, time.Now().Add(time.Hour)))), "created_from is inclusive")
	require.Equal(t, []string{ids[1]},
		idsOf(list("user_id=bob&"+window(first.CreatedAt.In(time.FixedZone("", 5*3600)), time.Now().Add(time.Hour)))))
	require.Equal(t, []string{}, idsOf(list(window(first.CreatedAt.Add(-time.Hour), first.CreatedAt))), "created_to is exclusive")

	for _, c := range []struct{ query, msg string }{
		{"status=NOPE", "status must be one of PENDING, PAID, CANCELLED, EXPIRED, REFUNDED, REFUND_REQUIRED"},
		{"status=", "status must be given once, not empty"},
		{"user_id=", "user_id must be given once, not empty"},
		{"user_id=a%20b", "user_id must be 1-64 characters of A-Z a-z 0-9 . _ : -"},
		{"created_from=yesterday", "created_from must be an RFC 3339 time, e.g. 2025-01-02T15:04:05Z"},
		{"created_to=2025-01-02", "created_to must be an RFC 3339 time, e.g. 2025-01-02T15:04:05Z"},
		{"created_from=2025-01-02T00:00:00Z&created_to=2025-01-01T00:00:00Z", "created_from must be before created_to"},
		{"limit=501", "limit must be an integer between 1 and 500"},
		{"cursor=" + cursorOf("-x"), "cursor must name an order"},
		{"cursor=***", "cursor is malformed; pass back a next_cursor unchanged"},
	} {
		expect(t, h, "GET", "/v1/orders?"+c.query, "", 400, errBody("invalid_argument", c.msg), auth...)
	}
}

// GET /v1/skus/{sku}/movements: admin only, in position order, cursor
// pages (next_cursor absent on the last), each page's position.
func TestSKUMovementsHTTP(t *testing.T) {
	a := embeddedApp(t)
	h := a.Handler()
	auth := []string{"Authorization", "Bearer " + a.Cfg.AdminToken}
	ctx := context.Background()
	_, err := a.Catalog.Adjust(ctx, "DEMO-TSHIRT", 5, "restock", "po-17")
	require.NoError(t, err)
	o, err := a.Orders.Create(ctx, "alice", "", []inventory.Line{{SKU: "DEMO-TSHIRT", Qty: 3}})
	require.NoError(t, err)
	_, err = a.Orders.Cancel(ctx, o.ID)
	require.NoError(t, err)

	type mv struct {
		ID            int64     `json:"id"`
		SKU           string    `json:"sku"`
		Position      int64     `json:"position"`
		Kind          string    `json:"kind"`
		OnHandDelta   int64     `json:"on_hand_delta"`
		ReservedDelta int64     `json:"reserved_delta"`
		Reason        string    `json:"reason"`
		Reference     string    `json:"reference"`
		CreatedAt     time.Time `json:"created_at"`
	}
	var all []mv
	path := "/v1/skus/DEMO-TSHIRT/movements?limit=1"
	for pages := 0; ; pages++ {
		require.Less(t, pages, 4)
		p := getPage[mv](t, h, path, auth...)
		require.Len(t, p.Items, 1)
		require.Equal(t, p.Items[0].Position, p.Position, "the page's position is its last movement's")
		all = append(all, p.Items...)
		if p.NextCursor == "" {
			break
		}
		require.Equal(t, cursorOf("p"+strconv.FormatInt(p.Items[0].Position, 10)), p.NextCursor)
		path = "/v1/skus/DEMO-TSHIRT/movements?limit=1&cursor=" + p.NextCursor
	}
	require.Len(t, all, 4)
	for i, m := range all {
		require.False(t, m.CreatedAt.IsZero())
		require.Positive(t, m.ID)
		all[i].ID, all[i].CreatedAt = 0, time.Time{}
	}
	require.Equal(t, []mv{
		{SKU: "DEMO-TSHIRT", Position: 1, Kind: "SET", OnHandDelta: 100},
		{SKU: "DEMO-TSHIRT", Position: 2, Kind: "RESTOCK", OnHandDelta: 5, Reason: "restock", Reference: "po-17"},
		{SKU: "DEMO-TSHIRT", Position: 3, Kind: "RESERVE", ReservedDelta: 3, Reference: o.ID},
		{SKU: "DEMO-TSHIRT", Position: 4, Kind: "RELEASE", ReservedDelta: -3, Reference: o.ID},
	}, all)
	require.Len(t, getPage[mv](t, h, "/v1/skus/DEMO-TSHIRT/movements", auth...).Items, 4)

	code, body := call(t, h, "GET", "/v1/skus/DEMO-TSHIRT/movements", "")
	require.Equal(t, 401, code, body)
	require.Contains(t, body, `"code":"unauthorized"`)
	expect(t, h, "GET", "/v1/skus/NOPE/movements", "", 404, errBody("not_found", "unknown sku: NOPE"), auth...)
	for _, c := range []struct{ path, msg string }{
		{"/v1/skus/DEMO-TSHIRT/movements?cursor=" + cursorOf("abc"), "cursor is malformed"},
		{"/v1/skus/DEMO-TSHIRT/movements?cursor=" + cursorOf("0"), "cursor is malformed"},
		{"/v1/skus/DEMO-TSHIRT/movements?cursor=" + cursorOf("-5"), "cursor is malformed"},
		{"/v1/skus/DEMO-TSHIRT/movements?cursor=" + cursorOf("2"), "cursor is malformed"}, // a cursor from before positions: a movement id
		{"/v1/skus/DEMO-TSHIRT/movements?cursor=" + cursorOf("p0"), "cursor is malformed"},
		{"/v1/skus/DEMO-TSHIRT/movements?cursor=" + cursorOf("px"), "cursor is malformed"},
		{"/v1/skus/DEMO-TSHIRT/movements?limit=-1", "limit must be an integer between 1 and 500"},
	} {
		expect(t, h, "GET", c.path, "", 400, errBody("invalid_argument", c.msg), auth...)
	}
	code, body = call(t, h, "GET", "/v1/skus/-X/movements", "", auth...)
	require.Equal(t, 400, code, body)
	require.Contains(t, body, `"code":"invalid_argument"`)
}

// GET /v1/skus/{sku}/movements?after=: a follower (an audit export, an ERP)
// polls with the position the last answer gave it, on every page, the last
// one too, and gets each movement once, in order, as the history grows;
// malformed or contradictory parameters are 400 invalid_argument, with
// nothing changed.
func TestSKUMovementsFollowHTTP(t *testing.T) {
	a := embeddedApp(t)
	h := a.Handler()
	auth := []string{"Authorization", "Bearer " + a.Cfg.AdminToken}
	ctx := context.Background()
	type mv struct {
		Position  int64  `json:"position"`
		Kind      string `json:"kind"`
		Reference string `json:"reference"`
	}
	var got []mv
	var after int64
	poll := func() []mv {
		t.Helper()
		var fresh []mv
		for {
			p := getPage[mv](t, h, "/v1/skus/DEMO-TSHIRT/movements?limit=2&after="+strconv.FormatInt(after, 10), auth...)
			fresh = append(fresh, p.Items...)
			if len(p.Items) > 0 {
				require.Equal(t, p.Items[len(p.Items)-1].Position, p.Position)
			} else {
				require.Equal(t, after, p.Position, "an empty page gives back the after it was asked")
			}
			after = p.Position
			if p.NextCursor == "" {
				break
			}
		}
		got = append(got, fresh...)
		return fresh
	}
	require.Equal(t, []mv{{1, "SET", ""}}, poll())
	require.Empty(t, poll())
	_, err := a.Catalog.Adjust(ctx, "DEMO-TSHIRT", 5, "restock", "po-17")
	require.NoError(t, err)
	o, err := a.Orders.Create(ctx, "alice", "", []inventory.Line{{SKU: "DEMO-TSHIRT", Qty: 3}})
	require.NoError(t, err)
	require.Equal(t, []mv{{2, "RESTOCK", "po-17"}, {3, "RESERVE", o.ID}}, poll())
	_, err = a.Orders.Cancel(ctx, o.ID)
	require.NoError(t, err)
	require.Equal(t, []mv{{4, "RELEASE", o.ID}}, poll())
	require.Empty(t, poll())
	require.Len(t, got, 4)

	expect(t, h, "GET", "/v1/skus/DEMO-TSHIRT/movements?after=4", "", 200, `{"items":[],"position":4}`, auth...)
	p := getPage[mv](t, h, "/v1/skus/DEMO-TSHIRT/movements?after=0", auth...)
	require.Len(t, p.Items, 4, "after=0 is the whole history")
	require.Equal(t, int64(4), p.Position)
	require.Empty(t, p.NextCursor)

	history := getPage[mv](t, h, "/v1/skus/DEMO-TSHIRT/movements", auth...)
	before := state(t, h)
	afterMsg := "after must be a movement position (an integer, 0 or above)"
	for _, c := range []struct{ query, msg string }{
		{"after=-1", afterMsg},
		{"after=abc", afterMsg},
		{"after=1.5", afterMsg},
		{"after=99999999999999999999", afterMsg},
		{"after=", "after must be given once, not empty"},
		{"after=1&after=2", "after must be given once, not empty"},
		{"after=5", "after 5 is beyond DEMO-TSHIRT's last movement (position 4)"},
		{"after=1&cursor=" + cursorOf("p2"), "give after or cursor, not both"},
		{"after=1&limit=0", "limit must be an integer between 1 and 500"},
	} {
		expect(t, h, "GET", "/v1/skus/DEMO-TSHIRT/movements?"+c.query, "", 400, errBody("invalid_argument", c.msg), auth...)
	}
	expect(t, h, "GET", "/v1/skus/NOPE/movements?after=1", "", 404, errBody("not_found", "unknown sku: NOPE"), auth...)
	code, body := call(t, h, "GET", "/v1/skus/DEMO-TSHIRT/movements?after=1", "")
	require.Equal(t, 401, code, body)
	require.Equal(t, before, state(t, h), "nothing changed")
	require.Equal(t, history, getPage[mv](t, h, "/v1/skus/DEMO-TSHIRT/movements", auth...), "the history neither")
}
