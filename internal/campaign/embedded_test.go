package campaign_test

import (
	"testing"

	"github.com/acme/inventory/testkit/testrig"
)

// TestEmbeddedContract runs the campaign suite again on the embedded
// default's stand-ins (SQLite, miniredis, the in-process queue).
func TestEmbeddedContract(t *testing.T) {
	testrig.RunEmbedded(t,
		TestBurstBeforeTheOpeningNeverReachesTheDatabase,
		TestAFastClockCannotSellEarly,
		TestCampaignSellsExactlyItsAllotment,
		TestRedisFlushedAtTheOpening,
		TestLatePaymentAfterTheEnd,
		TestEndedBeforeItsOpening,
		TestNoStatementsBeforeTheOpening,
		TestAChangeOnAnotherNodeIsSeenWithinStaleness,
		TestABuyThatCrossesNothingCostsNoStatementMore,
	)
}
