package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/testkit/faultnet"
	"github.com/acme/inventory/testkit/testenv"
)

// A partition is not a kill: connections stay open and no byte flows (a
// dead switch). With the database, then Redis, cut off that way while
// buyers keep coming, every request is answered (503 with Retry-After),
// never left hanging; once the service knows the dependency is down it
// says so (the breaker is open: /readyz, the metric, the answer); a sold-out
// SKU is still answered 409 while the database is dark; and once the
// network heals the service sells again by itself, with nothing sold twice.
// The request deadline is the default (1s). How fast each answer came is
// measured by make faults; this test bounds it only by its client's own
// timeout (15s), against the 120s a request hung before deadlines.
func TestPartitionIsAnsweredAndHealsByItself(t *testing.T) {
	env, db := realEnv(t)
	var dbLink, redisLink *faultnet.Link
	for i, kv := range env {
		switch {
		case strings.HasPrefix(kv, "INVENTORY_MYSQL_DSN="):
			cfg, err := mysql.ParseDSN(strings.TrimPrefix(kv, "INVENTORY_MYSQL_DSN="))
			require.NoError(t, err)
			dbLink = testenv.NewLink(t, cfg.Addr)
			cfg.Addr = dbLink.Addr()
			env[i] = "INVENTORY_MYSQL_DSN=" + cfg.FormatDSN()
		case strings.HasPrefix(kv, "INVENTORY_REDIS_URL="):
			opt, err := redis.ParseURL(strings.TrimPrefix(kv, "INVENTORY_REDIS_URL="))
			require.NoError(t, err)
			redisLink = testenv.NewLink(t, opt.Addr)
			env[i] = fmt.Sprintf("INVENTORY_REDIS_URL=redis://%s/%d", redisLink.Addr(), opt.DB)
		case strings.HasPrefix(kv, "INVENTORY_REQUEST_TIMEOUT="):
			env[i] = "INVENTORY_REQUEST_TIMEOUT=1s" // the default, whatever realEnv chose
		}
	}
	p := start(t, append(env, "INVENTORY_REALIGN_INTERVAL=200ms")...)
	admin := []string{"Authorization", "Bearer " + adminToken}
	for sku, stock := range map[string]int{"HOT": 50, "GONE": 1} {
		st, body := p.call("PUT", "/v1/skus/"+sku, fmt.Sprintf(`{"stock":%d,"per_user_limit":0}`, stock), admin...)
		require.Equal(t, 200, st, body)
	}
	st, body := p.call("POST", "/v1/seckill/GONE/buy", `{"user_id":"first"}`)
	require.Equal(t, 201, st, body)

	client := &http.Client{Timeout: 15 * time.Second}
	n := 0
	order := func() (int, http.Header, map[string]any) {
		n++
		user := fmt.Sprintf("buyer-%d", n)
		h := http.Header{"Authorization": {"Bearer " + clientToken}, "X-Buyer-Token": {p.buyer(user)},
			"Idempotency-Key": {fmt.Sprintf("partition-%d", n)}}
		return do(t, client, p.base, "POST", "/v1/orders", `{"items":[{"sku":"HOT","qty":1}]}`, h)
	}
	st, _, body = order()
	require.Equal(t, 201, st, body)

	// cutOff partitions link and orders until the answer says the breaker
	// is open; every answer on the way is a 503 with Retry-After.
	cutOff := func(link *faultnet.Link, dependency string) {
		require.NoError(t, link.Blackhole())
		var slowest time.Duration
		for i := 0; ; i++ {
			require.Less(t, i, 50, "the %s breaker never opened", dependency)
			began := time.Now()
			st, h, body := order()
			slowest = max(slowest, time.Since(began))
			require.Equal(t, http.StatusServiceUnavailable, st, body)
			require.NotEmpty(t, h.Get("Retry-After"), "503 carries Retry-After")
			require.Equal(t, "unavailable", body["error"].(map[string]any)["code"])
			if strings.Contains(body["error"].(map[string]any)["message"].(string), dependency+" is unavailable (circuit open") {
				t.Logf("%s cut off: %d answers until the breaker's, slowest %s, the breaker's in %s", dependency, i+1,
					slowest.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
				break
			}
		}
		st, _, ready := do(t, client, p.base, "GET", "/readyz", "", nil)
		require.Equal(t, http.StatusServiceUnavailable, st, ready)
		require.Contains(t, ready[dependency], "circuit open", ready)
		require.Contains(t, scrape(t, client, p.base), fmt.Sprintf(`inventory_dependency_circuit_open{dependency=%q} 1`, dependency))
	}
	// healed heals link and orders until one is taken (the first success
	// after the network heals), within a bound far above the breaker's
	// pause and one deadline.
	healed := func(link *faultnet.Link, dependency string) {
		require.NoError(t, link.Heal())
		start := time.Now()
		for {
			st, _, body := order()
			if st == http.StatusCreated {
				break
			}
			require.Equal(t, http.StatusServiceUnavailable, st, body)
			require.Less(t, time.Since(start), 30*time.Second, "no order taken 30s after the %s link healed", dependency)
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("%s: first order taken %s after the link healed", dependency, time.Since(start).Round(time.Millisecond))
	}

	cutOff(dbLink, "database")
	// Sold out needs no database: Redis (or the node's sold-out flag) says so.
	st, _, body = do(t, client, p.base, "POST", "/v1/seckill/GONE/buy", `{}`,
		http.Header{"Authorization": {"Bearer " + clientToken}, "X-Buyer-Token": {p.buyer("late")}})
	require.Equal(t, http.StatusConflict, st, body)
	require.Equal(t, "insufficient_stock", body["error"].(map[string]any)["code"])
	healed(dbLink, "database")

	cutOff(redisLink, "redis")
	healed(redisLink, "redis")

	// Nothing sold twice, nothing lost: the database's reserved units are
	// exactly its live reservations, within stock, and Redis comes back to
	// the database's level (the periodic realign repairs what a write with
	// an unknown outcome left).
	var onHand, reserved, live int64
	waitProjected(t, db)
	require.NoError(t, db.QueryRow(`SELECT on_hand, reserved FROM skus WHERE sku = 'HOT'`).Scan(&onHand, &reserved))
	require.NoError(t, db.QueryRow(`SELECT COALESCE(SUM(qty), 0) FROM stock_reservations WHERE sku = 'HOT' AND state IN ('HELD', 'COMMITTED')`).Scan(&live))
	require.Equal(t, int64(50), onHand)
	require.Equal(t, live, reserved)
	require.LessOrEqual(t, reserved, onHand)
	var orphans int64
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM stock_reservations r LEFT JOIN orders o ON o.id = r.token
		WHERE r.sku = 'HOT' AND r.state = 'HELD' AND (o.id IS NULL OR o.status <> 'PENDING')`).Scan(&orphans))
	require.Zero(t, orphans, "every held unit belongs to a pending order")
	p.waitSKU(skuView("HOT", onHand, reserved, onHand-reserved, 0), 30*time.Second, "the realign brings Redis to the database")
}

// do sends a request with client and decodes the JSON answer.
func do(t *testing.T, client *http.Client, base, method, path, body string, h http.Header) (int, http.Header, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, base+path, bytes.NewBufferString(body))
	require.NoError(t, err)
	if h != nil {
		req.Header = h
	}
	resp, err := client.Do(req)
	require.NoError(t, err, "%s %s was not answered", method, path)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(raw, &out), string(raw))
	return resp.StatusCode, resp.Header, out
}

func scrape(t *testing.T, client *http.Client, base string) string {
	t.Helper()
	resp, err := client.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(raw)
}
