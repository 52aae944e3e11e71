package httpapi

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// A flood of distinct addresses costs bounded memory: the store keeps at
// most its size in buckets, dropping the least recently seen; a client seen
// recently keeps its (spent) bucket.
func TestLimiterStoreIsBounded(t *testing.T) {
	l := newLimiterStore(0.01, 100) // one request per 100 s, burst 1: nothing refills during the test
	ok, err := l.Allow("regular")
	require.NoError(t, err)
	require.True(t, ok)
	for i := 0; i < 10_000; i++ {
		_, _ = l.Allow(fmt.Sprintf("198.51.100.%d/%d", i%256, i))
		if i%50 == 0 {
			ok, _ := l.Allow("regular") // seen often: stays, and stays spent
			require.False(t, ok, "the regular client's bucket survives the flood")
		}
	}
	require.Equal(t, 100, l.buckets.Len())
	require.Equal(t, "100", l.retryAfter())
}
