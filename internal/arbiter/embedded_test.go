package arbiter_test

import (
	"testing"

	"github.com/acme/inventory/internal/testrig"
)

// TestEmbeddedContract runs the arbiter's tests again on the embedded
// default's stand-ins (SQLite, miniredis, the in-process queue): all but the
// deadlock, which needs two connections (the embedded SQLite has one).
func TestEmbeddedContract(t *testing.T) {
	testrig.Embedded = true
	defer func() { testrig.Embedded = false }()
	for _, tc := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"MovementsFullLife", TestMovementsFullLife},
		{"MovementsLatePaymentAndUnlimited", TestMovementsLatePaymentAndUnlimited},
		{"MovementsReconcileCorrection", TestMovementsReconcileCorrection},
		{"MovementsConserveUnderRace", TestMovementsConserveUnderRace},
		{"MovementsRolledBackReservation", TestMovementsRolledBackReservation},
		{"ReserveRefusesPastOnHand", TestReserveRefusesPastOnHand},
		{"ReserveRaceNeverOversells", TestReserveRaceNeverOversells},
		{"ReservePerUserQuota", TestReservePerUserQuota},
		{"ReservePerUserQuotaRace", TestReservePerUserQuotaRace},
		{"ReleaseGivesBackOnce", TestReleaseGivesBackOnce},
		{"ReleaseRaceGivesBackOnce", TestReleaseRaceGivesBackOnce},
		{"CommitRequiresHeld", TestCommitRequiresHeld},
		{"TombstoneCollidesWithALaterReservation", TestTombstoneCollidesWithALaterReservation},
		{"Set", TestSet},
		{"SetCreateRace", TestSetCreateRace},
		{"Restock", TestRestock},
		{"FixReserved", TestFixReserved},
		{"NewEpochAndInitFunc", TestNewEpochAndInitFunc},
	} {
		t.Run(tc.name, tc.fn)
	}
}
