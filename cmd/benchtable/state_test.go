package main

import (
	"flag"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/testkit/redislease"
	"github.com/acme/inventory/testkit/testenv"
)

// A run's Redis database is one no test process is handed, and its
// databases' names are none a test makes: a run and the tests never flush,
// reset or drop each other's.
func TestBenchStateIsOutsideTheTests(t *testing.T) {
	require.Equal(t, strconv.Itoa(redislease.BenchDB), flag.Lookup("redis-db").DefValue)
	require.False(t, redislease.ForTests(redislease.BenchDB), "database %d is in the tests' range", redislease.BenchDB)
	require.Equal(t, benchPrefix, flag.Lookup("db-prefix").DefValue)
	require.False(t, strings.HasPrefix(benchPrefix, testenv.DatabasePrefix), "the bench's databases are named as the tests'")
	require.False(t, strings.HasPrefix(testenv.DatabasePrefix, benchPrefix), "the tests' databases are named as the bench's")
}
