package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/breaker"
	"github.com/acme/inventory/testkit/testenv"
)

// On a Redis Cluster every node has a breaker of its own: with one master
// cut off (this client's connections to it run through a link that lets
// no byte pass), the keys on that master fail, then are refused at once by
// its open breaker, while every command on the other masters is answered
// all along; readiness holds, Err names the shard; once the link heals the
// shard's probe closes its breaker. Only this test's own connections to
// the shared cluster go through the link.
func TestClusterNodesHaveABreakerEach(t *testing.T) {
	addrs := testenv.RedisClusterAddrs()
	bad := addrs[len(addrs)-1]
	link := testenv.NewLink(t, bad)
	var dialer net.Dialer
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs[:len(addrs)-1], ContextTimeoutEnabled: true,
		ReadTimeout: time.Second, WriteTimeout: time.Second, DialTimeout: time.Second, PoolTimeout: time.Second,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if addr == bad {
				addr = link.Addr()
			}
			return dialer.DialContext(ctx, network, addr)
		}})
	t.Cleanup(func() { _ = rdb.Close() })
	shards := breaker.RedisCluster(rdb, "redis", breaker.Settings{Open: 100 * time.Millisecond})
	ctx := context.Background()

	// A key on each master.
	keys := map[string]string{}
	for i := 0; len(keys) < len(addrs); i++ {
		k := fmt.Sprintf("breaker-test-%d", i)
		m, err := rdb.MasterForKey(ctx, k)
		require.NoError(t, err)
		if _, ok := keys[m.Options().Addr]; !ok {
			keys[m.Options().Addr] = k
		}
	}
	get := func(addr string, timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		err := rdb.Get(ctx, keys[addr]).Err()
		if err == redis.Nil {
			return nil
		}
		return err
	}
	for addr := range keys {
		require.NoError(t, get(addr, 5*time.Second), addr)
	}
	require.Len(t, shards.Breakers(), len(addrs))
	require.NoError(t, shards.Err())

	require.NoError(t, link.Blackhole())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var answered []error
	stop := make(chan struct{})
	for _, addr := range addrs[:len(addrs)-1] {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				err := get(addr, 10*time.Second)
				mu.Lock()
				answered = append(answered, err)
				mu.Unlock()
			}
		})
	}
	var refused error
	for i := 0; ; i++ {
		require.Less(t, i, 20, "the cut-off shard's breaker never opened")
		err := get(bad, 300*time.Millisecond)
		require.Error(t, err)
		require.True(t, breaker.Unreachable(err), err)
		if errors.Is(err, breaker.ErrOpen) {
			refused = err
			break
		}
	}
	require.EqualError(t, refused, "redis shard "+bad+" is unavailable (circuit open: it stopped answering); retry later")
	require.ErrorContains(t, shards.Err(), fmt.Sprintf("1 of %d redis shards unavailable: redis shard %s is unavailable", len(addrs), bad))
	require.NoError(t, shards.Check(ctx), "the other shards answer: ready")
	close(stop)
	wg.Wait()
	for _, err := range answered {
		require.NoError(t, err, "a command on a healthy master")
	}
	require.NotEmpty(t, answered)

	require.NoError(t, link.Heal())
	require.Eventually(t, func() bool { return get(bad, time.Second) == nil && shards.Err() == nil },
		30*time.Second, 20*time.Millisecond, "the probe closes the shard's breaker")
}
