package stock

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/testkit/testenv"
)

// A stock-back published on one Store reaches every Store watching, on
// every backend (pub/sub on a cluster goes through any node), and only the
// SKU published.
func TestStockBackReachesEveryWatcher(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, rdb redis.UniversalClient) {
		ctx, cancel := context.WithCancel(context.Background())
		var heard [2]chan string
		var waits []func()
		for i := range heard {
			heard[i] = make(chan string, 1000)
			s, err := NewStore(rdb, Config{Init: newFakeDB(nil).init})
			require.NoError(t, err)
			waits = append(waits, s.WatchStockBack(ctx, func(sku string) { heard[i] <- sku }))
		}
		pub, err := NewStore(rdb, Config{Init: newFakeDB(nil).init})
		require.NoError(t, err)
		// A subscription is confirmed asynchronously: publish until each
		// watcher heard one.
		var got [2][]string
		require.Eventually(t, func() bool {
			require.NoError(t, pub.PublishStockBack(ctx, "A-1"))
			for i := range heard {
				for len(heard[i]) > 0 {
					got[i] = append(got[i], <-heard[i])
				}
			}
			return len(got[0]) > 0 && len(got[1]) > 0
		}, 10*time.Second, 20*time.Millisecond)
		for i := range got {
			for _, sku := range got[i] {
				require.Equal(t, "A-1", sku)
			}
		}
		cancel()
		for _, w := range waits {
			w() // ends with ctx
		}
	})
}

// Two services on one Redis server in databases of their own do not hear
// each other's stock-back news (a channel is the server's): the test
// processes of one machine share a server, and so may a staging and a
// production.
func TestStockBackStaysInItsDatabase(t *testing.T) {
	a := testenv.Redis(t) // a leased database, never 0
	opt := *a.Options()
	require.NotZero(t, opt.DB)
	opt.DB = 0 // another database of the same server (no test process's)
	b := redis.NewClient(&opt)
	defer b.Close()
	ctx, cancel := context.WithCancel(context.Background())
	heard := make(chan string, 1000)
	sa, err := NewStore(a, Config{Init: newFakeDB(nil).init})
	require.NoError(t, err)
	sb, err := NewStore(b, Config{Init: newFakeDB(nil).init})
	require.NoError(t, err)
	wait := sa.WatchStockBack(ctx, func(sku string) { heard <- sku })
	defer wait()
	defer cancel()
	// The server sends a channel's messages in the order it ran the
	// publishes: once "last" is heard, "other", published before it, would
	// have been heard first had it crossed.
	var got []string
	require.Eventually(t, func() bool {
		require.NoError(t, sb.PublishStockBack(ctx, "other"))
		require.NoError(t, sa.PublishStockBack(ctx, "last"))
		for len(heard) > 0 {
			got = append(got, <-heard)
		}
		return len(got) > 0
	}, 10*time.Second, 20*time.Millisecond)
	for _, sku := range got {
		require.Equal(t, "last", sku)
	}
}
