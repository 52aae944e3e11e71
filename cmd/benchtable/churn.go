package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/campaign"
	"github.com/acme/inventory/internal/catalog"
	"github.com/acme/inventory/internal/tokens"
	"github.com/acme/inventory/order"
	"github.com/acme/inventory/stock"
)

// churnNode is what the campaign churn drives: one node's services and
// its Redis (the service's App in make bench and make soak, a test rig in
// its test).
type churnNode struct {
	Catalog   *catalog.Catalog
	Campaigns *campaign.Service
	Orders    *order.Service
	Tokens    *tokens.Service
	Stock     *stock.Store
	RDB       *redis.Client
}

// churnRun is what the campaign churn measured: the Redis keys of its
// SKUs before its campaigns and after they all ended (equal: an ended
// campaign leaves nothing behind), and the whole database's key count
// beside them (other services' keys come and go: the jobs' locks, the
// timeout shards).
type churnRun struct {
	campaigns, sold, refusedLate int
	byRoute, byWindow            int
	before, after                []string
	dbBefore, dbAfter            int64
	elapsed                      time.Duration
}

// leftBehind is the keys after the churn that were not there before it,
// and gone the keys that were there before and are not after.
func (c *churnRun) leftBehind() (left, gone []string) {
	for _, k := range c.after {
		if !slices.Contains(c.before, k) {
			left = append(left, k)
		}
	}
	for _, k := range c.before {
		if !slices.Contains(c.after, k) {
			gone = append(gone, k)
		}
	}
	return left, gone
}

// table is the churn's row in the soak's output.
func (c *churnRun) table() string {
	left, gone := c.leftBehind()
	var b strings.Builder
	fmt.Fprintf(&b, "\n| campaign churn: campaigns created, sold and ended | ended by the route / by the window | units sold | Redis keys of their SKUs before | after | left behind | gone | Redis keys in all before → after | wall time |\n")
	fmt.Fprintf(&b, "|---:|---|---:|---:|---:|---:|---:|---|---:|\n")
	fmt.Fprintf(&b, "| %d | %d / %d | %d | %d | %d | %d | %d | %d → %d | %s |\n", c.campaigns, c.byRoute, c.byWindow, c.sold,
		len(c.before), len(c.after), len(left), len(gone), c.dbBefore, c.dbAfter, c.elapsed.Round(time.Millisecond))
	if len(left) > 0 {
		fmt.Fprintf(&b, "\nleft behind (first 5): %s\n", strings.Join(left[:min(5, len(left))], " "))
	}
	return b.String()
}

// churnCheck is the churn's target: an ended campaign leaves nothing in
// Redis.
func churnCheck(c *churnRun) check {
	ch := check{what: "Redis keys after campaigns have ended = the keys before them", target: "equal", state: unmeasured,
		measured: "no churn (-churn 0)"}
	if c == nil {
		return ch
	}
	left, gone := c.leftBehind()
	ch.measured = fmt.Sprintf("%d campaigns: %d keys before, %d after (%d left behind, %d gone)", c.campaigns,
		len(c.before), len(c.after), len(left), len(gone))
	ch.state = met
	if len(left)+len(gone) > 0 {
		ch.state = missed
	}
	return ch
}

// churnWorkers is how many callers the soaks' churn runs: an admin's
// pace, not a crowd's (64 callers each creating a campaign at once
// deadlock on the campaigns table's gap locks past the arbiter's retries).
const churnWorkers = 8

// campaignChurn creates, sells and ends n campaigns on node, from workers
// callers, and counts the Redis keys of their SKUs before and after. Half
// end by the end route, one after the other on each caller's SKU; half by
// their window's close, each on a SKU of its own, released by the timeout
// sweep. Each campaign sells under a per-user limit of 1: two buyers, a
// third refused by the limit, one sale cancelled while it runs (its unit
// back to the pool); after its end a buy is refused and the other sale is
// cancelled (its unit back to the SKU). run names the SKUs (SKUs of one
// run are its own).
func campaignChurn(ctx context.Context, node churnNode, run string, n, workers int) *churnRun {
	workers = max(1, min(workers, n/2))
	byRoute := n / 2
	byWindow := n - byRoute
	out := &churnRun{campaigns: n, byRoute: byRoute, byWindow: byWindow}
	prefix := "CHURN-" + run + "-"
	routeSKUs := make([]string, workers)
	windowSKUs := make([]string, byWindow)
	for i := range routeSKUs {
		routeSKUs[i] = fmt.Sprintf("%sR%d", prefix, i)
	}
	for i := range windowSKUs {
		windowSKUs[i] = fmt.Sprintf("%sW%d", prefix, i)
	}
	// The SKUs first, as a catalog has them before its sales.
	parallel(workers, append(slices.Clone(routeSKUs), windowSKUs...), func(sku string) {
		_, err := node.Catalog.Put(ctx, sku, 1000, 0)
		churnMust("putting "+sku, err)
		churnMust("initialising "+sku, node.Stock.EnsureInit(ctx, sku))
	})
	out.before, out.dbBefore = churnKeys(ctx, node.RDB, prefix)
	start := time.Now()
	var sold, late atomic.Int64
	var seq atomic.Int64
	// sell runs one campaign's sales: two buyers, a third over the limit,
	// the second's sale cancelled while it runs; it returns the first's.
	sell := func(id string) *order.Order {
		i := seq.Add(1)
		first, err := node.Campaigns.Buy(ctx, id, fmt.Sprintf("churn%da", i), "")
		churnMust("buying from "+id, err)
		second, err := node.Campaigns.Buy(ctx, id, fmt.Sprintf("churn%db", i), "")
		churnMust("buying from "+id, err)
		if _, err := node.Campaigns.Buy(ctx, id, fmt.Sprintf("churn%da", i), ""); !errors.Is(err, inventory.ErrConflict) {
			panic(fmt.Sprintf("campaign churn: a buyer past the limit of 1: %v", err))
		}
		_, err = node.Orders.Cancel(ctx, second.ID)
		churnMust("cancelling a sale of "+id, err)
		sold.Add(2)
		return first
	}
	// after runs what comes after a campaign's end: a late buy, refused,
	// and the first sale cancelled.
	after := func(id string, first *order.Order) {
		if _, err := node.Campaigns.Buy(ctx, id, "churn-late", ""); !errors.Is(err, inventory.ErrEnded) {
			panic(fmt.Sprintf("campaign churn: a buy after the end: %v", err))
		}
		late.Add(1)
		_, err := node.Orders.Cancel(ctx, first.ID)
		churnMust("cancelling a sale of "+id+" after its end", err)
	}
	put := func(id, sku string, starts, ends time.Time) {
		_, err := node.Campaigns.Put(ctx, id, campaign.Spec{SKU: sku, Allotment: 3, StartsAt: starts, EndsAt: ends, PerUserLimit: 1}, nil)
		churnMust("putting "+id, err)
	}

	// By the route: each caller's campaigns one after the other on its SKU,
	// each opening where the one before ended.
	var wg sync.WaitGroup
	for w, sku := range routeSKUs {
		count := byRoute / workers
		if w < byRoute%workers {
			count++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			opens := time.Now().Add(-time.Second)
			for k := 0; k < count; k++ {
				id := fmt.Sprintf("%sr%d-%d", prefix, w, k)
				put(id, sku, opens, time.Now().Add(time.Hour))
				first := sell(id)
				v, err := node.Campaigns.End(ctx, id)
				churnMust("ending "+id, err)
				opens = v.EndsAt
				after(id, first)
			}
		}()
	}
	wg.Wait()

	// By the window: each on its SKU, closing a moment after its sales;
	// then the timeout sweep releases the pools.
	ids := make([]string, byWindow)
	firsts := make([]*order.Order, byWindow)
	var closes atomic.Int64
	parallel(workers, windowSKUs, func(sku string) {
		i := slices.Index(windowSKUs, sku)
		ids[i] = fmt.Sprintf("%sw%d", prefix, i)
		ends := time.Now().Add(churnWindow)
		put(ids[i], sku, time.Now().Add(-time.Second), ends)
		firsts[i] = sell(ids[i])
		for {
			c := closes.Load()
			if ends.UnixNano() <= c || closes.CompareAndSwap(c, ends.UnixNano()) {
				break
			}
		}
	})
	time.Sleep(time.Until(time.Unix(0, closes.Load())) + 10*time.Millisecond)
	for {
		k, err := node.Tokens.ReleaseExpired(ctx, 500)
		churnMust("sweeping the closed campaigns' pools", err)
		if k == 0 {
			break
		}
	}
	parallel(workers, windowSKUs, func(sku string) {
		i := slices.Index(windowSKUs, sku)
		after(ids[i], firsts[i])
	})
	out.elapsed = time.Since(start)
	out.sold, out.refusedLate = int(sold.Load()), int(late.Load())
	out.after, out.dbAfter = churnKeys(ctx, node.RDB, prefix)
	return out
}

// churnWindow is how long a campaign the churn ends by its window stays
// open: time enough for its sales on a busy machine.
const churnWindow = 3 * time.Second

// churnMust ends the run on err, naming what failed.
func churnMust(what string, err error) {
	if err != nil {
		must(fmt.Errorf("campaign churn: %s: %w", what, err))
	}
}

// parallel calls fn with each of items from workers goroutines.
func parallel(workers int, items []string, fn func(string)) {
	ch := make(chan string)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range ch {
				fn(it)
			}
		}()
	}
	for _, it := range items {
		ch <- it
	}
	close(ch)
	wg.Wait()
}

// churnKeys is the keys of the SKUs named prefix..., sorted, and the
// database's key count.
func churnKeys(ctx context.Context, rdb *redis.Client, prefix string) ([]string, int64) {
	var keys []string
	iter := rdb.Scan(ctx, 0, "inv:{"+prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	must(iter.Err())
	slices.Sort(keys)
	n, err := rdb.DBSize(ctx).Result()
	must(err)
	return keys, n
}
