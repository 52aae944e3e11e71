package stock

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/testkit/testenv"
)

// BenchmarkDeductSKU measures a SKU's admission on the real single-node
// Redis: "script" is the deduction script's server-side cost (pipelines of
// maxPipelined EVALSHA, so the round trip is shared as under a burst), and
// "admit" is Store.Admit from many goroutines through the coalescer. The
// SKU's stock never runs out (nothing is refused, every call takes).
func BenchmarkDeductSKU(b *testing.B) {
	ctx := context.Background()
	rdb := testenv.Redis(b)
	require.NoError(b, LoadDeductScript(ctx, rdb))
	require.NoError(b, rdb.HSet(ctx, stockKey("BENCH"), "a", int64(1)<<50, "e", 1, "s", 0).Err())
	keys := DeductKeys("BENCH")

	b.Run("script", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i += maxPipelined {
			pipe := rdb.Pipeline()
			for j := 0; j < maxPipelined && i+j < b.N; j++ {
				deductScript.EvalSha(ctx, pipe, keys, 1, 0)
			}
			cmds, err := pipe.Exec(ctx)
			require.NoError(b, err)
			for _, c := range cmds {
				if c.Err() != nil {
					b.Fatal(c.Err())
				}
			}
		}
	})
	b.Run("admit", func(b *testing.B) {
		s, err := NewStore(rdb, Config{Init: newFakeDB(map[string]int64{"BENCH": 1 << 50}).init})
		require.NoError(b, err)
		b.ReportAllocs()
		b.SetParallelism(16)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := s.Admit(ctx, "BENCH", 1, ""); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
