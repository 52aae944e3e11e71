package order_test

import (
	"testing"

	"github.com/acme/inventory/testkit/testrig"
)

// TestEmbeddedContract runs the order suite again on the embedded default's
// stand-ins (SQLite, miniredis, the in-process queue).
func TestEmbeddedContract(t *testing.T) {
	testrig.RunEmbedded(t,
		TestCreateReservesFirst,
		TestIdempotentCreate,
		TestIdempotentRetryAfterRedisForgot,
		TestPayCancelRefund,
		TestCancelPayRaceOneWinner,
		TestLatePayment,
		TestItemsAreTheReservations,
		TestItemsOfOrdersBeforeReservations,
		TestEndToEndMemory,
		TestKeyLossWithPendingAndUnapplied,
		TestDatabaseRefusesWhatRedisOverAdmits,
		TestPerUserLimitIsArbitratedByTheDatabase,
		TestPerUserLimitSetLater,
		TestPerUserLimitRace,
		TestRealignRestoresBuyersCounts,
		TestLostBuyersCountsComeBackFromTheDatabase,
		TestCreateHold,
		TestExtendRules,
		TestExtensionRacesTheTimeout,
		TestExtensionIsOneRoundTrip,
		TestLeanContract,
		TestLeanSaleRecordsOneRowPerHold,
		TestLeanHoldExpiresWithoutTheProjector,
		TestLeanSalesRaceTheProjector,
		TestLeanKeyIsOneOrderAcrossWritePaths,
		TestLeanCartIsProjectedWhole,
	)
}
