package testenv

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/testkit/redislease"
)

// A test process holds one database of the test Redis for its whole life,
// never database 0 (left to make run and to people) nor make bench's.
func TestRedisDBLeaseIsStable(t *testing.T) {
	a, b := RedisDB(t), RedisDB(t)
	require.Equal(t, a, b)
	require.True(t, redislease.ForTests(a), "database %d", a)
	require.NotEqual(t, redislease.BenchDB, a)
}

// Every backend of the contract suites answers, and its Flush loses every
// key, as the suites assume.
func TestRedisBackendsAnswerAndFlush(t *testing.T) {
	ForEachRedis(t, func(t *testing.T, b RedisBackend, rdb redis.UniversalClient) {
		ctx := context.Background()
		require.NoError(t, rdb.Set(ctx, "testenv:{k}", "v", 0).Err())
		require.NoError(t, b.Flush(ctx, rdb))
		n, err := rdb.Exists(ctx, "testenv:{k}").Result()
		require.NoError(t, err)
		require.Zero(t, n)
	})
}

// MySQL gives a fresh, fully migrated database of the test's own.
func TestMySQLIsFreshAndMigrated(t *testing.T) {
	db := MySQL(t)
	var n int64
	require.NoError(t, db.Raw(`SELECT COUNT(*) FROM skus`).Scan(&n).Error)
	require.Zero(t, n)
}
