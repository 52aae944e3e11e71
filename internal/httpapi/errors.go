package httpapi

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"net"
	"net/http"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/labstack/echo/v4"

	"github.com/acme/inventory/order"
	"github.com/acme/inventory/stock"
)

// Error is the body of every error answer: {"error":{"code","message"}}.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type errorBody struct {
	Error Error `json:"error"`
}

// apiError is an error with its answer already decided.
type apiError struct {
	status int
	code   string
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(msg string) error   { return &apiError{http.StatusBadRequest, "invalid_argument", msg} }
func unauthorized(msg string) error { return &apiError{http.StatusUnauthorized, "unauthorized", msg} }

// codes maps domain errors to answers, in one place. Anything else is internal.
var codes = []struct {
	err    error
	status int
	code   string
}{
	{stock.ErrInvalidArgument, http.StatusBadRequest, "invalid_argument"},
	{stock.ErrUnknownSKU, http.StatusNotFound, "not_found"},
	{order.ErrNotFound, http.StatusNotFound, "not_found"},
	{stock.ErrInsufficientStock, http.StatusConflict, "insufficient_stock"},
	{order.ErrConflict, http.StatusConflict, "conflict"},
	{order.ErrTokenReleased, http.StatusConflict, "conflict"},
	{stock.ErrUnavailable, http.StatusServiceUnavailable, "unavailable"},
}

// errorHandler writes the error shape; only internal errors are logged, and
// their detail stays in the log.
func (s *Server) errorHandler(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	status, body := s.answer(err)
	if status == http.StatusInternalServerError {
		s.log.Error("internal error", "method", c.Request().Method, "path", c.Path(), "err", err)
	}
	if c.Request().Method == http.MethodHead {
		_ = c.NoContent(status)
		return
	}
	_ = c.JSON(status, body)
}

func (s *Server) answer(err error) (int, errorBody) {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.status, errorBody{Error{ae.code, ae.msg}}
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		switch he.Code {
		case http.StatusNotFound:
			return he.Code, errorBody{Error{"not_found", "no such route"}}
		case http.StatusMethodNotAllowed:
			return he.Code, errorBody{Error{"invalid_argument", "method not allowed"}}
		case http.StatusRequestEntityTooLarge:
			return http.StatusBadRequest, errorBody{Error{"invalid_argument", "request body too large"}}
		case http.StatusTooManyRequests:
			return he.Code, errorBody{Error{"rate_limited", "too many requests; slow down"}}
		case http.StatusUnsupportedMediaType, http.StatusBadRequest:
			return http.StatusBadRequest, errorBody{Error{"invalid_argument", "malformed request"}}
		}
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.status, errorBody{Error{c.code, err.Error()}}
		}
	}
	if dependencyDown(err) {
		return http.StatusServiceUnavailable, errorBody{Error{"unavailable", "a dependency (Redis or the database) is unavailable; retry later"}}
	}
	return http.StatusInternalServerError, errorBody{Error{"internal", "internal error"}}
}

// dependencyDown recognises a failure to reach Redis or the database (as
// opposed to a bug): the answer is 503, and a retry may succeed.
func dependencyDown(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, sql.ErrConnDone) ||
		errors.Is(err, driver.ErrBadConn) || errors.Is(err, redis.ErrClosed) || errors.Is(err, redis.ErrPoolTimeout) ||
		strings.Contains(err.Error(), "database is closed")
}
