package lock

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/acme/inventory/testkit/testenv"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestLockOneWinner(t *testing.T) {
	testenv.ForEachRedis(t, func(t *testing.T, _ testenv.RedisBackend, rdb redis.UniversalClient) {
		l := NewLocker(rdb)
		var won atomic.Int64
		var wg sync.WaitGroup
		for i := 0; i < 32; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := l.Obtain(context.Background(), "lock:{one}", 10*time.Second, 0)
				if err == nil {
					won.Add(1)
				} else if err != ErrNotObtained {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		require.EqualValues(t, 1, won.Load())
	})
}

func TestLockOwnership(t *testing.T) {
	testenv.ForEachRedis(t, func(t *testing.T, _ testenv.RedisBackend, rdb redis.UniversalClient) {
		ctx := context.Background()
		l := NewLocker(rdb)

		first, err := l.Obtain(ctx, "lock:{own}", 30*time.Second, 0)
		require.NoError(t, err)
		_, err = l.Obtain(ctx, "lock:{own}", time.Second, 50*time.Millisecond)
		require.ErrorIs(t, err, ErrNotObtained, "a bounded wait gives up")

		// The first holder stalls past its expiry (made to happen now, not
		// waited for); a second takes the lock.
		require.NoError(t, rdb.PExpire(ctx, "lock:{own}", time.Millisecond).Err())
		var second *Lock
		require.Eventually(t, func() bool {
			second, err = l.Obtain(ctx, "lock:{own}", 10*time.Second, 0)
			return err == nil
		}, 5*time.Second, 10*time.Millisecond)
		require.ErrorIs(t, first.Release(ctx), ErrNotHeld, "an expired holder cannot release the next holder's lock")
		require.ErrorIs(t, first.Refresh(ctx, time.Second), ErrNotHeld, "nor extend it")
		_, err = l.Obtain(ctx, "lock:{own}", time.Second, 0)
		require.ErrorIs(t, err, ErrNotObtained, "the second holder still has it")
		require.NoError(t, second.Release(ctx))
		require.ErrorIs(t, second.Release(ctx), ErrNotHeld)
		third, err := l.Obtain(ctx, "lock:{own}", time.Second, 0)
		require.NoError(t, err)
		require.NotEqual(t, second.Token(), third.Token())
	})
}

func TestLockKeepAlive(t *testing.T) {
	testenv.ForEachRedis(t, func(t *testing.T, _ testenv.RedisBackend, rdb redis.UniversalClient) {
		ctx := context.Background()
		l := NewLocker(rdb)
		const ttl = time.Second // renewed every ttl/3: a stall must outlast a whole ttl to lose it
		held, err := l.Obtain(ctx, "lock:{long}", ttl, 0)
		require.NoError(t, err)
		lost, stop := held.KeepAlive(ctx, ttl)

		// A long job runs for several TTLs; nobody else gets the lock meanwhile.
		deadline := time.Now().Add(3 * ttl)
		for time.Now().Before(deadline) {
			_, err := l.Obtain(ctx, "lock:{long}", ttl, 0)
			require.ErrorIs(t, err, ErrNotObtained)
			time.Sleep(ttl / 5)
		}
		select {
		case <-lost:
			t.Fatal("renewal lost the lock")
		default:
		}
		stop()
		stop() // idempotent
		require.NoError(t, held.Release(ctx))

		// Losing the lock (here: someone deletes it) is reported to the job.
		held, err = l.Obtain(ctx, "lock:{long}", ttl, 0)
		require.NoError(t, err)
		lost, stop = held.KeepAlive(ctx, ttl)
		defer stop()
		require.NoError(t, rdb.Del(ctx, "lock:{long}").Err())
		select {
		case <-lost:
		case <-time.After(5 * time.Second):
			t.Fatal("losing the lock was not reported")
		}
	})
}
