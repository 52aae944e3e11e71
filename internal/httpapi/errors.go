package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/breaker"
	"github.com/acme/inventory/internal/tokens"
)

// Error is the body of every error answer: {"error":{"code","message"}}.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type errorBody struct {
	Error Error `json:"error"`
}

// apiError is an error with its answer already decided, and a header to
// send with it (WWW-Authenticate on 401, Retry-After on 429; every 503
// gets Retry-After too).
type apiError struct {
	status int
	code   string
	msg    string
	header [2]string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(msg string) error {
	return &apiError{status: http.StatusBadRequest, code: "invalid_argument", msg: msg}
}

func tooLarge() error {
	return &apiError{status: http.StatusRequestEntityTooLarge, code: "payload_too_large",
		msg: fmt.Sprintf("request body larger than %d bytes", maxBody)}
}

// codes maps domain errors to answers, in one place. Anything else is internal.
var codes = []struct {
	err    error
	status int
	code   string
}{
	{inventory.ErrInvalidArgument, http.StatusBadRequest, "invalid_argument"},
	{inventory.ErrUnknownSKU, http.StatusNotFound, "not_found"},
	{inventory.ErrNotFound, http.StatusNotFound, "not_found"},
	{inventory.ErrInsufficientStock, http.StatusConflict, "insufficient_stock"},
	{inventory.ErrConflict, http.StatusConflict, "conflict"},
	{inventory.ErrPrecondition, http.StatusPreconditionFailed, "precondition_failed"},
	{inventory.ErrForbidden, http.StatusForbidden, "forbidden"},
	{inventory.ErrNotStarted, http.StatusConflict, "sale_not_started"},
	{inventory.ErrEnded, http.StatusConflict, "sale_ended"},
	{tokens.ErrReleased, http.StatusConflict, "conflict"},
	{inventory.ErrUnavailable, http.StatusServiceUnavailable, "unavailable"},
	{breaker.ErrOpen, http.StatusServiceUnavailable, "unavailable"},
}

// statusClientClosed answers a request its client abandoned (nginx's 499,
// for the access log; the client never reads it).
const statusClientClosed = 499

// errorHandler writes the error shape. Internal errors are logged at error
// level and unavailable dependencies at warn, with the request id; their
// detail stays in the log. Client errors are not logged.
func (s *Server) errorHandler(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	status, body := s.answer(err)
	if status == http.StatusInternalServerError && errors.Is(err, context.Canceled) && c.Request().Context().Err() != nil {
		// The client went away (its request's context ended with it):
		// nothing failed here, and nobody reads the answer.
		status, body = statusClientClosed, errorBody{Error{"client_closed", "the client closed the request"}}
		s.log.Info("client closed the request", "request_id", requestIDOf(c), "method", c.Request().Method, "path", c.Path())
	}
	var ae *apiError
	if errors.As(err, &ae) && ae.header[0] != "" {
		c.Response().Header().Set(ae.header[0], ae.header[1])
	}
	if status == http.StatusServiceUnavailable && c.Response().Header().Get("Retry-After") == "" {
		c.Response().Header().Set("Retry-After", "1") // a dependency that comes back is probed within a second
	}
	switch status {
	case http.StatusInternalServerError:
		s.log.Error("internal error", "request_id", requestIDOf(c), "method", c.Request().Method, "path", c.Path(), "err", err)
	case http.StatusServiceUnavailable:
		s.log.Warn("dependency unavailable", "request_id", requestIDOf(c), "method", c.Request().Method, "path", c.Path(), "err", err)
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
			return he.Code, errorBody{Error{"method_not_allowed", "this route does not take that method (see the Allow header)"}}
		case http.StatusRequestEntityTooLarge:
			return he.Code, errorBody{Error{"payload_too_large", fmt.Sprintf("request body larger than %d bytes", maxBody)}}
		case http.StatusTooManyRequests:
			return he.Code, errorBody{Error{"rate_limited", "too many requests; slow down"}}
		case http.StatusUnsupportedMediaType, http.StatusBadRequest:
			return http.StatusBadRequest, errorBody{Error{"invalid_argument", "malformed request"}}
		}
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.status, errorBody{Error{c.code, userMessage(err)}}
		}
	}
	if breaker.Unreachable(err) {
		return http.StatusServiceUnavailable, errorBody{Error{"unavailable", "a dependency (Redis or the database) is unavailable; retry later"}}
	}
	return http.StatusInternalServerError, errorBody{Error{"internal", "internal error"}}
}

// pkgPrefixes are the Go package prefixes on an error's text ("order: ",
// "stock: "), at the start or after another message's colon; codePrefixes
// the sentinels' names that the answer's code already says.
var (
	pkgPrefixes  = []string{"inventory: ", "stock: ", "order: ", "tokens: ", "mq: ", "identity: ", "app: "}
	codePrefixes = []string{"invalid argument: ", "conflict: ", "not found: ", "forbidden: "}
)

// userMessage is err's text for a client: what went wrong, without the
// package names Go errors carry. (Plain string scanning: a regexp here was a
// quarter of a sold-out answer's CPU.)
func userMessage(err error) string {
	msg := err.Error()
	var b strings.Builder
	for start := true; msg != ""; {
		if start {
			if p, ok := hasAnyPrefix(msg, pkgPrefixes); ok {
				msg = msg[len(p):]
				continue
			}
		}
		i := strings.Index(msg, ": ")
		if i < 0 {
			b.WriteString(msg)
			break
		}
		b.WriteString(msg[:i+2])
		msg, start = msg[i+2:], true
	}
	out := b.String()
	if p, ok := hasAnyPrefix(out, codePrefixes); ok {
		out = out[len(p):]
	}
	return out
}

func hasAnyPrefix(s string, prefixes []string) (string, bool) {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return p, true
		}
	}
	return "", false
}
