package main

import (
	"strings"
	"testing"
	"time"
)

// The campaign targets are judged on the openings together: the CPU per
// answer before starts_at against the sold-out phases' run just before and
// just after each opening (the median opening, within 10%), the first
// 201's p50, the selling rate from each first 201 to its last against the
// seckill selling phases' (the median opening, within 10%), the database's
// account, and the round trips per extension.
func TestCampaignChecks(t *testing.T) {
	open := func(first time.Duration, cost, soldOutCost float64) opening {
		return opening{id: "OPEN-1", allotment: 100, before: 2 * time.Second, buys: 9000, polls: 3000, soldOut: 5000, cost: cost, soldOutCost: soldOutCost, seckill: 90,
			firstSale: first, sales: 100, sellingFor: time.Second, sold: 100, left: 0}
	}
	// 1.10×, 0.90× and 1.05× the sold-out answer's cost: the median 1.05×.
	run := &campaignRun{wired: true,
		openings: []opening{open(20*time.Millisecond, 44, 40), open(60*time.Millisecond, 36, 40), open(30*time.Millisecond, 42, 40)},
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
	if cs[0].target != "≤ 1.10×" || cs[0].measured != "1.05× (#1: 44.0 / 40.0 µs, 1.10×; #1: 36.0 / 40.0 µs, 0.90×; #1: 42.0 / 40.0 µs, 1.05×)"+
		"; not judged: requests per second before starts_at 1.20× the sold-out phase's (median), of them the buys alone (409 sale_not_started) 4500/s" {
		t.Errorf("cost before: %s (target %s)", cs[0].measured, cs[0].target)
	}
	run.openings[1].cost = 45 // the median opening: 1.10×, at the bound
	if cs := campaignChecks(run); cs[0].state != met {
		t.Errorf("cost before at 1.10× the sold-out answer's: %s", cs[0].measured)
	}
	run.openings[2].cost = 44.8 // the median: 1.12×
	if cs := campaignChecks(run); cs[0].state != missed {
		t.Errorf("cost before above 1.10× the sold-out answer's: %s", cs[0].measured)
	}
	run.openings[2].soldOutCost = 0 // an opening without its CPU: not measured
	if cs := campaignChecks(run); cs[0].state != unmeasured {
		t.Errorf("cost before without /proc's samples: %s", cs[0].measured)
	}
	run.openings[1].cost, run.openings[2].cost, run.openings[2].soldOutCost = 36, 42, 40
	if !strings.HasPrefix(cs[2].measured, "30ms") {
		t.Errorf("first 201 p50: %s", cs[2].measured)
	}
	// Selling: 99 201s after the first in 1 s, against 90/s before each.
	if cs[3].measured != "110% (#1: 99 / 90 per s; #1: 99 / 90 per s; #1: 99 / 90 per s)" {
		t.Errorf("selling: %s", cs[3].measured)
	}
	if cs[3].target != "≥ 90%" {
		t.Errorf("selling target %s", cs[3].target)
	}
	run.openings[0].seckill, run.openings[1].seckill = 120, 111 // the median opening: 89%
	if cs := campaignChecks(run); cs[3].state != missed {
		t.Errorf("selling below 90%% of seckill's: %s", cs[3].measured)
	}
	run.openings[1].seckill = 110 // the median opening: 90%
	if cs := campaignChecks(run); cs[3].state != met {
		t.Errorf("selling at 90%% of seckill's in the median opening: %s", cs[3].measured)
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
