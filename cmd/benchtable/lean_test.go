package main

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The lean group's table is the medians of its rounds, each way, and
// lean / classic of those medians; the lean rows list each round's lag.
func TestLeanTableIsTheRoundsMediansAndTheirRatio(t *testing.T) {
	side := func(lean bool, rate float64, sales int64, mariadb, all, lag float64) leanSide {
		return leanSide{lean: lean, phase: []leanPhase{{name: "seckill, selling", rate: rate, sales: sales, mariadb: mariadb, all: all,
			elapsed: 5, lag: projLag{lean: lean, p99: lag}}}}
	}
	table := leanTable([2][]leanSide{
		{side(false, 3000, 15000, 3.0, 10, 0), side(false, 3200, 16000, 3.2, 10, 0), side(false, 9000, 45000, 0.45, 10, 0)},
		{side(true, 3300, 16500, 4.95, 10, .25), side(true, 3100, 15500, 4.65, 10, .5), side(true, 100, 500, 1, 10, 1)},
	})
	// classic: rates 3000, 3200, 9000 (median 3200); MariaDB µs per sale
	// 200, 200, 10 (median 200); lean: 3300, 3100, 100 (median 3100);
	// 300, 300, 2000 (median 300).
	require.Contains(t, table, "| seckill, selling, classic (3000, 3200, 9000) | 3200 | 200.0 |")
	require.Contains(t, table, "| seckill, selling, lean (3300, 3100, 100) | 3100 | 300.0 |")
	require.Contains(t, table, "≤ 250ms, ≤ 500ms, ≤ 1s")
	require.Contains(t, table, "| seckill, selling, lean / classic | 0.97× | 1.50× |")
	require.Equal(t, 1, strings.Count(table, "lean / classic"))
}

// The lag's quantile is the upper bound of the bucket that holds it, over
// the observations between two snapshots only: never an estimate below
// what was measured, and +Inf past the last bucket.
func TestProjectionLagQuantileIsItsBucketsBound(t *testing.T) {
	before := lagBuckets{count: 10, bounds: []float64{.1, .5, 1}, cum: []uint64{10, 10, 10}}
	// 100 more: 50 within 0.1 s, 48 within 0.5 s, 1 within 1 s, 1 past it.
	after := lagBuckets{count: 110, bounds: []float64{.1, .5, 1}, cum: []uint64{60, 108, 109}}
	q, n := after.quantile(before, .5)
	require.Equal(t, 0.1, q)
	require.EqualValues(t, 100, n)
	q, _ = after.quantile(before, .98)
	require.Equal(t, 0.5, q)
	q, _ = after.quantile(before, .99)
	require.Equal(t, 1.0, q)
	q, _ = after.quantile(before, 1)
	require.True(t, math.IsInf(q, 1), "the slowest hold is past the last bucket")
	_, n = before.quantile(before, .99)
	require.Zero(t, n)
}

// A run with -projector=false projected nothing: its lag target is not
// measured (neither met nor missed), and says the run is a bound.
func TestProjectionLagOfARunWithoutProjectorIsNotMeasured(t *testing.T) {
	c := projLag{lean: true, off: true}.check()
	require.Equal(t, unmeasured, c.state)
	require.Contains(t, c.measured, "-projector=false")
	require.Equal(t, missed, projLag{lean: true, p99: 2, n: 10, sold: 10}.check().state)
	require.Equal(t, met, projLag{lean: true, p99: .5, n: 10, sold: 10}.check().state)
}
