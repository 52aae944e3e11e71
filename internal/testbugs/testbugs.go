// Package testbugs names the deliberate bugs the history check of make
// faults must catch (docs/faults.md, "The history check"). They exist only
// in a binary built with -tags faultbugs, and only the one named by
// INVENTORY_TEST_BUG is on; in every other build On is false and the
// bugs' code is not compiled in.
package testbugs

// The bugs, each a promise a checkout relies on broken so that the final
// state does not show it.
const (
	// StaleRead: a SKU's levels answered from a cache up to 1 s old.
	StaleRead = "stale-read"
	// GiveBackTwice: a cancel's units given back twice in the database,
	// put right by a repair half a second later.
	GiveBackTwice = "give-back-twice"
	// AckBeforeCommit: one batch of reservations in four answered as
	// committed while its transaction is rolled back.
	AckBeforeCommit = "ack-before-commit"
)

// Env is the variable that switches one bug on, in a faultbugs build.
const Env = "INVENTORY_TEST_BUG"
