package httpapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"

	"github.com/acme/inventory"
	"github.com/go-sql-driver/mysql"
	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/assert"
)

// A dependency that dies under a request (restart, crash, failover) is a
// 503 the client may retry, never a 500: the errors the fault runs saw.
func TestDependencyFailuresAreUnavailable(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("stock: deduct CART-1: %w", io.EOF),
		fmt.Errorf("order: create: %w", io.ErrUnexpectedEOF),
		fmt.Errorf("write: %w", syscall.ECONNRESET),
		fmt.Errorf("dial: %w", syscall.ECONNREFUSED),
		fmt.Errorf("order: %w", mysql.ErrInvalidConn),
		errors.New("stock: deduct HOT: LOADING Redis is loading the dataset in memory"),
		errors.New("stock: deduct HOT: READONLY You can't write against a read only replica."),
		errors.New("stock: deduct HOT: CLUSTERDOWN The cluster is down"),
		errors.New("stock: deduct HOT: OOM command not allowed when used memory > 'maxmemory'."),
		errors.New("order: Error 1053 (08S01): Server shutdown in progress"),
	} {
		status, body := (&Server{}).answer(err)
		assert.Equal(t, http.StatusServiceUnavailable, status, err.Error())
		assert.Equal(t, "unavailable", body.Error.Code, err.Error())
	}
	for _, err := range []error{errors.New("something broke"), fmt.Errorf("order: %w", errors.New("constraint"))} {
		status, _ := (&Server{}).answer(err)
		assert.Equal(t, http.StatusInternalServerError, status, err.Error())
	}
	// Sentinels keep their own answers.
	status, _ := (&Server{}).answer(fmt.Errorf("%w: X", inventory.ErrInsufficientStock))
	assert.Equal(t, http.StatusConflict, status)
	status, _ = (&Server{}).answer(fmt.Errorf("%w: order 1", inventory.ErrConflict))
	assert.Equal(t, http.StatusConflict, status)
}

// userMessage drops package prefixes wherever a message starts (at the
// beginning or after a wrapped message's colon) and a leading sentinel name,
// and nothing else. (The regexps it replaced left the second of two
// prefixes in a row: "order: stock: ..." became "stock: ...".)
func TestUserMessage(t *testing.T) {
	for in, want := range map[string]string{
		"stock: insufficient stock: HOT":                             "insufficient stock: HOT",
		"inventory: insufficient stock: HOT":                         "insufficient stock: HOT",
		"inventory: conflict: order o1 is PAID":                      "order o1 is PAID",
		"order: inventory: not found: no order o1":                   "no order o1",
		"order: conflict: order o1 is PAID":                          "order o1 is PAID",
		"invalid argument: qty must be positive":                     "qty must be positive",
		"order: create: stock: deduct CART-1: stock: unknown sku: X": "create: deduct CART-1: unknown sku: X",
		"not found: order: no order o1":                              "no order o1",
		"order: stock: insufficient stock: X":                        "insufficient stock: X",
		"restock: order stock: 5":                                    "restock: order stock: 5",
		"mq: identity: app: x":                                       "x",
		"stockpile: 3":                                               "stockpile: 3",
		"a:: stock: b":                                               "a:: b",
		"":                                                           "",
	} {
		assert.Equal(t, want, userMessage(errors.New(in)), in)
	}
}

// The sold-out flag's pre-encoded answer is byte for byte what the error
// path writes for the same refusal.
func TestSoldOutBodyIsTheErrorAnswer(t *testing.T) {
	s := &Server{}
	e := echo.New()
	e.JSONSerializer = jsonSerializer{}
	for _, sku := range []string{"GONE", "A<B&C"} {
		rec := httptest.NewRecorder()
		s.errorHandler(fmt.Errorf("%w: %s is sold out", inventory.ErrInsufficientStock, sku), e.NewContext(httptest.NewRequest(http.MethodPost, "/", nil), rec))
		assert.Equal(t, http.StatusConflict, rec.Code)
		assert.Equal(t, rec.Body.String(), string(s.soldOutBody(sku)))
		assert.Equal(t, rec.Body.String(), string(s.soldOutBody(sku)), "cached")
	}
}

// A request whose client went away ends in context.Canceled: that is no
// internal error (the make faults runs logged one at the workload's end).
// The same error while the client still waits stays a 500: something in
// the service cancelled it, which is a bug to find.
func TestAClientThatLeftIsNoInternalError(t *testing.T) {
	s := &Server{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	e := echo.New()
	for _, left := range []bool{true, false} {
		ctx, cancel := context.WithCancel(context.Background())
		if left {
			cancel()
		}
		rec := httptest.NewRecorder()
		s.errorHandler(fmt.Errorf("order: write: %w", context.Canceled), e.NewContext(httptest.NewRequest(http.MethodPost, "/", nil).WithContext(ctx), rec))
		cancel()
		want := http.StatusInternalServerError
		if left {
			want = statusClientClosed
		}
		assert.Equal(t, want, rec.Code, "client left: %v", left)
	}
}
