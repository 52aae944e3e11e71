package order

import (
	"context"
	"sync"

	"gorm.io/gorm"
)

// maxBatch bounds the orders one transaction writes.
const maxBatch = 64

// batcher writes new orders with group commit: concurrent callers queue their
// order, and whichever caller finds no write in progress takes up to maxBatch
// queued orders (oldest first) and inserts them in one transaction, then wakes
// everyone. A caller returns once its own order is committed (or failed), so a
// 201 still means the row is durable; under load one commit serves many
// orders instead of one. No goroutine runs between calls.
type batcher struct {
	db *gorm.DB

	mu      sync.Mutex
	cond    *sync.Cond
	queue   []*writeReq
	writing bool
}

type writeReq struct {
	o    *Order
	done bool
	err  error
}

func newBatcher(db *gorm.DB) *batcher {
	b := &batcher{db: db}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// write inserts o with its items and returns when that is committed. It does
// not give up early when ctx ends: once queued, the caller must learn whether
// the row exists, or it could undo a reservation whose order was written.
func (b *batcher) write(ctx context.Context, o *Order) error {
	req := &writeReq{o: o}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.queue = append(b.queue, req)
	for !req.done {
		if b.writing {
			b.cond.Wait()
			continue
		}
		n := min(len(b.queue), maxBatch)
		batch := b.queue[:n:n]
		b.queue = b.queue[n:]
		b.writing = true
		b.mu.Unlock()
		errs := b.flush(context.WithoutCancel(ctx), batch)
		b.mu.Lock()
		for i, r := range batch {
			r.err, r.done = errs[i], true
		}
		b.writing = false
		b.cond.Broadcast()
	}
	return req.err
}

// flush writes batch in one transaction and returns each order's outcome; if
// the transaction fails (a duplicate idempotency key, say), each order is
// written alone so each caller gets its own answer.
func (b *batcher) flush(ctx context.Context, batch []*writeReq) []error {
	errs := make([]error, len(batch))
	err := b.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		orders := make([]*Order, len(batch))
		var items []Item
		for i, r := range batch {
			o := *r.o
			items = append(items, o.Items...)
			o.Items = nil
			orders[i] = &o
		}
		if err := tx.Omit("Items").Create(orders).Error; err != nil {
			return err
		}
		return tx.Create(items).Error
	})
	for i, r := range batch {
		switch {
		case err == nil || len(batch) == 1:
			errs[i] = err
		default:
			errs[i] = b.db.WithContext(ctx).Create(r.o).Error
		}
	}
	return errs
}
