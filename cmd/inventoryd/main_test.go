package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// buildBinary compiles inventoryd once per test into a temp dir.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "inventoryd")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, string(out))
	return bin
}

// The real binary starts on port 0, answers /healthz, and exits cleanly on SIGTERM.
func TestServeHealthzAndGracefulShutdown(t *testing.T) {
	bin := buildBinary(t)
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "INVENTORY_HTTP_ADDR=127.0.0.1:0")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	lines := bufio.NewScanner(stderr)
	var addr string
	for addr == "" && lines.Scan() {
		var entry struct{ Msg, Addr string }
		if json.Unmarshal(lines.Bytes(), &entry) == nil && entry.Msg == "listening" {
			addr = entry.Addr
		}
	}
	require.NotEmpty(t, addr, "the server logs the address it listens on")
	go func() { _, _ = io.Copy(io.Discard, stderr) }()

	resp, err := http.Get("http://" + addr + "/healthz")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.JSONEq(t, `{"status":"ok"}`, string(body))

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		require.NoError(t, err, "exit status 0 after SIGTERM")
	case <-time.After(20 * time.Second):
		t.Fatal("inventoryd did not exit after SIGTERM")
	}
}

func TestMigrateRejectsUnknownDirection(t *testing.T) {
	bin := buildBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "migrate", "sideways").CombinedOutput()
	require.Error(t, err)
	require.True(t, strings.Contains(string(out), `invalid argument "sideways"`), string(out))
}
