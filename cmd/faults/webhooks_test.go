package main

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/arbiter"
)

// The webhooks scenario's judge fails a run on each kind of broken
// promise, exactly, given a forged delivery log, feed and movement history
// (TestFaults proves the checker's zeros the same way; the scenario itself
// is too long for make test's quick subset).
func TestHookJudgeCountsEachBrokenPromise(t *testing.T) {
	const (
		sold = arbiter.EventSoldOut
		back = arbiter.EventBackInStock
		low  = arbiter.EventLowStock
		lvl  = arbiter.EventLevelChanged
	)
	// Two SKUs' events, interleaved in feed order, each SKU's seq 1, 2, ...
	feed := []feedEvent{
		{ID: 1, Type: lvl, SKU: "A", Seq: 1}, {ID: 2, Type: low, SKU: "A", Seq: 2}, {ID: 3, Type: lvl, SKU: "B", Seq: 1},
		{ID: 4, Type: sold, SKU: "A", Seq: 3}, {ID: 5, Type: sold, SKU: "B", Seq: 2}, {ID: 6, Type: back, SKU: "A", Seq: 4},
		{ID: 7, Type: back, SKU: "B", Seq: 3}, {ID: 8, Type: lvl, SKU: "A", Seq: 5},
	}
	arrive := func(ids ...int64) []arrival {
		var out []arrival
		for _, id := range ids {
			e := feed[id-1]
			out = append(out, arrival{ID: e.ID, Type: e.Type, SKU: e.SKU, Seq: e.Seq})
		}
		return out
	}
	every := subLog{ID: "every", Events: slices.Clone(arbiter.EventTypes)}
	onlyA := subLog{ID: "onlyA", Events: []string{sold, back}, SKUs: []string{"A"}, From: 1}
	judge := func(s subLog) (SubCheck, []string) {
		t.Helper()
		hc := &HookCheck{}
		sc := judgeDeliveries(feed, s, hc)
		return sc, hc.Problems
	}

	t.Run("delivered at least once, in order", func(t *testing.T) {
		// A redelivery of 3 and 4 after 5 (a takeover from the cursor) is
		// allowed, and counted.
		s := every
		s.Arrivals = arrive(1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 8, 8)
		sc, problems := judge(s)
		assert.Empty(t, problems)
		assert.Equal(t, SubCheck{ID: "every", Expected: 8, Delivered: 8, Arrivals: 12, Duplicates: 4}, sc)
		s = onlyA // from feed id 1, A's sold and back only: 4 and 6
		s.Arrivals = arrive(4, 6)
		sc, problems = judge(s)
		assert.Empty(t, problems)
		assert.Equal(t, SubCheck{ID: "onlyA", Expected: 2, Delivered: 2, Arrivals: 2}, sc)
	})
	t.Run("an event dropped", func(t *testing.T) {
		s := every
		s.Arrivals = arrive(1, 2, 3, 4, 6, 7, 8)
		sc, problems := judge(s)
		assert.Equal(t, 1, sc.Missing)
		assert.Equal(t, []string{"every: 1 events of the feed never delivered (ids [5])"}, problems)
	})
	t.Run("a SKU's later event first", func(t *testing.T) {
		s := every
		s.Arrivals = arrive(1, 4, 2, 3, 5, 6, 7, 8) // A seq 3 before A seq 2 (and B's 3 after 4)
		sc, problems := judge(s)
		assert.Equal(t, 2, sc.OutOfOrder)
		assert.Equal(t, []string{"every: A seq 2 (event 2) first delivered after seq 3", "every: event 3 first delivered after event 4"}, problems)
	})
	t.Run("another SKU's later event first", func(t *testing.T) {
		s := every
		s.Arrivals = arrive(1, 2, 4, 3, 5, 6, 7, 8) // per SKU in order, feed order not
		sc, problems := judge(s)
		assert.Equal(t, 1, sc.OutOfOrder)
		assert.Equal(t, []string{"every: event 3 first delivered after event 4"}, problems)
	})
	t.Run("deliveries not the feed's or not asked for", func(t *testing.T) {
		s := onlyA
		s.Arrivals = append(arrive(4, 5), arrival{ID: 6, Type: back, SKU: "A", Seq: 9}) // B's; A's with a forged seq
		sc, problems := judge(s)
		assert.Equal(t, 2, sc.Foreign)
		assert.Equal(t, 1, sc.Missing) // 6 as the feed has it never came
		assert.Len(t, problems, 3)
		assert.Contains(t, problems[0], "onlyA: delivered event 5 (sku.sold_out B) it did not ask for")
		assert.Contains(t, problems[1], "onlyA: delivered event 6 (sku.back_in_stock A seq 9) is not the feed's")
	})
	t.Run("a signature refused", func(t *testing.T) {
		s := every
		s.Arrivals = arrive(1, 2, 3, 4, 5, 6, 7, 8)
		s.Refused = []string{"X-Event-Id 9: webhook: the signature does not match"}
		sc, problems := judge(s)
		assert.Equal(t, 1, sc.Refused)
		assert.Equal(t, []string{"every: a delivery's signature was refused: X-Event-Id 9: webhook: the signature does not match"}, problems)
	})
}

// The threshold events are held to the crossings the movements make, as
// the arbiter decides them: the path of TestEventsEachPathCrossesOnce
// (internal/arbiter), replayed from its movements.
func TestHookJudgeCrossingsFromMovements(t *testing.T) {
	mv := func(onHand, reserved int64) movement { return movement{SKU: "A", OnHandD: onHand, ReservedD: reserved} }
	moves := map[string][]movement{"A": {
		mv(4, 0),   // created with 4, threshold 2: nothing
		mv(0, 1),   // 3
		mv(0, 1),   // 2: low
		mv(0, 2),   // 0: sold out
		mv(0, -2),  // 2: back
		mv(5, 0),   // 7: re-arms low silently
		mv(-5, 0),  // 2: low
		mv(-2, 0),  // 0: sold out
		mv(8, 0),   // 8: back (threshold 2: 8 is above it)
		mv(-2, -2), // a sale applied: available stays
		mv(0, 8),   // 0: low and sold out at once, low first
	}}
	want := []string{arbiter.EventLowStock, arbiter.EventSoldOut, arbiter.EventBackInStock, arbiter.EventLowStock,
		arbiter.EventSoldOut, arbiter.EventBackInStock, arbiter.EventLowStock, arbiter.EventSoldOut}
	require.Equal(t, want, expectedCrossings(moves["A"], 2))

	feedOf := func(types ...string) []feedEvent {
		var out []feedEvent
		for i, typ := range types {
			out = append(out, feedEvent{ID: int64(i + 1), Type: typ, SKU: "A", Seq: int64(i + 1)})
		}
		return out
	}
	judge := func(feed []feedEvent) *HookCheck {
		hc := &HookCheck{}
		judgeCrossings(feed, moves, map[string]int64{"A": 2}, hc)
		return hc
	}
	withLevels := slices.Insert(slices.Clone(want), 2, arbiter.EventLevelChanged) // level events are not crossings
	hc := judge(feedOf(withLevels...))
	assert.Empty(t, hc.Problems)
	assert.Equal(t, 8, hc.Crossings)

	dropped := slices.Delete(slices.Clone(want), 2, 3) // the first back_in_stock missing
	hc = judge(feedOf(dropped...))
	require.Len(t, hc.Problems, 1)
	assert.Contains(t, hc.Problems[0], "first difference at #3: feed sku.low_stock, movements sku.back_in_stock")

	extra := append(slices.Clone(want), arbiter.EventBackInStock) // one no movement made
	hc = judge(feedOf(extra...))
	require.Len(t, hc.Problems, 1)
	assert.Contains(t, hc.Problems[0], "first difference at #9: feed sku.back_in_stock, movements (end)")

	gap := feedOf(want...)
	gap = slices.Delete(gap, 4, 5) // seq 5 gone from the feed
	hc = judge(gap)
	assert.Contains(t, strings.Join(hc.Problems, "\n"), "A: the feed's 5-th event has seq 6")
}

// The receiver stores a delivery it verified and refuses, storing
// nothing, one signed with another secret.
func TestHookReceiverVerifies(t *testing.T) {
	const secret = "0123456789abcdef0123456789abcdef"
	rc, err := newReceiver(secret)
	require.NoError(t, err)
	defer rc.down()
	send := func(key string, id int64) int {
		body, _ := json.Marshal(feedEvent{ID: id, Type: arbiter.EventSoldOut, SKU: "A", Seq: 1})
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		mac := hmac.New(sha256.New, []byte(key))
		mac.Write([]byte(ts + "."))
		mac.Write(body)
		req, _ := http.NewRequest(http.MethodPost, rc.url(), bytes.NewReader(body))
		req.Header.Set("X-Timestamp", ts)
		req.Header.Set("X-Signature", hex.EncodeToString(mac.Sum(nil)))
		req.Header.Set("X-Event-Id", strconv.FormatInt(id, 10))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	assert.Equal(t, http.StatusNoContent, send(secret, 7))
	assert.Equal(t, http.StatusUnauthorized, send("another secret, 32 characters long", 8))
	rc.set(modeFail, 0)
	assert.Equal(t, http.StatusInternalServerError, send(secret, 9))
	assert.Equal(t, []int64{7}, func() (ids []int64) {
		for _, a := range rc.arrivals() {
			ids = append(ids, a.ID)
		}
		return ids
	}())
	assert.Len(t, rc.refused, 1)
}
