package order_test

import (
	"testing"

	"github.com/acme/inventory/internal/testrig"
)

// TestEmbeddedContract runs the order suite again on the embedded default's
// stand-ins (SQLite, miniredis, the in-process queue).
func TestEmbeddedContract(t *testing.T) {
	testrig.Embedded = true
	defer func() { testrig.Embedded = false }()
	for _, tc := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"CreateReservesFirst", TestCreateReservesFirst},
		{"IdempotentCreate", TestIdempotentCreate},
		{"PayCancelRefund", TestPayCancelRefund},
		{"CancelPayRaceOneWinner", TestCancelPayRaceOneWinner},
		{"LatePayment", TestLatePayment},
		{"ItemsAreTheReservations", TestItemsAreTheReservations},
		{"ItemsOfOrdersBeforeReservations", TestItemsOfOrdersBeforeReservations},
		{"EndToEnd", TestEndToEndMemory},
		{"KeyLossWithPendingAndUnapplied", TestKeyLossWithPendingAndUnapplied},
		{"DatabaseRefusesWhatRedisOverAdmits", TestDatabaseRefusesWhatRedisOverAdmits},
		{"PerUserLimitIsArbitratedByTheDatabase", TestPerUserLimitIsArbitratedByTheDatabase},
		{"PerUserLimitSetLater", TestPerUserLimitSetLater},
		{"PerUserLimitRace", TestPerUserLimitRace},
	} {
		t.Run(tc.name, tc.fn)
	}
}
