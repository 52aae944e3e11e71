// Package inventory is the service's vocabulary: what a line of a cart, a
// committed change and a Redis baseline are, the limits and validators of
// names and quantities, and the one set of errors every layer answers with.
// It imports the standard library only, so every other package may import
// it: the database's arbiter, the Redis adapter (package stock), the order
// lifecycle and the HTTP layer speak of the same things without importing
// one another. Each dependency has one adapter package (stock: Redis, mq:
// RocketMQ, internal/arbiter: the database's quantities); the HTTP layer
// maps these errors to statuses in one table.
package inventory

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"
)

// Unlimited is a SKU's on_hand when it has no stock limit, and what an
// admission answers for such a SKU (nothing is taken).
const Unlimited int64 = -1

// DefaultMaxQty bounds one reservation line.
const DefaultMaxQty int64 = 10_000

// DefaultTTL is how long an unpaid order (or a token-API reservation)
// holds stock. The service's configuration (internal/app) states the same
// value, and the defaults of the background jobs (internal/expiry,
// internal/maintenance), for operators; a test there keeps them equal.
const DefaultTTL = 15 * time.Minute

// MinHold and DefaultMaxHold bound the hold a caller may ask for
// (hold_seconds when it reserves, seconds when it extends): at least
// MinHold, and never past the maximum counted from the hold's creation
// (INVENTORY_MAX_HOLD, DefaultMaxHold unless configured).
const (
	MinHold        = 10 * time.Second
	DefaultMaxHold = 2 * time.Hour
)

// Holds is a service's hold policy: how long a reservation holds when the
// caller does not say (Default), and the most it may hold counted from its
// creation (Max).
type Holds struct{ Default, Max time.Duration }

// For is the hold a caller asked for (0: the default): ErrInvalidArgument
// outside [MinHold, Max].
func (h Holds) For(hold time.Duration) (time.Duration, error) {
	if hold == 0 {
		return h.Default, nil
	}
	if hold < MinHold || hold > h.Max {
		return 0, Invalidf("hold_seconds must be between %d and %d", int64(MinHold/time.Second), int64(h.Max/time.Second))
	}
	return hold, nil
}

// Seconds is n seconds as a duration, saturating instead of overflowing
// (a huge hold_seconds is then refused as too long, not wrapped).
func Seconds(n int64) time.Duration {
	if n > int64(1<<63-1)/int64(time.Second) {
		return 1<<63 - 1
	}
	if n < 0 {
		return -1
	}
	return time.Duration(n) * time.Second
}

var (
	// ErrInvalidArgument: a SKU, token, quantity or field is malformed;
	// nothing was touched.
	ErrInvalidArgument = errors.New("inventory: invalid argument")
	// ErrInsufficientStock: not enough units; nothing was taken.
	ErrInsufficientStock = errors.New("inventory: insufficient stock")
	// ErrUnknownSKU: there is no such SKU (the init callback found none).
	ErrUnknownSKU = errors.New("inventory: unknown sku")
	// ErrReplay: the token reserved before; nothing was taken, and the
	// database holds the answer.
	ErrReplay = errors.New("inventory: token reserved before")
	// ErrOverLimit: the buyer would pass the SKU's per-user limit; nothing
	// was taken or counted.
	ErrOverLimit = errors.New("inventory: per-user limit reached")
	// ErrUnavailable: a dependency did not answer in time (a SKU could not
	// be initialised, the database is behind). Safe to retry.
	ErrUnavailable = errors.New("inventory: temporarily unavailable")
	// ErrNotFound: no such order or SKU.
	ErrNotFound = errors.New("inventory: not found")
	// ErrConflict: the order is not in a state that allows the operation, or
	// an idempotency key or payment id is reused for something else.
	ErrConflict = errors.New("inventory: conflict")
	// ErrPrecondition: a write carried the SKU version the caller read
	// (If-Match) and the SKU has changed since.
	ErrPrecondition = errors.New("inventory: precondition failed")
	// ErrForbidden: the caller may not act on this (another buyer's order).
	ErrForbidden = errors.New("inventory: forbidden")
	// ErrNotStarted: a campaign's sale has not opened yet; nothing was
	// taken (HTTP 409 sale_not_started, with Retry-After).
	ErrNotStarted = errors.New("inventory: sale not started")
	// ErrEnded: a campaign's sale is over; nothing was taken (HTTP 409
	// sale_ended).
	ErrEnded = errors.New("inventory: sale ended")
)

// UnknownSKU: there is no such SKU. It is ErrNotFound and ErrUnknownSKU
// alike, with one message wherever it is found.
type UnknownSKU string

func (u UnknownSKU) Error() string { return "unknown sku: " + string(u) }

func (u UnknownSKU) Is(target error) bool {
	return target == ErrNotFound || target == ErrUnknownSKU
}

// Invalidf is an ErrInvalidArgument that says what is wrong.
func Invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}

// Line is one SKU and quantity of a cart.
type Line struct {
	SKU string
	Qty int64
}

// Change is a change of a SKU's available units that the database
// committed: Delta at the SKU's change counter Seq. Epoch is set when the
// change stands for an admission already taken in Redis (a reservation
// whose database write committed after a re-init); 0 otherwise. Buyers are
// the per-user counts (buyer_quotas) the same change moved, user -> units
// (+ bought, - given back): Redis's buyers hash follows them under the same
// fence as Delta.
//
// Seq and Ref name the change: Redis counts a change once however often it
// is delivered (a retry after a lost reply). Ref tells apart changes that
// share a Seq, because one increment of the counter stood for several
// writes: a group commit moves a SKU (or a campaign's pool) once for all
// its batch's reservations, and each reservation's change then carries its
// reservation's token. "" for a change alone at its Seq.
type Change struct {
	SKU    string
	Delta  int64
	Seq    int64
	Epoch  int64
	Ref    string
	Buyers map[string]int64
}

// Baseline is what one initialisation of a SKU in Redis starts from: the
// database's available units (or Unlimited) and its buyers' per-user counts
// (user -> units, those above zero; none when the SKU has no per-user
// limit), as of its change counter Seq, under a fresh Epoch.
type Baseline struct {
	Available int64
	Epoch     int64
	Seq       int64
	Buyers    map[string]int64
}

// InitFunc reads sku's Baseline from the database and calls write with it
// while the database still holds the SKU's row lock, so no change of
// available units commits between the read and the write. It returns
// ErrUnknownSKU (wrapped or not) when the SKU does not exist, and write's
// error otherwise.
type InitFunc func(ctx context.Context, sku string, write func(Baseline) error) error

var (
	skuPattern   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	tokenPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)
	idemPattern  = regexp.MustCompile(`^[\x21-\x7e]{1,128}$`)
)

// ValidateIdempotencyKey accepts an Idempotency-Key of 1-128 printable
// ASCII characters, or none ("").
func ValidateIdempotencyKey(key string) error {
	if key != "" && !idemPattern.MatchString(key) {
		return Invalidf("Idempotency-Key must be 1-128 printable ASCII characters")
	}
	return nil
}

// ValidateSKU accepts 1-64 characters of [A-Za-z0-9._-], starting with a
// letter or digit (braces would break the Redis Cluster hash tag).
func ValidateSKU(sku string) error {
	if !skuPattern.MatchString(sku) {
		return Invalidf("sku must be 1-64 characters of A-Z a-z 0-9 . _ -, got %q", Truncate(sku))
	}
	return nil
}

// ValidateToken accepts 1-128 characters of [A-Za-z0-9._:-].
func ValidateToken(token string) error {
	if !tokenPattern.MatchString(token) {
		return Invalidf("token must be 1-128 characters of A-Z a-z 0-9 . _ : -, got %q", Truncate(token))
	}
	return nil
}

// ValidateQty accepts 1 to max.
func ValidateQty(qty, max int64) error {
	if qty <= 0 || qty > max {
		return Invalidf("qty must be between 1 and %d, got %d", max, qty)
	}
	return nil
}

// Truncate shortens s for an error message (80 bytes and "...").
func Truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
