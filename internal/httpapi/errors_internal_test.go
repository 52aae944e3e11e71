package httpapi

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"syscall"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"

	"github.com/acme/inventory/order"
	"github.com/acme/inventory/stock"
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
	status, _ := (&Server{}).answer(fmt.Errorf("%w: X", stock.ErrInsufficientStock))
	assert.Equal(t, http.StatusConflict, status)
	status, _ = (&Server{}).answer(fmt.Errorf("%w: order 1", order.ErrConflict))
	assert.Equal(t, http.StatusConflict, status)
}
