// Package stock is the Redis side of the stock: it admits reservations at
// Redis speed. One Lua script checks and takes units atomically per SKU; a
// cold SKU is initialised from the database by one caller under a
// distributed lock. Redis admits, the database arbitrates: a reservation
// exists only once the database has recorded it (package order), so Redis may
// be wrong for a moment (a late refusal, a unit hidden until realignment) but
// never sells a unit twice.
//
// Redis's value of a SKU is fenced against the database: each initialisation
// carries an epoch and the database seq it read, so a change the database
// committed is added to Redis exactly once, by the initialisation or by the
// change itself (Store.Apply).
package stock

import (
	"context"
	"errors"
	"fmt"
	"regexp"
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
	// ErrReplay: the token reserved before; nothing was taken, and the
	// database holds the answer.
	ErrReplay = errors.New("stock: token reserved before")
	// ErrOverLimit: the buyer would pass the SKU's per-user limit; nothing
	// was taken or counted.
	ErrOverLimit = errors.New("stock: per-user limit reached")
	// ErrUnavailable: the SKU could not be initialised in time (lock holder
	// slow or gone, database down). Safe to retry.
	ErrUnavailable = errors.New("stock: temporarily unavailable")

	errScriptAnswer = errors.New("stock: the deduction script answered other than two integers")
)

// Level is what one initialisation writes: the database's available units
// (or Unlimited) as of its change counter Seq, under a fresh Epoch.
type Level struct {
	Available int64
	Epoch     int64
	Seq       int64
}

// InitFunc reads sku's Level from the database and calls write with it while
// the database still holds the SKU's row lock, so no change of available
// units commits between the read and the write. It returns ErrUnknownSKU
// (wrapped or not) when the SKU does not exist, and write's error otherwise.
type InitFunc func(ctx context.Context, sku string, write func(Level) error) error

// Line is one SKU and quantity of a cart.
type Line struct {
	SKU string
	Qty int64
}

var (
	skuPattern   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	tokenPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)
	// keyPattern bounds a token as Admit stores it: a client's token with
	// its namespace prefix.
	keyPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,139}$`)
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
