package stock

import "context"

// PublishStockBack tells every node that sku's stock came back (a cancel, a
// restock), so each clears its local sold-out flag.
func (s *Store) PublishStockBack(ctx context.Context, sku string) error {
	return s.rdb.Publish(ctx, stockBackChannel, sku).Err()
}

// WatchStockBack calls fn with each SKU any node says came back, until ctx
// ends. It subscribes before it returns, so nothing published after the
// call is missed while the connection holds.
func (s *Store) WatchStockBack(ctx context.Context, fn func(sku string)) (wait func()) {
	sub := s.rdb.Subscribe(ctx, stockBackChannel)
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
