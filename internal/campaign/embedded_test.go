package campaign_test

import (
	"testing"

	"github.com/acme/inventory/testkit/testrig"
)

// contract is the campaign suite that runs again on other stand-ins or
// another sale (TestEmbeddedContract, TestLeanContract).
var contract = []func(*testing.T){
	TestBurstBeforeTheOpeningNeverReachesTheDatabase,
	TestAFastClockCannotSellEarly,
	TestCampaignSellsExactlyItsAllotment,
	TestRedisFlushedAtTheOpening,
	TestLatePaymentAfterTheEnd,
	TestEndedBeforeItsOpening,
	TestNoStatementsBeforeTheOpening,
	TestAChangeOnAnotherNodeIsSeenWithinStaleness,
	TestABuyThatCrossesNothingCostsNoStatementMore,
}

// TestEmbeddedContract runs the campaign suite again on the embedded
// default's stand-ins (SQLite, miniredis, the in-process queue).
func TestEmbeddedContract(t *testing.T) {
	testrig.RunEmbedded(t, contract...)
}
