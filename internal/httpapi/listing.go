package httpapi

import (
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/listing"
	"github.com/acme/inventory/order"
)

// Listings answer {"items":[...],"next_cursor":"..."}, next_cursor absent on
// the last page. A cursor is opaque to clients: base64url (unpadded) of the
// last key of the page (a SKU, an order id, a movement's position); a client
// passes it back unchanged.

type page[T any] struct {
	Items      []T    `json:"items"`
	NextCursor string `json:"next_cursor,omitempty"`
}

// listingRoutes registers the listings: SKUs and orders for clients, a SKU's
// stock movements (the audit trail) for admins. A nil middleware is skipped.
func (s *Server) listingRoutes(v1 *echo.Group, client, admin echo.MiddlewareFunc) {
	with := func(m echo.MiddlewareFunc) []echo.MiddlewareFunc {
		if m == nil {
			return nil
		}
		return []echo.MiddlewareFunc{m}
	}
	v1.GET("/skus", s.listSKUs, with(client)...)
	v1.GET("/orders", s.listOrders, with(client)...)
	v1.GET("/skus/:sku/movements", s.skuMovements, with(admin)...)
	v1.GET("/events", s.listEvents, with(client)...)
}

// listEvents: GET /v1/events?after=&limit=&sku=, the replay feed of stock
// events in id order. A reader passes the last id it has as after.
func (s *Server) listEvents(c echo.Context) error {
	limit, _, err := pageParams(c)
	if err != nil {
		return err
	}
	q := listing.EventQuery{Limit: limit}
	if v, ok, err := filterParam(c, "after"); err != nil {
		return err
	} else if ok {
		if q.After, err = strconv.ParseInt(v, 10, 64); err != nil || q.After < 0 {
			return badRequest("after must be an event id (an integer, 0 or above)")
		}
	}
	if q.SKU, _, err = filterParam(c, "sku"); err != nil {
		return err
	}
	items, err := s.listing.Events(c.Request().Context(), q)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, page[arbiter.Event]{Items: items})
}

// listSKUs: GET /v1/skus?low_stock=&limit=&cursor=
func (s *Server) listSKUs(c echo.Context) error {
	limit, cursor, err := pageParams(c)
	if err != nil {
		return err
	}
	q := listing.SKUQuery{After: cursor, Limit: limit}
	if v, ok, err := filterParam(c, "low_stock"); err != nil {
		return err
	} else if ok {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return badRequest("low_stock must be an integer")
		}
		q.LowStock = &n
	}
	p, err := s.listing.SKUs(c.Request().Context(), q)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, page[listing.SKUListItem]{Items: p.Items, NextCursor: encodeCursor(p.Next)})
}

// listOrders: GET /v1/orders?user_id=&status=&created_from=&created_to=&limit=&cursor=
// (times in RFC 3339, the window half-open: [created_from, created_to)).
func (s *Server) listOrders(c echo.Context) error {
	limit, cursor, err := pageParams(c)
	if err != nil {
		return err
	}
	q := listing.OrderQuery{After: cursor, Limit: limit}
	var status string
	for name, dst := range map[string]*string{"user_id": &q.UserID, "status": &status} {
		if *dst, _, err = filterParam(c, name); err != nil {
			return err
		}
	}
	q.Status = order.Status(status)
	for name, dst := range map[string]*time.Time{"created_from": &q.CreatedFrom, "created_to": &q.CreatedTo} {
		v, ok, err := filterParam(c, name)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if *dst, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return badRequest(name + " must be an RFC 3339 time, e.g. 2025-01-02T15:04:05Z")
		}
		// Times are compared in UTC, where an offset can carry a valid
		// RFC 3339 time out of the years 0001-9999 the database stores.
		if y := dst.UTC().Year(); y < 1 || y > 9999 {
			return badRequest(name + " must fall within the years 0001 to 9999 in UTC")
		}
	}
	p, err := s.listing.Orders(c.Request().Context(), q)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, page[order.Order]{Items: p.Items, NextCursor: encodeCursor(p.Next)})
}

// movementPage is a page of a SKU's history: a listing page, and position,
// where to read on from with after=, on every page (the last one's too:
// the position of its last movement, or the after given when empty), so a
// follower polls with it. next_cursor keeps the listings' rule (absent on
// the last page), so a client that pages until it is absent still stops.
type movementPage struct {
	Items      []arbiter.Movement `json:"items"`
	NextCursor string             `json:"next_cursor,omitempty"`
	Position   int64              `json:"position"`
}

// movementCursor marks a cursor's key as a movement position, so a cursor
// given before positions existed (a movement id) is refused as malformed
// rather than read as a position.
const movementCursor = "p"

// skuMovements: GET /v1/skus/{sku}/movements?after=&limit=&cursor=, in
// position order (the order the changes committed in). after is the last
// position the reader has; cursor a next_cursor; one or the other.
func (s *Server) skuMovements(c echo.Context) error {
	sku, err := skuParam(c)
	if err != nil {
		return err
	}
	limit, cursor, err := pageParams(c)
	if err != nil {
		return err
	}
	var after int64
	v, given, err := filterParam(c, "after")
	switch {
	case err != nil:
		return err
	case given && cursor != "":
		return badRequest("give after or cursor, not both")
	case given:
		if after, err = strconv.ParseInt(v, 10, 64); err != nil || after < 0 {
			return badRequest("after must be a movement position (an integer, 0 or above)")
		}
	case cursor != "":
		pos, ok := strings.CutPrefix(cursor, movementCursor)
		if after, err = strconv.ParseInt(pos, 10, 64); !ok || err != nil || after < 1 {
			return badRequest("cursor is malformed")
		}
	}
	p, err := s.listing.Movements(c.Request().Context(), sku, after, limit)
	if err != nil {
		return err
	}
	next := ""
	if p.More {
		next = encodeCursor(movementCursor + strconv.FormatInt(p.Next, 10))
	}
	return c.JSON(http.StatusOK, movementPage{Items: p.Items, NextCursor: next, Position: p.Next})
}

// pageParams reads limit (1-500; absent: the default page size) and the
// decoded cursor ("" when absent).
func pageParams(c echo.Context) (limit int, cursor string, err error) {
	if v, ok := c.QueryParams()["limit"]; ok {
		n, err := strconv.Atoi(v[0])
		if err != nil || n < 1 || n > listing.MaxPageSize {
			return 0, "", badRequest("limit must be an integer between 1 and " + strconv.Itoa(listing.MaxPageSize))
		}
		limit = n
	}
	if v := c.QueryParam("cursor"); v != "" {
		raw, err := base64.RawURLEncoding.DecodeString(v)
		if err != nil || len(raw) == 0 {
			return 0, "", badRequest("cursor is malformed; pass back a next_cursor unchanged")
		}
		cursor = string(raw)
	}
	return limit, cursor, nil
}

// filterParam reads an optional filter. A filter given empty is refused, not
// ignored: dropping it would widen the listing the client asked for.
func filterParam(c echo.Context, name string) (string, bool, error) {
	v, ok := c.QueryParams()[name]
	if !ok {
		return "", false, nil
	}
	if len(v) != 1 || v[0] == "" {
		return "", false, badRequest(name + " must be given once, not empty")
	}
	return v[0], true, nil
}

func encodeCursor(key string) string {
	if key == "" {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString([]byte(key))
}
