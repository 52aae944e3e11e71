package events_test

import (
	"testing"

	"github.com/acme/inventory/internal/testrig"
)

// TestEmbeddedContract runs the race through the group commit again on the
// embedded default's stand-ins (SQLite, miniredis).
func TestEmbeddedContract(t *testing.T) {
	testrig.RunEmbedded(t, TestGroupCommitRaceAnnouncesOneSoldOut)
}
