package expiry

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/order"
)

// BenchmarkTimeoutRelease measures, with the default TimeoutConfig and the
// real clock, how many Redis calls an idle poller makes per second and how
// long after its deadline an order is released (from the database's own
// expires_at and updated_at). Run with -benchtime=1x.
func BenchmarkTimeoutRelease(b *testing.B) {
	for i := 0; i < b.N; i++ {
		benchTimeoutRelease(b)
	}
}

func benchTimeoutRelease(b *testing.B) {
	ctx := context.Background()
	r := newRig(b)
	r.addSKU("A", 1_000_000)
	n := &node{st: r.st}
	var err error
	n.svc = order.NewService(r.db, r.st, order.Config{TTL: 2 * time.Second,
		OnCreated: func(ctx context.Context, o *order.Order) { n.tm.Schedule(ctx, o.ID, o.ExpiresAt) }})
	b.Cleanup(func() { _ = n.svc.Close() })
	n.tm, err = NewTimeouts(n.svc, r.rdb, TimeoutConfig{Locker: r.st.Locker()})
	require.NoError(b, err)
	n.tm.Start(ctx)
	defer n.tm.Stop()

	idle := 3 * time.Second
	time.Sleep(idle)
	b.ReportMetric(float64(n.tm.Polls.Load())/idle.Seconds(), "idle-redis-calls/s")

	const orders = 300
	for i := 0; i < orders; i++ {
		_, err := n.svc.Create(ctx, fmt.Sprintf("u%d", i), "", line("A", 1))
		require.NoError(b, err)
		time.Sleep(3 * time.Millisecond) // deadlines spread over ~1s
	}
	require.Eventually(b, func() bool {
		return r.count(`SELECT COUNT(*) FROM orders WHERE status = 'PENDING'`) == 0
	}, 30*time.Second, 20*time.Millisecond)
	var lat []float64
	require.NoError(b, r.db.Raw(`SELECT TIMESTAMPDIFF(MICROSECOND, expires_at, updated_at) / 1000 FROM orders`).Scan(&lat).Error)
	slices.Sort(lat)
	b.ReportMetric(lat[len(lat)/2], "release-ms-p50")
	b.ReportMetric(lat[len(lat)*99/100], "release-ms-p99")
	b.ReportMetric(lat[len(lat)-1], "release-ms-max")
}
