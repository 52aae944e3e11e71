package httpapi

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/counts"
)

// countRoutes registers the stock counts (admin) and the shipped signal
// (client).
func (s *Server) countRoutes(v1 *echo.Group, admin, client echo.MiddlewareFunc) {
	v1.POST("/stock/counts", s.postCount, admin, countDeadline)
	v1.GET("/stock/counts/:id", s.getCount, admin)
	v1.POST("/orders/:id/ship", s.shipOrder, client)
}

// maxCountBody bounds a count request's body: 10,000 lines of the longest
// SKU and quantities fit in about 1.2 MB.
const maxCountBody = 4 << 20

// CountTimeout is a count request's deadline instead of the request
// timeout: its 10,000 lines are applied in transactions of a thousand.
// A request cut short has applied whole batches only, and its replay goes
// on from there.
const CountTimeout = 2 * time.Minute

// countPath is the route whose body may be larger than maxBody.
const countPath = "/v1/stock/counts"

// skipBodyLimit lets a count request's body past the service's 64 KiB
// limit; postCount bounds it itself (maxCountBody).
func skipBodyLimit(c echo.Context) bool {
	return c.Request().Method == http.MethodPost && strings.TrimSuffix(c.Request().URL.Path, "/") == countPath
}

// countDeadline gives a count request CountTimeout instead of the request
// timeout the deadline middleware set.
func countDeadline(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		parent := c.Request().Context()
		if l, ok := parent.(*lazyDeadline); ok {
			parent = l.Context
		}
		ctx := newLazyDeadline(parent, time.Now().Add(CountTimeout))
		defer ctx.stop()
		c.SetRequest(c.Request().WithContext(ctx))
		return next(c)
	}
}

// countTooLarge is the answer to a count request past the limits.
func countTooLarge(what string) error {
	return &apiError{status: http.StatusRequestEntityTooLarge, code: "payload_too_large",
		msg: fmt.Sprintf("%s: a count request carries at most %d lines (%d bytes); send a larger count as several requests of the same count_id and counted_at, each with its offset (the lines before it)",
			what, counts.MaxLines, maxCountBody)}
}

// postCount: POST /v1/stock/counts
// {"count_id","counted_at","offset"?,"lines":[{"sku","counted","unshipped"?}]}
// → 200 with each line's outcome. Bad input is 400 and applies nothing.
func (s *Server) postCount(c echo.Context) error {
	body, err := io.ReadAll(io.LimitReader(c.Request().Body, maxCountBody+1))
	if err != nil {
		return badRequest("could not read the request body")
	}
	if len(body) > maxCountBody {
		return countTooLarge(fmt.Sprintf("request body larger than %d bytes", maxCountBody))
	}
	type line struct {
		SKU       *string `json:"sku"`
		Counted   *int64  `json:"counted"`
		Unshipped *int64  `json:"unshipped"`
	}
	var req struct {
		CountID   *string `json:"count_id"`
		CountedAt *string `json:"counted_at"`
		Offset    *int64  `json:"offset"`
		Lines     *[]line `json:"lines"`
	}
	if err := decodeJSON(body, &req); err != nil {
		return err
	}
	if err := required(map[string]bool{"count_id": req.CountID != nil, "counted_at": req.CountedAt != nil, "lines": req.Lines != nil}); err != nil {
		return err
	}
	at, err := time.Parse(time.RFC3339Nano, *req.CountedAt)
	if err != nil {
		return badRequest("counted_at must be an RFC 3339 time, e.g. 2025-01-02T02:00:00Z")
	}
	if at.UTC().Year() < 1 || at.UTC().Year() > 9999 {
		return badRequest("counted_at must be within the years 0001-9999 in UTC")
	}
	if len(*req.Lines) > counts.MaxLines {
		return countTooLarge(fmt.Sprintf("%d lines", len(*req.Lines)))
	}
	r := counts.Request{CountID: *req.CountID, CountedAt: at, Lines: make([]counts.Line, len(*req.Lines))}
	if req.Offset != nil {
		r.Offset = *req.Offset
	}
	for i, l := range *req.Lines {
		if l.SKU == nil || l.Counted == nil {
			return badRequest(fmt.Sprintf("lines[%d] needs sku and counted", i))
		}
		r.Lines[i] = counts.Line{SKU: *l.SKU, Counted: *l.Counted, Unshipped: l.Unshipped}
	}
	if s.counts == nil {
		return fmt.Errorf("%w: stock counts are not served here", inventory.ErrUnavailable)
	}
	res, err := s.counts.Apply(c.Request().Context(), r)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, res)
}

// getCount: GET /v1/stock/counts/{id} → how far the count is applied.
func (s *Server) getCount(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	if s.counts == nil {
		return fmt.Errorf("%w: stock counts are not served here", inventory.ErrUnavailable)
	}
	p, err := s.counts.Get(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, p)
}

// shipOrder: POST /v1/orders/{id}/ship → the order, its paid lines shipped.
func (s *Server) shipOrder(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	o, err := s.orders.Ship(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, o)
}
