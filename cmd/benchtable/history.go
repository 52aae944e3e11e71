package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/app"
)

// historySoak drives n orders (created, paid, applied through RocketMQ)
// through one SKU on the real service in this process, and at each decade
// (10^3, 10^4, ...) measures what the issue "costs that stay flat as history
// grows" asks about:
//
//	cold init     the SKU's Redis key dropped and initialised again from the
//	              database (median of 15)
//	Redis/order   Redis memory (used_memory) per finished order: its growth
//	              over the decade, over the decade's orders, once every order
//	              of the decade is applied (flat: about 0)
//	reserve p50/p99  Orders.Create latency during the decade
//	DB rows/order InnoDB row operations (reads, inserts, updates, deletes)
//	              per order during the decade: the database's work
//	DB time/order the decade's wall time per order (2 cores, everything here)
func historySoak(ctx context.Context, rdb *redis.Client, dsnBase string, n int) string {
	a, db := startService(ctx, rdb, dsnBase, *dbPrefix+"_history")
	defer db.Close()
	defer a.Shutdown(context.Background())
	const sku = "HIST"
	_, err := a.Catalog.Put(ctx, sku, hotStock, 0)
	must(err)
	must(a.Stock.EnsureInit(ctx, sku))
	baseMem := usedMemory(ctx, rdb)

	var b strings.Builder
	fmt.Fprintf(&b, "| orders | cold init | Redis bytes / order (this decade) | Redis keys | reserve p50 | reserve p99 | DB rows / order | wall time / order |\n")
	fmt.Fprintf(&b, "|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	done := 0
	var seq atomic.Int64
	for decade := 1000; decade <= n; decade *= 10 {
		want := decade - done
		rowsBefore := innodbRows(ctx, db)
		start := time.Now()
		lat := createAndPay(ctx, a, sku, want, &seq)
		waitApplied(ctx, db)
		elapsed := time.Since(start)
		rows := innodbRows(ctx, db) - rowsBefore
		done = decade
		slices.Sort(lat)
		memNow := usedMemory(ctx, rdb)
		mem := memNow - baseMem
		baseMem = memNow
		keys, err := rdb.DBSize(ctx).Result()
		must(err)
		init := coldInit(ctx, a, sku)
		fmt.Fprintf(&b, "| %d | %s | %.1f | %d | %s | %s | %.1f | %s |\n", decade, dur(init),
			float64(mem)/float64(want), keys, dur(lat[len(lat)/2]), dur(lat[len(lat)*99/100]),
			float64(rows)/float64(want), dur(elapsed/time.Duration(want)))
		fmt.Fprintf(os.Stderr, "history soak: %d orders\n", decade)
	}
	if *churnN > 0 {
		b.WriteString(campaignChurn(ctx, appNode(a, rdb), "history", *churnN, churnWorkers).table())
	}
	return b.String()
}

// appNode is the campaign churn's view of the service a on rdb.
func appNode(a *app.App, rdb *redis.Client) churnNode {
	return churnNode{Catalog: a.Catalog, Campaigns: a.Campaigns, Orders: a.Orders, Tokens: a.Tokens, Stock: a.Stock, RDB: rdb}
}

// createAndPay creates and pays n one-unit orders of sku from *workers
// callers and returns each Create's latency.
func createAndPay(ctx context.Context, a *app.App, sku string, n int, seq *atomic.Int64) []time.Duration {
	var left atomic.Int64
	left.Store(int64(n))
	lat := make([][]time.Duration, *workers)
	var wg sync.WaitGroup
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Add(-1) >= 0 {
				i := seq.Add(1)
				t0 := time.Now()
				o, err := a.Orders.Create(ctx, "h"+strconv.FormatInt(i%10000, 10), "", []inventory.Line{{SKU: sku, Qty: 1}})
				must(err)
				lat[w] = append(lat[w], time.Since(t0))
				_, err = a.Orders.Pay(ctx, o.ID, "pay-"+o.ID)
				must(err)
			}
		}()
	}
	wg.Wait()
	return slices.Concat(lat...)
}

// waitApplied waits until the consumer applied every outbox row.
func waitApplied(ctx context.Context, db *sql.DB) {
	for {
		var n int64
		must(db.QueryRowContext(ctx, `SELECT COUNT(*) FROM stock_outbox WHERE applied_at IS NULL`).Scan(&n))
		if n == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// innodbRows is the server's count of row operations so far (the handler
// reads of every kind, writes, updates and deletes), server-wide.
func innodbRows(ctx context.Context, db *sql.DB) int64 {
	rows, err := db.QueryContext(ctx, `SHOW GLOBAL STATUS WHERE Variable_name LIKE 'Handler\_read\_%'
		OR Variable_name IN ('Handler_write', 'Handler_update', 'Handler_delete')`)
	must(err)
	defer rows.Close()
	var total int64
	for rows.Next() {
		var name string
		var v int64
		must(rows.Scan(&name, &v))
		total += v
	}
	must(rows.Err())
	return total
}

// usedMemory is Redis's used_memory.
func usedMemory(ctx context.Context, rdb *redis.Client) int64 {
	info, err := rdb.Info(ctx, "memory").Result()
	must(err)
	n, err := strconv.ParseInt(infoValue(info, "used_memory"), 10, 64)
	must(err)
	return n
}

// coldInit drops sku's Redis state and times its initialisation from the
// database; the median of 15.
func coldInit(ctx context.Context, a *app.App, sku string) time.Duration {
	var ds []time.Duration
	for i := 0; i < 15; i++ {
		must(a.Stock.Forget(ctx, sku))
		t0 := time.Now()
		must(a.Stock.EnsureInit(ctx, sku))
		ds = append(ds, time.Since(t0))
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}
