// Package stock takes stock in Redis: one Lua script checks and takes units
// atomically per SKU, each reservation is keyed by a token (usually the order
// id) so replays and double releases change nothing, and a cold SKU is
// initialised from the database by one caller under a distributed lock.
//
// The promise: for every limited SKU at every quiet point
//
//	database stock = available + held by unpaid reservations + paid but not yet applied
//
// so units sold never exceed units stocked, even when Redis loses its keys.
package stock

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"
)

// Unlimited is what Deduct returns (and what a SKU's stock is) when the SKU
// has no stock limit.
const Unlimited int64 = -1

// DefaultMaxQty bounds one reservation line.
const DefaultMaxQty int64 = 10_000

var (
	// ErrInvalidArgument: a SKU, token or quantity is malformed; Redis was not touched.
	ErrInvalidArgument = errors.New("stock: invalid argument")
	// ErrInsufficientStock: not enough units; nothing was taken.
	ErrInsufficientStock = errors.New("stock: insufficient stock")
	// ErrUnknownSKU: the init callback knows no such SKU.
	ErrUnknownSKU = errors.New("stock: unknown sku")
	// ErrTokenReleased: the token was released (cancel, timeout, refund) and can take nothing.
	ErrTokenReleased = errors.New("stock: reservation already released")
	// ErrNotHeld: the token holds no units of this SKU.
	ErrNotHeld = errors.New("stock: no reservation held by this token")
	// ErrUnavailable: the SKU could not be initialised in time (lock holder
	// slow or gone, database down). Safe to retry.
	ErrUnavailable = errors.New("stock: temporarily unavailable")
)

// Hold is one unpaid reservation known to the database.
type Hold struct {
	Token    string
	Qty      int64
	Deadline time.Time
}

// Snapshot is what the database says about a SKU, read in one transaction.
type Snapshot struct {
	// Stock is the durable stock, or Unlimited.
	Stock int64
	// Holds are the unpaid reservations (pending orders' lines).
	Holds []Hold
	// Pending is the units paid but not yet applied to Stock, minus the units
	// refunded but not yet restored to it.
	Pending int64
}

// InitFunc reads a SKU's Snapshot from the database for a cold init. It
// returns ErrUnknownSKU (wrapped or not) when the SKU does not exist.
type InitFunc func(ctx context.Context, sku string) (Snapshot, error)

// Line is one SKU and quantity of a cart.
type Line struct {
	SKU string
	Qty int64
}

var (
	skuPattern   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	tokenPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}

// ValidateSKU accepts 1-64 characters of [A-Za-z0-9._-], starting with a
// letter or digit (braces would break the Cluster hash tag).
func ValidateSKU(sku string) error {
	if !skuPattern.MatchString(sku) {
		return invalid("sku must be 1-64 characters of A-Z a-z 0-9 . _ -, got %q", truncate(sku))
	}
	return nil
}

// ValidateToken accepts 1-128 characters of [A-Za-z0-9._:-].
func ValidateToken(token string) error {
	if !tokenPattern.MatchString(token) {
		return invalid("token must be 1-128 characters of A-Z a-z 0-9 . _ : -, got %q", truncate(token))
	}
	return nil
}

func validateQty(qty, max int64) error {
	if qty <= 0 || qty > max {
		return invalid("qty must be between 1 and %d, got %d", max, qty)
	}
	return nil
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
