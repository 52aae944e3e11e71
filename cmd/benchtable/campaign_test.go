package main

import (
	"strings"
	"testing"
	"time"
)

// The campaign targets are judged on the openings together: the rate
// before starts_at over all their windows, the first 201's p50, the
// selling rate from each first 201 to its last, the database's account,
// and the round trips per extension.
func TestCampaignChecks(t *testing.T) {
	open := func(first time.Duration, stmts int64) opening {
		return opening{id: "OPEN-1", allotment: 100, before: 2 * time.Second, buys: 9000, polls: 3000,
			stmts: stmtCount{tagged: stmts}, firstSale: first, sales: 100, sellingFor: time.Second, sold: 100, left: 0}
	}
	run := &campaignRun{bare: 3000, soldOut: 5500, selling: 90, wired: true,
		openings: []opening{open(20*time.Millisecond, 0), open(60*time.Millisecond, 0), open(30*time.Millisecond, 0)},
		extends: []extension{
			{route: "POST /v1/stock/extend", answers: 1000, wire: 1020, idle: 10, window: 2 * time.Second, perAnswer: 1.0},
			{route: "POST /v1/orders/{id}/extend", answers: 1000, wire: 6020, idle: 10, window: 2 * time.Second, perAnswer: 6.0},
		}}
	cs := campaignChecks(run)
	want := []int{met, missed, met, met, met, met, met, missed}
	if len(cs) != len(want) {
		t.Fatalf("%d checks, want %d", len(cs), len(want))
	}
	for i, c := range cs {
		if c.state != want[i] || !c.campaign {
			t.Errorf("check %d (%s: %s): state %d, want %d", i, c.what, c.measured, c.state, want[i])
		}
	}
	// 6000 requests per second before the opening: 2× bare, above sold out;
	// the buys alone (4500/s) below sold out.
	if !strings.HasPrefix(cs[0].measured, "6000/s: 2.00× bare") {
		t.Errorf("rate before: %s", cs[0].measured)
	}
	if !strings.HasPrefix(cs[3].measured, "30ms") {
		t.Errorf("first 201 p50: %s", cs[3].measured)
	}
	// Selling: 3 × 99 201s after the first over 3 s, against 90/s.
	if !strings.HasPrefix(cs[4].measured, "110% (99 / 90 per s)") {
		t.Errorf("selling: %s", cs[4].measured)
	}
	run.selling = 100
	if cs := campaignChecks(run); cs[4].state != missed {
		t.Errorf("selling below seckill's: %s", cs[4].measured)
	}
	// A sale answered 503 is sold without a 201: the database's account
	// decides; a unit left in the pool misses.
	run.openings[1].sales = 99
	if cs := campaignChecks(run); cs[5].state != met || !strings.Contains(cs[5].measured, "100 of 100 (201s: 99)") {
		t.Errorf("account: %s", cs[5].measured)
	}
	run.openings[1].left = 1
	if cs := campaignChecks(run); cs[5].state != missed || !strings.Contains(cs[5].measured, "1 left in the pool") {
		t.Errorf("account with a unit left: %s", cs[5].measured)
	}

	run.openings[0].stmts.tagged = 2
	if cs := campaignChecks(run); cs[2].state != missed {
		t.Errorf("statements before the opening: %s", cs[2].measured)
	}
	run.wired = false
	if cs := campaignChecks(run); cs[6].state != unmeasured {
		t.Errorf("round trips without the counted network: %s", cs[6].measured)
	}
	if campaignChecks(&campaignRun{}) != nil || campaignChecks(nil) != nil {
		t.Error("no openings: no checks")
	}
}
