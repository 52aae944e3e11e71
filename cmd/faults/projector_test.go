package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A failed projector-kill carries the fleet's warnings and errors that
// name the expiry or the projection, the last eight of them, and says
// which log it could not read; nothing else of the logs.
func TestWarningsOfAFailedCheck(t *testing.T) {
	dir := t.TempDir()
	var lines []string
	lines = append(lines,
		`{"level":"INFO","msg":"timeout: sweep expired orders the queue missed","orders":3}`,
		`{"level":"WARN","msg":"job: lost the lock; another node takes over","key":"inv:{relay}:lock"}`,
		`{"level":"ERROR","msg":"the projector failed","err":"deadlock"}`)
	for i := range 9 {
		lines = append(lines, fmt.Sprintf(`{"level":"WARN","msg":"timeout: sweep failed","n":%d}`, i))
	}
	log := filepath.Join(dir, "inventoryd-0.log")
	require.NoError(t, os.WriteFile(log, []byte(strings.Join(lines, "\n")+"\n"), 0o644))
	r := &Run{fleet: []*Instance{{Name: "a", log: log}, {Name: "b", log: filepath.Join(dir, "missing.log")}}}

	got := strings.Split(r.warnings("timeout", "project"), " | ")
	require.Len(t, got, 8)
	require.Equal(t, `a: {"level":"WARN","msg":"timeout: sweep failed","n":2}`, got[0], "the last eight, oldest first")
	require.Equal(t, `a: {"level":"WARN","msg":"timeout: sweep failed","n":8}`, got[6])
	require.True(t, strings.HasPrefix(got[7], "b: "), "the log it could not read is named: %s", got[7])
	require.NotContains(t, r.warnings("timeout", "project"), "INFO")
	require.NotContains(t, r.warnings("timeout", "project"), "relay", "a warning naming neither word is left out")

	only := &Run{fleet: []*Instance{{Name: "a", log: log}}}
	require.Equal(t, "none", only.warnings("webhook"))
	require.Contains(t, only.warnings("project"), "deadlock")
}
