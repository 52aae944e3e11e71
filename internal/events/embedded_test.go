package events_test

import (
	"testing"

	"github.com/acme/inventory/testkit/testrig"
)

// TestEmbeddedContract runs the races through the group commit, the
// campaigns' clock and their end again on the embedded default's
// stand-ins (SQLite, miniredis).
func TestEmbeddedContract(t *testing.T) {
	testrig.RunEmbedded(t,
		TestGroupCommitRaceAnnouncesOneSoldOut,
		TestGroupCommitRaceAnnouncesOneCampaignSoldOut,
		TestAFastClockCannotStartACampaignEarly,
		TestCampaignEndedOnceByTheRouteAndItsWindow,
	)
}
