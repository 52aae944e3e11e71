package redislease

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A database held is refused to every other holder until released, and
// one waiting for it gets it then.
func TestOneHolderAtATime(t *testing.T) {
	addr := fmt.Sprintf("lease-test:%d", os.Getpid())
	a, ok, err := TryHold(addr, 7)
	require.NoError(t, err)
	require.True(t, ok)
	_, ok, err = TryHold(addr, 7)
	require.NoError(t, err)
	require.False(t, ok, "held twice")
	other, ok, err := TryHold(addr, 8)
	require.NoError(t, err)
	require.True(t, ok, "another database is free")
	other.Release()

	got := make(chan *Lease)
	go func() {
		l, err := Hold(addr, 7)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	select {
	case <-got:
		t.Fatal("Hold did not wait for the holder")
	case <-time.After(100 * time.Millisecond):
	}
	a.Release()
	select {
	case l := <-got:
		require.Equal(t, 7, l.DB)
		l.Release()
	case <-time.After(10 * time.Second):
		t.Fatal("Hold did not get the database once released")
	}
}
