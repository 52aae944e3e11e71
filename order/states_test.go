package order_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/order"
	"github.com/acme/inventory/testkit/testrig"
)

// everyState is what fillEveryState made: the orders' ids by how each
// came to be, the buyers and the SKUs they bought.
type everyState struct {
	ids   map[string][]string // "PENDING", "PAID", "PAID late", ...
	users []string
	skus  []string
}

// fillEveryState writes n orders of every kind through r's services, on
// users buyers: PENDING; PAID; CANCELLED; EXPIRED; REFUNDED; REFUND_REQUIRED
// (paid after the buyer cancelled); paid after expiring while the stock was
// still there (PAID under a ".late" token) and after it was gone
// (REFUND_REQUIRED); every fourth order a 2-line cart, every third placed
// with an Idempotency-Key. The expiring ones come first, then the clock
// moves past their hold, so the rest are newer.
func fillEveryState(t *testing.T, r *testrig.Rig, n, users int) everyState {
	t.Helper()
	ctx := context.Background()
	st := everyState{ids: map[string][]string{}, skus: []string{"ST-A", "ST-B", "ST-GONE"}}
	for u := range users {
		st.users = append(st.users, fmt.Sprintf("st-u%03d", u))
	}
	r.AddSKU("ST-A", int64(100*n+1000))
	r.AddSKU("ST-B", int64(100*n+1000))
	r.AddSKU("ST-GONE", int64(n)) // the late payments that find the stock gone
	var mu sync.Mutex
	seq := 0
	create := func(kind, sku string) {
		mu.Lock()
		i := seq
		seq++
		mu.Unlock()
		user := st.users[i%len(st.users)]
		lines := testrig.Line(sku, 1)
		if i%4 == 0 && sku != "ST-GONE" {
			lines = append(testrig.Line("ST-A", 1), testrig.Line("ST-B", 2)...)
		}
		key := ""
		if i%3 == 0 {
			key = fmt.Sprintf("key-%d", i)
		}
		o, err := r.Orders.Create(ctx, user, key, lines)
		require.NoError(t, err)
		mu.Lock()
		st.ids[kind] = append(st.ids[kind], o.ID)
		mu.Unlock()
	}
	many := func(kind, sku string) {
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range n / 8 {
					create(kind, sku)
				}
			}()
		}
		for range n % 8 {
			create(kind, sku)
		}
		wg.Wait()
	}
	each := func(kind string, fn func(id string) error) {
		for _, id := range st.ids[kind] {
			require.NoError(t, fn(id), "%s %s", kind, id)
		}
	}

	many(string(order.Expired), "ST-A")
	many("PAID late", "ST-A")
	many("REFUND_REQUIRED late", "ST-GONE")
	r.Clock.Advance(testrig.TTL + time.Minute)
	for _, kind := range []string{string(order.Expired), "PAID late", "REFUND_REQUIRED late"} {
		each(kind, func(id string) error {
			ok, err := r.Orders.Expire(ctx, id)
			if err == nil && !ok {
				err = fmt.Errorf("not expired")
			}
			return err
		})
	}
	for range n { // the late payments' stock is gone
		_, err := r.Orders.Create(ctx, "st-other", "", testrig.Line("ST-GONE", 1))
		require.NoError(t, err)
	}
	each("PAID late", func(id string) error { return paid(r, id, order.Paid) })
	each("REFUND_REQUIRED late", func(id string) error { return paid(r, id, order.RefundRequired) })

	for _, kind := range []order.Status{order.Pending, order.Paid, order.Cancelled, order.Refunded, order.RefundRequired} {
		many(string(kind), "ST-A")
	}
	each(string(order.Paid), func(id string) error { return paid(r, id, order.Paid) })
	each(string(order.Cancelled), func(id string) error { _, err := r.Orders.Cancel(ctx, id); return err })
	each(string(order.Refunded), func(id string) error {
		if err := paid(r, id, order.Paid); err != nil {
			return err
		}
		_, err := r.Orders.Refund(ctx, id)
		return err
	})
	each(string(order.RefundRequired), func(id string) error {
		if _, err := r.Orders.Cancel(ctx, id); err != nil {
			return err
		}
		return paid(r, id, order.RefundRequired)
	})
	counts := map[order.Status]int64{}
	for _, s := range order.Statuses {
		counts[s] = r.Count(`SELECT COUNT(*) FROM orders WHERE status = ? AND user_id LIKE 'st-%'`, s)
	}
	require.Equal(t, map[order.Status]int64{order.Pending: int64(2 * n), order.Paid: int64(2 * n), order.Cancelled: int64(n),
		order.Expired: int64(n), order.Refunded: int64(n), order.RefundRequired: int64(2 * n)}, counts,
		"every state (the PENDING beside the first n: the buyers who took the stock of the late payments)")
	return st
}

// paid pays order id and checks it ends in want.
func paid(r *testrig.Rig, id string, want order.Status) error {
	o, err := r.Orders.Pay(context.Background(), id, "pay-"+id)
	if err == nil && o.Status != want {
		err = fmt.Errorf("%w: paid into %s, want %s", inventory.ErrConflict, o.Status, want)
	}
	return err
}
