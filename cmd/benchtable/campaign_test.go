package main

import (
	"strings"
	"testing"
	"time"
)

// The campaign targets are judged on the openings together: the rate
// before starts_at against the bare handler and the sold-out phase run
// just before each opening (the median opening), the first 201's p50, the
// selling rate from each first 201 to its last against the seckill selling
// phase run just before the opening (the median opening), the database's
// account,
// and the round trips per extension.
func TestCampaignChecks(t *testing.T) {
	open := func(first time.Duration, bare, soldOut float64) opening {
		return opening{id: "OPEN-1", allotment: 100, before: 2 * time.Second, buys: 9000, polls: 3000, bare: bare, soldOut: soldOut, seckill: 90,
			firstSale: first, sales: 100, sellingFor: time.Second, sold: 100, left: 0}
	}
	// 6000 requests per second before each opening: 2×, 1.5× and 2.4× bare,
	// above, below and at the sold-out phase.
	run := &campaignRun{wired: true,
		openings: []opening{open(20*time.Millisecond, 3000, 5500), open(60*time.Millisecond, 4000, 6500), open(30*time.Millisecond, 2500, 6000)},
		extends: []extension{
			{route: "POST /v1/stock/extend", answers: 1000, wire: 1020, idle: 10, window: 2 * time.Second, perAnswer: 1.0},
			{route: "POST /v1/orders/{id}/extend", answers: 1000, wire: 6020, idle: 10, window: 2 * time.Second, perAnswer: 6.0},
		}}
	cs := campaignChecks(run)
	want := []int{met, met, met, met, met, met, missed}
	if len(cs) != len(want) {
		t.Fatalf("%d checks, want %d", len(cs), len(want))
	}
	for i, c := range cs {
		if c.state != want[i] || c.group != "campaign" {
			t.Errorf("check %d (%s: %s): state %d, want %d", i, c.what, c.measured, c.state, want[i])
		}
	}
	if !strings.HasPrefix(cs[0].measured, "2.00× bare, 1.00× sold out (#1: 6000/s, 2.00× bare (3000/s), 1.09× sold out (5500/s); ") ||
		!strings.HasSuffix(cs[0].measured, "the buys alone (409 sale_not_started): 4500/s") {
		t.Errorf("rate before: %s", cs[0].measured)
	}
	run.openings[2].bare = 3500 // the median opening: 1.71× bare
	if cs := campaignChecks(run); cs[0].state != missed {
		t.Errorf("rate before below 2× bare: %s", cs[0].measured)
	}
	run.openings[2].bare, run.openings[2].soldOut = 2500, 6100 // the median: 0.98× sold out
	if cs := campaignChecks(run); cs[0].state != missed {
		t.Errorf("rate before below the sold-out phase: %s", cs[0].measured)
	}
	if !strings.HasPrefix(cs[2].measured, "30ms") {
		t.Errorf("first 201 p50: %s", cs[3].measured)
	}
	// Selling: 99 201s after the first in 1 s, against 90/s before each.
	if cs[3].measured != "110% (#1: 99 / 90 per s; #1: 99 / 90 per s; #1: 99 / 90 per s)" {
		t.Errorf("selling: %s", cs[3].measured)
	}
	run.openings[0].seckill, run.openings[1].seckill = 100, 120 // the median opening: 99%
	if cs := campaignChecks(run); cs[3].state != missed {
		t.Errorf("selling below seckill's: %s", cs[3].measured)
	}
	run.openings[0].seckill = 99
	if cs := campaignChecks(run); cs[3].state != met {
		t.Errorf("selling at seckill's in the median opening: %s", cs[3].measured)
	}
	// A sale answered 503 is sold without a 201: the database's account
	// decides; a unit left in the pool misses.
	run.openings[1].sales = 99
	if cs := campaignChecks(run); cs[4].state != met || !strings.Contains(cs[4].measured, "100 of 100 (201s: 99)") {
		t.Errorf("account: %s", cs[4].measured)
	}
	run.openings[1].left = 1
	if cs := campaignChecks(run); cs[4].state != missed || !strings.Contains(cs[4].measured, "1 left in the pool") {
		t.Errorf("account with a unit left: %s", cs[4].measured)
	}

	run.openings[0].stmts.tagged = 2
	if cs := campaignChecks(run); cs[1].state != missed {
		t.Errorf("statements before the opening: %s", cs[1].measured)
	}
	run.wired = false
	if cs := campaignChecks(run); cs[5].state != unmeasured {
		t.Errorf("round trips without the counted network: %s", cs[5].measured)
	}
	if campaignChecks(&campaignRun{}) != nil || campaignChecks(nil) != nil {
		t.Error("no openings: no checks")
	}
}
