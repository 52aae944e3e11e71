package groupcommit

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"
)

// What the group commit costs this process per seckill sale, against the
// real MariaDB: batches of 15 one-line sales (the seckill selling phase's
// mean batch), each an order's row and its reservation of the hot SKU by a
// buyer of its own (no per-user limit, as the bench's SKU), written by
// writeBatch on a writer's own connection as the service writes them. One
// op is one sale: run with -benchtime=Nx, N a multiple of 15, and
// -benchmem. Besides ns/op (wall time, the database's round trips
// included), cpu-ns/op is this process's CPU (user + system, getrusage:
// GC and the driver included) per sale, the service side's cost.
func BenchmarkSeckillBatch(b *testing.B) {
	r := newRig(b)
	r.addSKU("S", 1<<40)
	w := testBatcher(b, r.db)
	ctx := context.Background()
	const batch = 15
	expires := time.Now().UTC().Truncate(time.Microsecond).Add(time.Hour)
	n := 0
	sales := func(k int) []*Request {
		reqs := make([]*Request, k)
		for i := range reqs {
			n++
			id := fmt.Sprintf("o%09d", n)
			reqs[i] = orderWrite(id, "b"+id, expires, "S")
		}
		return reqs
	}
	write := func(reqs []*Request) {
		if !w.writeBatch(ctx, reqs) {
			b.Fatalf("the batch did not commit: %v", reqs[0].err)
		}
	}
	for range 4 { // the writers' statements prepared, the connections warm
		write(sales(batch))
	}
	var batches [][]*Request
	for left := b.N; left > 0; left -= batch {
		batches = append(batches, sales(min(batch, left)))
	}
	b.ReportAllocs()
	cpu0 := cpuTime()
	b.ResetTimer()
	for _, reqs := range batches {
		write(reqs)
	}
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
}

// cpuTime is the CPU this process has used (user and system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
