package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Instance is one real inventoryd process on a fixed loopback port, so a
// restart keeps its address and clients reconnect to it.
type Instance struct {
	Name string
	Port int
	bin  string
	env  []string
	log  string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	starts int
}

// URL is the instance's base URL.
func (in *Instance) URL() string { return fmt.Sprintf("http://127.0.0.1:%d", in.Port) }

// Start runs the process and waits until /healthz answers.
func (in *Instance) Start(ctx context.Context) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.cmd != nil {
		return fmt.Errorf("%s is already running", in.Name)
	}
	in.starts++
	f, err := os.OpenFile(in.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "---- start %d at %s\n", in.starts, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(in.bin)
	cmd.Env = append(baseEnv(), in.env...)
	cmd.Env = append(cmd.Env, fmt.Sprintf("INVENTORY_HTTP_ADDR=127.0.0.1:%d", in.Port),
		"INVENTORY_INSTANCE="+in.Name)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL} // never outlives the driver
	if err := cmd.Start(); err != nil {
		f.Close()
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); f.Close(); close(exited) }()
	in.cmd, in.exited = cmd, exited
	deadline := time.Now().Add(90 * time.Second)
	for {
		select {
		case <-exited:
			in.cmd = nil
			return fmt.Errorf("%s exited while starting (log: %s): %s", in.Name, in.log, logTail(in.log))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if healthy(in.URL()) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer /healthz within 90s (log: %s)", in.Name, in.log)
		}
	}
}

// Kill ends the process with SIGKILL (no shutdown of any kind) and waits.
func (in *Instance) Kill() { in.signal(syscall.SIGKILL) }

// Stop ends the process with SIGTERM (graceful shutdown) and waits.
func (in *Instance) Stop() { in.signal(syscall.SIGTERM) }

func (in *Instance) signal(sig syscall.Signal) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.cmd == nil {
		return
	}
	_ = syscall.Kill(-in.cmd.Process.Pid, sig)
	select {
	case <-in.exited:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-in.cmd.Process.Pid, syscall.SIGKILL)
		<-in.exited
	}
	in.cmd = nil
}

// Restart stops the process gracefully (SIGTERM) and starts bin in its
// place, under the same name, port and environment with env added: a
// rolling upgrade's step.
func (in *Instance) Restart(ctx context.Context, bin string, env ...string) error {
	in.Stop()
	in.mu.Lock()
	in.bin = bin
	in.env = append(slices.Clip(in.env), env...)
	in.mu.Unlock()
	return in.Start(ctx)
}

// Running reports whether the process is up.
func (in *Instance) Running() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.cmd != nil
}

// logTail returns the last lines of a log file, for error messages.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return strings.Join(lines, "\n")
}

// baseEnv is the driver's environment without any INVENTORY_ variable, so
// only what the scenario sets configures the service.
func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "INVENTORY_") {
			env = append(env, kv)
		}
	}
	return env
}

// healthy: the process answers (/healthz 200).
func healthy(base string) bool { return answers200(base+"/healthz", time.Second) }

// ready: the instance's dependencies answer (/readyz 200).
func ready(base string) bool { return answers200(base+"/readyz", 3*time.Second) }

func answers200(url string, timeout time.Duration) bool {
	c := http.Client{Timeout: timeout}
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// runCommand runs one inventoryd subcommand with env and returns its
// stdout, stderr and exit status.
func runCommand(ctx context.Context, bin string, env []string, args ...string) (string, string, int, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(baseEnv(), env...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return stdout.String(), stderr.String(), exit.ExitCode(), nil
	}
	if err != nil {
		return stdout.String(), stderr.String(), -1, err
	}
	return stdout.String(), stderr.String(), 0, nil
}
