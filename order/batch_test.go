package order

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// Concurrent writes share transactions, and a duplicate in a batch fails
// alone: every other order of that batch is written.
func TestBatcherGroupCommit(t *testing.T) {
	r := newRig(t, memoryTransport(t))
	ctx := context.Background()
	b := newBatcher(r.db)
	mk := func(id string) *Order {
		now := time.Now().UTC().Truncate(time.Microsecond)
		return &Order{ID: id, UserID: "u", Status: Pending, ReservationToken: id, ExpiresAt: now, CreatedAt: now, UpdatedAt: now,
			Items: []Item{{OrderID: id, SKU: "A", Qty: 1}}}
	}
	require.NoError(t, b.write(ctx, mk("dup")))

	var inserts atomic.Int64
	require.NoError(t, r.db.Callback().Create().Before("gorm:create").Register("count-orders", func(db *gorm.DB) {
		if db.Statement.Table == "orders" {
			inserts.Add(1)
		}
	}))
	defer r.db.Callback().Create().Remove("count-orders")

	const n = 64
	writeAll := func(prefix string, dupAt int) []error {
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := fmt.Sprintf("%s%02d", prefix, i)
				if i == dupAt {
					id = "dup"
				}
				errs[i] = b.write(ctx, mk(id))
			}()
		}
		wg.Wait()
		return errs
	}

	for _, err := range writeAll("a", -1) {
		require.NoError(t, err)
	}
	require.Less(t, inserts.Load(), int64(n/2), "concurrent orders share INSERT statements")
	t.Logf("%d concurrent orders in %d INSERT statements", n, inserts.Load())

	for i, err := range writeAll("b", 17) {
		if i == 17 {
			require.True(t, errors.Is(err, gorm.ErrDuplicatedKey) || err != nil && strings.Contains(err.Error(), "Duplicate"), "the duplicate fails: %v", err)
			continue
		}
		require.NoError(t, err, "a duplicate in the batch does not fail the others (order %d)", i)
	}
	require.EqualValues(t, 2*n, r.count(`SELECT COUNT(*) FROM orders`))
	require.EqualValues(t, 2*n, r.count(`SELECT COUNT(*) FROM order_items`))
}
