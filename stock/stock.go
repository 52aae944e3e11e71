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
//
// A flash-sale campaign's pool (its allotment's unsold units) is a second
// kind of Redis value of a SKU, fenced the same way by the pool's own seq
// and epoch, and admitted by the same script, which also checks the
// campaign's window (campaign.go).
package stock

import (
	"errors"
	"regexp"
)

var errScriptAnswer = errors.New("stock: the deduction script answered other than two integers")

// keyPattern bounds a token as Admit stores it: a client's token with its
// namespace prefix.
var keyPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,139}$`)
