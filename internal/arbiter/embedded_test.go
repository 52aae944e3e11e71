package arbiter_test

import (
	"testing"

	"github.com/acme/inventory/testkit/testrig"
)

// TestEmbeddedContract runs the arbiter's tests again on the embedded
// default's stand-ins (SQLite, miniredis, the in-process queue): all but the
// deadlock, which needs two connections (the embedded SQLite has one).
func TestEmbeddedContract(t *testing.T) {
	testrig.RunEmbedded(t,
		TestMovementsFullLife,
		TestMovementsLatePaymentAndUnlimited,
		TestMovementsReconcileCorrection,
		TestMovementsConserveUnderRace,
		TestMovementsRolledBackReservation,
		TestReserveRefusesPastOnHand,
		TestReserveRaceNeverOversells,
		TestReservePerUserQuota,
		TestReservePerUserQuotaRace,
		TestReleaseGivesBackOnce,
		TestReleaseRaceGivesBackOnce,
		TestCommitRequiresHeld,
		TestTombstoneCollidesWithALaterReservation,
		TestSet,
		TestSetCreateRace,
		TestRestock,
		TestFixReserved,
		TestNewEpochAndInitFunc,
		TestCampaignCarvesItsAllotment,
		TestCampaignWindowIsTheDatabases,
		TestCampaignSalesRace,
		TestCampaignReleaseAndEnd,
		TestEventsEachPathCrossesOnce,
		TestEventsRolledBackChangeWritesNone,
		TestEventsRaceAcrossZero,
		TestEventsLevelChangedCoalesced,
		TestEventsPublishAndPage,
		TestEventsUnlimited,
		TestCampaignEventsEachPathCrossesOnce,
		TestCampaignEventsRolledBackSaleWritesNone,
		TestCampaignEventsRaceAcrossZero,
		TestCampaignSaleCrossingNothingCostsNoStatement,
		TestReservePastGORMSendsWhatGORMSent,
		TestCountRebaseReadsShortRanges,
		TestCountRebaseReadsNoReservation,
	)
}
