package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/testkit/testenv"
)

// scratchEnv, in a process this test starts, names how the run it plays
// ends; scratchPrefixEnv its -db-prefix.
const (
	scratchEnv       = "BENCHTABLE_SCRATCH_END"
	scratchPrefixEnv = "BENCHTABLE_SCRATCH_PREFIX"
)

// A run drops every database it made when it ends: when main returns,
// when a measure fails (must) and when it is interrupted. Each case is a
// process of its own (this test binary) that runs a measure, the floor,
// for a moment, as main does, and then ends that way; the server's
// databases of its prefix are listed before it starts and after it ended.
func TestRunDropsItsDatabasesWhenItEnds(t *testing.T) {
	if how := os.Getenv(scratchEnv); how != "" {
		playRun(t, how)
		return
	}
	admin, err := sql.Open("mysql", testenv.MySQLDSN())
	require.NoError(t, err)
	defer admin.Close()
	for _, c := range []struct {
		how  string
		code int
	}{{"return", 0}, {"failure", 1}, {"interrupt", 130}} {
		t.Run(c.how, func(t *testing.T) {
			// In the tests' own namespace: a test makes no database of the
			// bench's prefix.
			prefix := fmt.Sprintf("%sbt%d_%s", testenv.DatabasePrefix, os.Getpid(), c.how)
			require.Empty(t, databasesOf(t, admin, prefix), "before the run")
			t.Cleanup(func() { // what a failing run left behind
				for _, name := range databasesOf(t, admin, prefix) {
					_, _ = admin.Exec("DROP DATABASE IF EXISTS `" + name + "`")
				}
			})
			cmd := exec.Command(os.Args[0], "-test.run", "^TestRunDropsItsDatabasesWhenItEnds$", "-test.count", "1", "-test.v")
			cmd.Env = append(os.Environ(), scratchEnv+"="+c.how, scratchPrefixEnv+"="+prefix)
			out, err := cmd.CombinedOutput()
			code := 0
			var exitErr *exec.ExitError
			if errors.As(err, &exitErr) {
				code = exitErr.ExitCode()
			} else {
				require.NoError(t, err)
			}
			require.Equal(t, c.code, code, "the run's exit status\n%s", out)
			require.Contains(t, string(out), "made: "+prefix+"_floor\n", "the run made no database: the test proves nothing\n%s", out)
			require.Empty(t, databasesOf(t, admin, prefix), "left behind by the run\n%s", out)
		})
	}
}

// playRun is the run of TestRunDropsItsDatabasesWhenItEnds's process: the
// floor for a moment on databases of the prefix given, its databases
// printed, then the end named by how.
func playRun(t *testing.T, how string) {
	*dbPrefix = os.Getenv(scratchPrefixEnv)
	defer end() // as main
	endOnInterrupt()
	dropScratchAtEnd()
	admin, err := sql.Open("mysql", testenv.MySQLDSN())
	require.NoError(t, err)
	defer admin.Close()
	floorRun(context.Background(), testenv.MySQLDSN(), 2, 1, 1, 100*time.Millisecond)
	fmt.Printf("made: %s\n", strings.Join(databasesOf(t, admin, *dbPrefix), ", "))
	switch how {
	case "failure":
		must(errors.New("a measure failed"))
	case "interrupt":
		require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGINT))
		<-time.After(time.Minute) // a bound: the interrupt ends the process first
		t.Fatal("the interrupt did not end the run")
	}
}

// databasesOf is the server's databases whose names begin with prefix.
func databasesOf(t *testing.T, admin *sql.DB, prefix string) []string {
	t.Helper()
	rows, err := admin.Query("SHOW DATABASES")
	require.NoError(t, err)
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		if strings.HasPrefix(n, prefix) {
			names = append(names, n)
		}
	}
	require.NoError(t, rows.Err())
	slices.Sort(names)
	return names
}
