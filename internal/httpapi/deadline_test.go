package httpapi

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type key struct{}

// A request's context keeps its deadline whether or not its timer was
// made: Done closes at the deadline, Err says why, values pass through,
// the parent's cancel and an earlier parent deadline reach it.
func TestLazyDeadlineIsADeadline(t *testing.T) {
	parent := context.WithValue(context.Background(), key{}, "v")
	at := time.Now().Add(50 * time.Millisecond)
	l := newLazyDeadline(parent, at)
	d, ok := l.Deadline()
	require.True(t, ok)
	require.Equal(t, at, d)
	require.Equal(t, "v", l.Value(key{}))
	require.Nil(t, l.timed.Load(), "nothing asked for Done: no timer")
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done did not close at the deadline")
	}
	require.ErrorIs(t, l.Err(), context.DeadlineExceeded)
	require.False(t, time.Now().Before(at))
	require.Equal(t, "v", l.Value(key{}))
	l.stop()
	require.ErrorIs(t, l.Err(), context.DeadlineExceeded, "stop after the deadline changes nothing")

	// A deadline passed before anything asked: Err says so at once.
	l = newLazyDeadline(parent, time.Now().Add(-time.Millisecond))
	require.ErrorIs(t, l.Err(), context.DeadlineExceeded)
	l.stop()

	// The parent's cancel reaches it, made before or after.
	for _, early := range []bool{true, false} {
		p, cancel := context.WithCancel(parent)
		l = newLazyDeadline(p, time.Now().Add(time.Hour))
		if early {
			_ = l.Done()
		}
		cancel()
		select {
		case <-l.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("the parent's cancel did not reach it")
		}
		require.ErrorIs(t, l.Err(), context.Canceled)
		l.stop()
	}

	// An earlier parent deadline is its deadline.
	p, cancel := context.WithTimeout(parent, time.Minute)
	defer cancel()
	pd, _ := p.Deadline()
	d, _ = newLazyDeadline(p, time.Now().Add(time.Hour)).Deadline()
	require.Equal(t, pd, d)
}

// The end of the request cancels it: a timer made is stopped, and one
// asked for after the end is canceled already, while values still answer
// (a detached follow-up reads them through context.WithoutCancel).
func TestLazyDeadlineStops(t *testing.T) {
	parent := context.WithValue(context.Background(), key{}, "v")
	l := newLazyDeadline(parent, time.Now().Add(time.Hour))
	done := l.Done()
	l.stop()
	select {
	case <-done:
	default:
		t.Fatal("stop did not cancel the timed context")
	}
	require.ErrorIs(t, l.Err(), context.Canceled)

	l = newLazyDeadline(parent, time.Now().Add(time.Hour))
	l.stop()
	select {
	case <-l.Done():
	default:
		t.Fatal("a context asked for after the end is not canceled")
	}
	require.ErrorIs(t, l.Err(), context.Canceled)
	require.Equal(t, "v", l.Value(key{}))
	require.Equal(t, "v", context.WithoutCancel(l).Value(key{}))
}

// A context derived from it is canceled with it and costs no goroutine of
// its own (it registers with the timed context, as with any
// context.WithDeadline parent), and racing goroutines that ask for Done at
// once all get the same channel.
func TestLazyDeadlineChildren(t *testing.T) {
	l := newLazyDeadline(context.Background(), time.Now().Add(time.Hour))
	before := runtime.NumGoroutine()
	var children []context.Context
	for range 100 {
		c, cancel := context.WithCancel(l)
		defer cancel()
		children = append(children, c)
	}
	require.Less(t, runtime.NumGoroutine()-before, 10, "a goroutine per child")
	l.stop()
	for _, c := range children {
		select {
		case <-c.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("a child was not canceled with the request")
		}
	}

	l = newLazyDeadline(context.Background(), time.Now().Add(time.Hour))
	var wg sync.WaitGroup
	chans := make([]<-chan struct{}, 32)
	for i := range chans {
		wg.Go(func() { chans[i] = l.Done() })
	}
	wg.Wait()
	for _, c := range chans {
		require.Equal(t, chans[0], c)
	}
	l.stop()
	<-chans[0]
}
