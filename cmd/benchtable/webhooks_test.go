package main

import (
	"bytes"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
)

// A phase's CPU per sale is every counted process's CPU over its 201s,
// with the receiver's CPU taken out of this process's.
func TestHookPhasePerSale(t *testing.T) {
	p := hookPhase{sales: 1000, measured: true, receiver: 0.01,
		cpu: map[string]float64{"benchtable": 0.11, "redis-server": 0.02, "mariadbd": 0.05, "RocketMQ (java)": 0.03}}
	if got := p.perSale(); got < 199.99 || got > 200.01 {
		t.Errorf("per sale %.3f µs, want 200", got)
	}
	if !strings.HasPrefix(p.costNote(), "CPU µs per sale 200 (benchtable less the receiver 100, redis-server 20, mariadbd 50, RocketMQ (java) 30;") {
		t.Errorf("note: %s", p.costNote())
	}
	if (hookPhase{sales: 1000, cpu: p.cpu}).perSale() != 0 || (hookPhase{measured: true, cpu: p.cpu}).perSale() != 0 {
		t.Error("a phase not sampled, or without a sale, has no cost")
	}
}

// The cost ratio is judged on the median pair (with / none ≤ 1.10), the
// rate's ratio printed beside it; a phase with a subscription that took no
// delivery did not measure one, and misses. Exactly one sku.sold_out in
// the feed and at the receiver (distinct ids), sold = 2,000.
func TestWebhookChecks(t *testing.T) {
	phase := func(perSale float64, rate float64, deliveries int64) hookPhase {
		return hookPhase{sales: 1000, rate: rate, deliveries: deliveries, measured: true,
			cpu: map[string]float64{"benchtable": perSale / 2 * 1000 / 1e6, "mariadbd": perSale / 2 * 1000 / 1e6}}
	}
	run := &hooksRun{
		pairs: []hookPair{
			{none: phase(200, 5000, 0), with: phase(230, 4500, 5)}, // 1.15×
			{none: phase(200, 5000, 0), with: phase(210, 4900, 5)}, // 1.05×
			{none: phase(200, 5000, 0), with: phase(196, 5100, 5)}, // 0.98×
		},
		sale: &soldOutSale{sku: "S", feed: 1, distinct: 1, deliveries: 1, sold: soldOutUnits, created: soldOutUnits},
	}
	cs := webhookChecks(run)
	if len(cs) != 3 {
		t.Fatalf("%d checks, want 3", len(cs))
	}
	for i, c := range cs {
		if c.state != met || c.group != "webhooks" {
			t.Errorf("check %d (%s: %s): state %d, want met", i, c.what, c.measured, c.state)
		}
	}
	if want := "1.05× (#1: 200 → 230 µs, 1.15×; #2: 200 → 210 µs, 1.05×; #3: 200 → 196 µs, 0.98×); selling rate 0.98× (#1: 5000 → 4500/s; #2: 5000 → 4900/s; #3: 5000 → 5100/s); each process's CPU per sale, median pair: benchtable less the receiver 1.05×, mariadbd 1.05×"; cs[0].measured != want {
		t.Errorf("cost: %s\nwant  %s", cs[0].measured, want)
	}
	run.pairs[2].with = phase(225, 4600, 5) // the median pair: 1.125×
	if c := webhookChecks(run)[0]; c.state != missed || !strings.HasPrefix(c.measured, "1.12× ") {
		t.Errorf("median above 1.10: %s, state %d", c.measured, c.state)
	}
	run.pairs[2].with = phase(220, 4600, 5) // exactly 1.10×
	if c := webhookChecks(run)[0]; c.state != met {
		t.Errorf("median at 1.10: %s, state %d", c.measured, c.state)
	}
	run.pairs[1].with.deliveries = 0
	if c := webhookChecks(run)[0]; c.state != missed || !strings.Contains(c.measured, "no delivery in the phase with one subscription of pair #2") {
		t.Errorf("a silent subscription: %s, state %d", c.measured, c.state)
	}
	run.pairs[1].with.deliveries = 5
	run.pairs[0].none.measured = false
	if c := webhookChecks(run)[0]; c.state != unmeasured {
		t.Errorf("a pair without CPU samples: %s, state %d", c.measured, c.state)
	}

	for _, s := range []soldOutSale{
		{feed: 2, distinct: 1, sold: soldOutUnits},
		{feed: 1, distinct: 0, sold: soldOutUnits, timedOut: true},
		{feed: 1, distinct: 2, deliveries: 2, sold: soldOutUnits},
		{feed: 1, distinct: 1, sold: soldOutUnits, badSignatures: 1},
	} {
		run.sale = &s
		if c := webhookChecks(run)[1]; c.state != missed {
			t.Errorf("%+v: %s met", s, c.measured)
		}
	}
	// A delivery made twice is one event to a receiver that deduplicates.
	run.sale = &soldOutSale{feed: 1, distinct: 1, deliveries: 2, sold: soldOutUnits}
	if c := webhookChecks(run)[1]; c.state != met || c.measured != "feed 1, receiver 1 (deliveries: 2)" {
		t.Errorf("a repeated delivery: %s, state %d", c.measured, c.state)
	}
	run.sale = &soldOutSale{feed: 1, distinct: 1, deliveries: 1, sold: soldOutUnits + 1, created: soldOutUnits}
	if c := webhookChecks(run)[2]; c.state != missed || c.measured != "sold 2001 of 2000 (201s: 2000), oversell 1" {
		t.Errorf("oversold: %s, state %d", c.measured, c.state)
	}
	if webhookChecks(nil) != nil || webhookChecks(&hooksRun{}) != nil {
		t.Error("nothing run: no checks")
	}
}

func TestCountDeliveriesAndEvents(t *testing.T) {
	got := []hookDelivery{{1, arbiter.EventSoldOut, "A"}, {1, arbiter.EventSoldOut, "A"}, {2, arbiter.EventSoldOut, "B"},
		{3, arbiter.EventLevelChanged, "A"}, {4, arbiter.EventSoldOut, "A"}}
	if n, d := countDeliveries(got, "A", arbiter.EventSoldOut); n != 3 || d != 2 {
		t.Errorf("deliveries %d, distinct %d; want 3, 2", n, d)
	}
	events := []arbiter.Event{{Type: arbiter.EventSoldOut, SKU: "A"}, {Type: arbiter.EventBackInStock, SKU: "A"}, {Type: arbiter.EventSoldOut, SKU: "B"}}
	if n := countEvents(events, "A", arbiter.EventSoldOut); n != 1 {
		t.Errorf("events %d, want 1", n)
	}
}

// The receiver keeps a delivery whose signature verifies, counts one that
// does not, answers 200 to both, and measures its own CPU.
func TestReceiver(t *testing.T) {
	rc := startReceiver()
	defer rc.stop()
	body := []byte(`{"id":7,"type":"sku.sold_out","sku":"A","seq":3}`)
	post := func(sig string) {
		req, err := http.NewRequest(http.MethodPost, rc.url, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Event-Id", "7")
		req.Header.Set("X-Timestamp", "1700000000")
		req.Header.Set("X-Signature", sig)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("status %d", resp.StatusCode)
		}
	}
	post(hex.EncodeToString(inventory.Sign(hookSecret, "1700000000", body)))
	post("00")
	if n, d := rc.count("A", arbiter.EventSoldOut); n != 1 || d != 1 {
		t.Errorf("deliveries %d, distinct %d; want 1, 1", n, d)
	}
	if rc.bad.Load() != 1 {
		t.Errorf("bad signatures %d, want 1", rc.bad.Load())
	}
	if n, cpu := rc.snapshot(); n != 1 || cpu < 0 {
		t.Errorf("snapshot: %d deliveries, %s CPU", n, cpu)
	}
}
