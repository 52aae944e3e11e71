package servers

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/mq"
)

// The private brokers run what scripts/up.sh runs for the shared one. These
// tests read the version, the per-user cache and the JVM options out of the
// scripts themselves, so a change to one side that the other does not
// follow fails here. (The names leave out "RocketMQ": make test's second
// pass runs -run RocketMQ.)

// scriptText returns the text of scripts/name.
func scriptText(t *testing.T, name string) string {
	t.Helper()
	root, err := ModuleRoot()
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(root, "scripts", name))
	require.NoError(t, err)
	return string(b)
}

// scriptLine returns the line of text that starts with prefix.
func scriptLine(t *testing.T, text, prefix string) string {
	t.Helper()
	for l := range strings.Lines(text) {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	t.Fatalf("no line starting with %q", prefix)
	return ""
}

// bash runs script with only PATH and env in its environment and returns
// its output lines.
func bash(t *testing.T, env []string, script string) []string {
	t.Helper()
	cmd := exec.Command("bash", "-euc", script)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s\n%s", script, out)
	return strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
}

func TestBrokerVersionAndCacheAsScriptsLib(t *testing.T) {
	lib := scriptText(t, "lib.sh")
	script := scriptLine(t, lib, "ROCKETMQ_VERSION=") + scriptLine(t, lib, "SHARED_CACHE=") +
		`printf '%s\n' "$ROCKETMQ_VERSION" "$SHARED_CACHE"`
	for _, env := range []map[string]string{
		{"HOME": "/home/u"},
		{"HOME": "/home/u", "XDG_CACHE_HOME": "/xdg"},
		{"HOME": "/home/u", "XDG_CACHE_HOME": "/xdg", "INVENTORY_SHARED_CACHE": "/shared", "ROCKETMQ_VERSION": "9.9.9"},
	} {
		var kv []string
		for _, k := range []string{"HOME", "XDG_CACHE_HOME", "INVENTORY_SHARED_CACHE", "ROCKETMQ_VERSION"} {
			t.Setenv(k, env[k])
			kv = append(kv, k+"="+env[k])
		}
		require.Equal(t, bash(t, kv, script), []string{rocketmqVersion(), sharedCache()}, "%v", env)
	}
}

func TestJavaOptsAsScriptsUp(t *testing.T) {
	up := scriptText(t, "up.sh")
	start := strings.Index(up, "\njava_opts() {\n")
	require.Positive(t, start, "scripts/up.sh defines java_opts")
	end := strings.Index(up[start:], "\n}\n")
	require.Positive(t, end)
	fn := up[start : start+end+3]
	// up.sh passes $(java_opts) unquoted: word splitting makes the arguments.
	got := bash(t, nil, "CACHE=/c\n"+fn+`set -- $(java_opts); printf '%s\n' "$@"`)
	require.Equal(t, got, javaOpts("/c/rocketmq-home"))
}

// rocketmqLib finds the jars where scripts/up.sh puts them.
func TestBrokerJarsWhereScriptsUpPutsThem(t *testing.T) {
	jars := func(lib string) string {
		require.NoError(t, os.MkdirAll(lib, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(lib, "rocketmq-broker-"+rocketmqVersion()+".jar"), nil, 0o644))
		return lib
	}
	root, shared := t.TempDir(), t.TempDir()
	t.Setenv("INVENTORY_ROCKETMQ_LIB", "")
	t.Setenv("INVENTORY_SHARED_CACHE", shared)
	t.Setenv("ROCKETMQ_VERSION", "")
	name := "rocketmq-" + defaultRocketMQVersion

	_, err := rocketmqLib(root)
	require.ErrorContains(t, err, "scripts/up.sh install")
	sharedLib := jars(filepath.Join(shared, name, "lib"))
	_, err = rocketmqLib(root)
	require.Error(t, err, "a download without .complete may be in progress")
	require.NoError(t, os.WriteFile(filepath.Join(shared, name, ".complete"), nil, 0o644))
	lib, err := rocketmqLib(root)
	require.NoError(t, err)
	require.Equal(t, sharedLib, lib, "a clone without .cache finds the per-user cache")

	require.NoError(t, os.MkdirAll(filepath.Join(root, ".cache"), 0o755))
	own := jars(filepath.Join(root, ".cache", "own", "lib"))
	require.NoError(t, os.Symlink(filepath.Dir(own), filepath.Join(root, ".cache", name)))
	lib, err = rocketmqLib(root)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(root, ".cache", name, "lib"), lib, "the clone's .cache/rocketmq-VERSION comes first")

	t.Setenv("INVENTORY_ROCKETMQ_LIB", own)
	lib, err = rocketmqLib(root)
	require.NoError(t, err)
	require.Equal(t, own, lib)
	t.Setenv("INVENTORY_ROCKETMQ_LIB", t.TempDir())
	_, err = rocketmqLib(root)
	require.ErrorContains(t, err, "INVENTORY_ROCKETMQ_LIB")
}

// Every broker this repository starts (scripts/up.sh's, these private ones,
// docker-compose.yml's) lets a queue lock lapse after the lifetime the
// consumer relies on (mq.BrokerLockLifetime): a longer one would only slow
// a takeover, a shorter one would let a slow node apply a queue another
// already took.
func TestBrokerLockLifetimeAsTheConsumerExpects(t *testing.T) {
	want := fmt.Sprintf("-Drocketmq.broker.rebalance.lockMaxLiveTime=%d", mq.BrokerLockLifetime.Milliseconds())
	require.Contains(t, javaOpts("/h"), want)
	root, err := ModuleRoot()
	require.NoError(t, err)
	compose, err := os.ReadFile(filepath.Join(root, "docker-compose.yml"))
	require.NoError(t, err)
	_, broker, ok := strings.Cut(string(compose), "\n  rocketmq-broker:\n")
	require.True(t, ok, "docker-compose.yml has a rocketmq-broker service")
	broker, _, _ = strings.Cut(broker, "\n\n")
	require.Contains(t, broker, want, "docker-compose.yml's broker")
}
