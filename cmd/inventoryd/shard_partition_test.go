package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/identity"
	"github.com/acme/inventory/testkit/servers"
	"github.com/acme/inventory/testkit/testenv"
)

// One master of a Redis Cluster partitioned away from the service
// (connections accepted, no byte flowing) is one shard's trouble: the SKUs
// on the other masters keep selling, every one of their orders taken, none
// answered 503, while every order for a SKU on the cut-off master is
// answered 503 unavailable with Retry-After within its deadline, soon by
// that master's own open breaker. /readyz stays 200 and names the shard,
// the shard's breaker gauge is 1 and the others' 0. Once the link heals,
// that SKU sells again by itself.
//
// The cluster is a private one (its own ports); the service reaches its
// third master through a faultnet link: the master announces the link's
// port to the cluster (cluster-announce-port), so every client that asks
// the cluster where a slot lives is sent through the link, while the
// cluster bus between the masters stays whole. Nothing here is timed but
// by the service's own deadline (plus a client-side grace for a busy
// machine).
func TestOneShardPartitionedTheOthersKeepSelling(t *testing.T) {
	env, db := realEnv(t)
	ctx := t.Context()
	cluster := privateCluster(t)
	good, bad := cluster.Nodes[:2], cluster.Nodes[2]
	link := testenv.NewLink(t, bad.Addr())
	_, linkPort, err := net.SplitHostPort(link.Addr())
	require.NoError(t, err)
	port, err := strconv.Atoi(linkPort)
	require.NoError(t, err)
	require.NoError(t, bad.Client().ConfigSet(ctx, "cluster-announce-port", linkPort).Err())
	require.Eventually(t, func() bool {
		for _, n := range cluster.Nodes {
			shards, err := n.Client().ClusterShards(ctx).Result()
			if err != nil || !slices.ContainsFunc(shards, func(s redis.ClusterShard) bool {
				return slices.ContainsFunc(s.Nodes, func(nd redis.Node) bool { return nd.Role == "master" && nd.Port == int64(port) })
			}) {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond, "every master names the third one at the link")

	const deadline = 3 * time.Second // ample for every healthy sale on a loaded machine
	for i, kv := range env {
		switch {
		case strings.HasPrefix(kv, "INVENTORY_REDIS_URL="):
			env[i] = "INVENTORY_REDIS_CLUSTER=" + good[0].Addr() + "," + good[1].Addr()
		case strings.HasPrefix(kv, "INVENTORY_REQUEST_TIMEOUT="):
			env[i] = "INVENTORY_REQUEST_TIMEOUT=" + deadline.String()
		}
	}

	// SKUs by master: two on each healthy master, one on the cut-off one.
	view := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{good[0].Addr()}})
	defer view.Close()
	onMaster := map[string][]string{}
	for i := 0; len(onMaster[good[0].Addr()]) < 2 || len(onMaster[good[1].Addr()]) < 2 || len(onMaster[link.Addr()]) < 1; i++ {
		sku := fmt.Sprintf("SHARD-%d", i)
		m, err := view.MasterForKey(ctx, "inv:{"+sku+"}:stock")
		require.NoError(t, err)
		onMaster[m.Options().Addr] = append(onMaster[m.Options().Addr], sku)
	}
	healthy := append(onMaster[good[0].Addr()][:2:2], onMaster[good[1].Addr()][:2]...)
	cutOff := onMaster[link.Addr()][0]

	p := start(t, env...)
	admin := []string{"Authorization", "Bearer " + adminToken}
	const stock = 100000
	for _, sku := range append(slices.Clone(healthy), cutOff) {
		st, body := p.call("PUT", "/v1/skus/"+sku, fmt.Sprintf(`{"stock":%d,"per_user_limit":0}`, stock), admin...)
		require.Equal(t, 200, st, body)
	}
	client := &http.Client{Timeout: deadline + 5*time.Second} // the deadline, and a grace for a busy machine
	var n atomic.Int64
	order := func(sku string) answer {
		tok, err := identity.Issue(buyerKey, fmt.Sprintf("buyer-%d", n.Add(1)), time.Hour)
		if err != nil {
			return answer{err: err}
		}
		h := http.Header{"Authorization": {"Bearer " + clientToken}, "X-Buyer-Token": {tok}}
		return send(client, p.base, "POST", "/v1/orders", fmt.Sprintf(`{"items":[{"sku":%q,"qty":1}]}`, sku), h)
	}
	// Every SKU sells (and is initialised in Redis) before the cut.
	for _, sku := range append(slices.Clone(healthy), cutOff) {
		a := order(sku)
		require.NoError(t, a.err)
		require.Equal(t, http.StatusCreated, a.status, a.body)
	}

	require.NoError(t, link.Blackhole())
	// The cut-off SKU's buyers, two at a time, until its breaker has
	// answered 10 of them (at most 200 orders); the healthy SKUs' buyers,
	// four at a time, all along.
	var (
		mu             sync.Mutex
		badAnswers     []answer
		healthyAnswers = map[string][]answer{}
		breakerOpen    atomic.Int64
		done           = make(chan struct{})
		wg             sync.WaitGroup
	)
	for range 2 {
		wg.Go(func() {
			for breakerOpen.Load() < 10 { // two buyers: it may end at 11
				mu.Lock()
				if len(badAnswers) >= 200 {
					mu.Unlock()
					return
				}
				mu.Unlock()
				a := order(cutOff)
				if strings.Contains(a.message(), "redis shard "+link.Addr()+" is unavailable (circuit open") {
					breakerOpen.Add(1)
				}
				mu.Lock()
				badAnswers = append(badAnswers, a)
				mu.Unlock()
			}
		})
	}
	var sellers sync.WaitGroup
	for w := range 4 {
		sellers.Go(func() {
			for i := w; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				sku := healthy[i%len(healthy)]
				a := order(sku)
				mu.Lock()
				healthyAnswers[sku] = append(healthyAnswers[sku], a)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	// Readiness and metrics while the shard is cut off (the buyers of the
	// healthy SKUs still buying).
	rd := send(client, p.base, "GET", "/readyz", "", nil)
	metrics := send(client, p.base, "GET", "/metrics", "", nil)
	close(done)
	sellers.Wait()

	statuses := func(as []answer) map[int]int {
		out := map[int]int{}
		for _, a := range as {
			out[a.status]++
		}
		return out
	}
	for _, sku := range healthy {
		t.Logf("while the shard was cut off, %s (healthy) was answered %v (status: count)", sku, statuses(healthyAnswers[sku]))
	}
	t.Logf("while the shard was cut off, %s (cut off) was answered %v, %d of them by its breaker", cutOff, statuses(badAnswers), breakerOpen.Load())
	sold := map[string]int64{}
	for _, sku := range healthy {
		for i, a := range healthyAnswers[sku] {
			require.NoError(t, a.err, "order %d for %s", i, sku)
			require.Equal(t, http.StatusCreated, a.status, "order %d for %s, on a healthy shard: %v", i, sku, a.body)
		}
		sold[sku] = int64(len(healthyAnswers[sku]))
		require.Positive(t, sold[sku], "%s was ordered while the shard was cut off", sku)
	}
	require.GreaterOrEqual(t, breakerOpen.Load(), int64(10), "the cut-off shard's breaker opened within 200 orders")
	for i, a := range badAnswers {
		require.NoError(t, a.err, "order %d for the cut-off SKU answered within its deadline", i)
		require.Equal(t, http.StatusServiceUnavailable, a.status, "order %d for the cut-off SKU: %v", i, a.body)
		require.Equal(t, "unavailable", a.code(), a.body)
		require.Equal(t, "1", a.header.Get("Retry-After"))
	}
	require.NoError(t, rd.err)
	require.Equal(t, http.StatusOK, rd.status, rd.body)
	require.Equal(t, "ok", rd.body["redis"], rd.body)
	require.Equal(t, "ok", rd.body["database"], rd.body)
	require.Contains(t, rd.body["redis_shards"], "degraded: 1 of 3 redis shards unavailable: redis shard "+link.Addr()+" is unavailable (circuit open", rd.body)
	require.NoError(t, metrics.err)
	for _, want := range []string{
		fmt.Sprintf(`inventory_redis_shard_circuit_open{shard=%q} 1`, link.Addr()),
		fmt.Sprintf(`inventory_redis_shard_circuit_open{shard=%q} 0`, good[0].Addr()),
		fmt.Sprintf(`inventory_redis_shard_circuit_open{shard=%q} 0`, good[1].Addr()),
		`inventory_dependency_circuit_open{dependency="redis"} 1`,
	} {
		require.Contains(t, metrics.raw, want)
	}

	// Every order taken is recorded, nothing else: the healthy SKUs hold
	// what they sold (and the one sale before the cut), the cut-off SKU its
	// one sale before the cut.
	sold[cutOff] = 0
	waitProjected(t, db)
	for sku, n := range sold {
		var reserved, live int64
		require.NoError(t, db.QueryRow(`SELECT reserved FROM skus WHERE sku = ?`, sku).Scan(&reserved))
		require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM stock_reservations WHERE sku = ? AND state = 'HELD'`, sku).Scan(&live))
		require.Equal(t, n+1, reserved, sku)
		require.Equal(t, n+1, live, sku)
	}

	// Healed, the cut-off SKU sells again by itself.
	require.NoError(t, link.Heal())
	healedAt := time.Now()
	for {
		a := order(cutOff)
		require.NoError(t, a.err)
		if a.status == http.StatusCreated {
			break
		}
		require.Equal(t, http.StatusServiceUnavailable, a.status, a.body)
		require.Less(t, time.Since(healedAt), 30*time.Second, "no order for the cut-off SKU taken 30s after the link healed")
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("the cut-off SKU sold again %s after the link healed", time.Since(healedAt).Round(time.Millisecond))
	require.Eventually(t, func() bool {
		rd := send(client, p.base, "GET", "/readyz", "", nil)
		return rd.status == http.StatusOK && rd.body["redis_shards"] == "ok"
	}, 30*time.Second, 100*time.Millisecond, "/readyz says every shard is back")
}

// privateCluster starts a three-master Redis Cluster of the test's own, on
// free ports (never the shared one's), killed when the test ends.
func privateCluster(t *testing.T) *servers.RedisCluster {
	t.Helper()
	var ports [3]int
	taken := map[int]bool{}
	for i := range ports {
		for {
			p := servers.FreePort(10000)
			if !taken[p] && !taken[p+10000] && !taken[p-10000] {
				ports[i], taken[p], taken[p+10000] = p, true, true
				break
			}
		}
	}
	c, err := servers.StartRedisCluster(t.TempDir(), ports)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// answer is one HTTP answer as the concurrent buyers record it (they
// cannot fail the test from their goroutines).
type answer struct {
	status int
	header http.Header
	raw    string
	body   map[string]any
	err    error // no answer (the client's timeout), or a body that is not JSON
}

func (a answer) code() string {
	e, _ := a.body["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

func (a answer) message() string {
	e, _ := a.body["error"].(map[string]any)
	s, _ := e["message"].(string)
	return s
}

// send makes one request with client; a JSON body is decoded.
func send(client *http.Client, base, method, path, body string, h http.Header) answer {
	req, err := http.NewRequestWithContext(context.Background(), method, base+path, bytes.NewBufferString(body))
	if err != nil {
		return answer{err: err}
	}
	if h != nil {
		req.Header = h
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, header: resp.Header, raw: string(raw), err: err}
	if err == nil && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		a.err = json.Unmarshal(raw, &a.body)
	}
	return a
}
