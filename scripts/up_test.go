// Package scripts_test checks the server scripts as `make test` runs them.
package scripts_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// copyDir copies the regular files under src to dst.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	require.NoError(t, filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, info.Mode().Perm())
	}))
}

// A second clone, while the first clone's servers run: scripts/up.sh (what
// make test runs first) reuses the servers and still gives the clone what
// its tests need, the RocketMQ jars where testkit/servers looks for them
// first (.cache/rocketmq-VERSION/lib), from the per-user shared cache. Before
// issue 21 it reused the servers and left the clone without jars, and
// TestFaults failed there.
func TestSecondCloneGetsWhatTestsNeed(t *testing.T) {
	for _, port := range []int{6379, 3306, 9876, 10911} {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		require.NoError(t, err, "the servers make test starts must be up (make up)")
		c.Close()
	}
	clone := t.TempDir()
	copyDir(t, ".", filepath.Join(clone, "scripts"))
	cmd := exec.Command("bash", filepath.Join(clone, "scripts", "up.sh"), "all")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	require.Contains(t, string(out), "already running, reusing")
	jars, err := filepath.Glob(filepath.Join(clone, ".cache", "rocketmq-5.3.3", "lib", "rocketmq-broker-*.jar"))
	require.NoError(t, err)
	require.NotEmpty(t, jars, "the clone's tests find the RocketMQ jars:\n%s", out)
	entries, err := os.ReadDir(filepath.Join(clone, ".cache", "run"))
	require.NoError(t, err)
	require.Empty(t, entries, "the clone started no server of its own")
}
