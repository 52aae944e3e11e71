package stock

import (
	"context"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// stockBackChannelOf is the stock-back channel of the Redis database rdb
// uses. A channel is the server's, not a database's: two services on one
// Redis in databases of their own (a staging and a production, test
// processes) would clear each other's flags, so a database other than 0
// has a channel of its own (0, and a cluster, which has no other, keep the
// name every version used).
func stockBackChannelOf(rdb redis.UniversalClient) string {
	if c, ok := rdb.(*redis.Client); ok && c.Options().DB != 0 {
		return stockBackChannel + ":" + strconv.Itoa(c.Options().DB)
	}
	return stockBackChannel
}

// PublishStockBack tells every node that sku's stock came back (a cancel, a
// restock), so each clears its local sold-out flag.
func (s *Store) PublishStockBack(ctx context.Context, sku string) error {
	return s.rdb.Publish(ctx, s.stockBack, sku).Err()
}

// WatchStockBack calls fn with each SKU any node says came back, until ctx
// ends. It subscribes before it returns, so nothing published after the
// call is missed while the connection holds.
func (s *Store) WatchStockBack(ctx context.Context, fn func(sku string)) (wait func()) {
	sub := s.rdb.Subscribe(ctx, s.stockBack)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer sub.Close()
		ch := sub.Channel()
		for {
			select {
			case <-ctx.Done():
				return
			case m, ok := <-ch:
				if !ok {
					return
				}
				fn(m.Payload)
			}
		}
	}()
	return func() { <-done }
}
