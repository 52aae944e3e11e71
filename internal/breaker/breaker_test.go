package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/breaker"
)

var unreachable = &net.OpError{Op: "read", Net: "tcp", Err: errors.New("i/o timeout")}

// Only failures to reach the dependency count: answers (a duplicate key, a
// missing Redis key, a canceled caller) never open the breaker.
func TestOnlyUnreachableFailuresTrip(t *testing.T) {
	b := breaker.New("db", breaker.Settings{Trip: 3})
	answers := []error{nil, redis.Nil, &mysql.MySQLError{Number: 1062, Message: "Duplicate entry"},
		&mysql.MySQLError{Number: 1213, Message: "Deadlock"}, context.Canceled, errors.New("stock: invalid argument")}
	for range 5 {
		for _, err := range answers {
			require.Equal(t, err, b.Do(context.Background(), func() error { return err }))
		}
	}
	require.NoError(t, b.Err())
	// Two failures in a row, then an answer: still closed.
	for _, err := range []error{unreachable, unreachable, nil, unreachable, unreachable} {
		_ = b.Do(context.Background(), func() error { return err })
	}
	require.Equal(t, "closed", b.State())
	// The third in a row opens it: the next call is refused without running.
	_ = b.Do(context.Background(), func() error { return unreachable })
	require.Equal(t, "open", b.State())
	ran := false
	err := b.Do(context.Background(), func() error { ran = true; return nil })
	require.False(t, ran)
	require.ErrorIs(t, err, breaker.ErrOpen)
	require.EqualError(t, err, "db is unavailable (circuit open: it stopped answering); retry later")
	require.True(t, breaker.Unreachable(err), "a refused call is answered as unavailable")
}

// After the pause the breaker probes by itself: callers keep being refused
// while the probe fails, and the first successful probe closes it.
func TestProbeClosesTheBreaker(t *testing.T) {
	var up atomic.Bool
	probes := make(chan error, 100)
	b := breaker.New("redis", breaker.Settings{Trip: 1, Open: 50 * time.Millisecond,
		Probe: func(ctx context.Context) error {
			_, hasDeadline := ctx.Deadline()
			var err error
			if !up.Load() {
				err = unreachable
			}
			if !hasDeadline {
				err = fmt.Errorf("probe without a deadline")
			}
			probes <- err
			return err
		}})
	_ = b.Do(context.Background(), func() error { return unreachable })
	require.Equal(t, "open", b.State())
	call := func() error { return b.Do(context.Background(), func() error { return nil }) }
	// Callers are refused until a probe ran and failed (the dependency is down).
	for {
		require.ErrorIs(t, call(), breaker.ErrOpen)
		select {
		case err := <-probes:
			require.Equal(t, unreachable, err)
		default:
			time.Sleep(5 * time.Millisecond)
			continue
		}
		break
	}
	up.Store(true)
	for {
		if err := call(); err == nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	require.Equal(t, "closed", b.State())
	require.NoError(t, b.Err())
	for len(probes) > 0 {
		err := <-probes
		require.True(t, err == nil || err == unreachable, "%v", err)
	}
}

// A caller whose context already ended is answered with that, and it
// counts for nothing.
func TestEndedCallerIsNotCounted(t *testing.T) {
	b := breaker.New("db", breaker.Settings{Trip: 1})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	require.ErrorIs(t, b.Do(ctx, func() error { ran = true; return nil }), context.Canceled)
	require.False(t, ran)
	require.Equal(t, "closed", b.State())
}
