package redislease

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
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

// The bench's database is one the server has and no test process is
// handed, and neither is database 0 (make run's); scripts/up.sh starts
// the server with as many databases as this package shares out.
func TestBenchDatabaseIsOutsideTheTestsRange(t *testing.T) {
	require.False(t, ForTests(BenchDB), "database %d", BenchDB)
	require.False(t, ForTests(0))
	require.True(t, ForTests(FirstTestDB) && ForTests(LastTestDB))
	require.Less(t, BenchDB, Databases)
	require.Less(t, LastTestDB, Databases)

	up, err := os.ReadFile("../../scripts/up.sh")
	require.NoError(t, err)
	m := regexp.MustCompile(`--databases (\d+)`).FindSubmatch(up)
	require.NotNil(t, m, "scripts/up.sh starts Redis without --databases")
	n, err := strconv.Atoi(string(m[1]))
	require.NoError(t, err)
	require.Equal(t, Databases, n, "scripts/up.sh's --databases")
}
