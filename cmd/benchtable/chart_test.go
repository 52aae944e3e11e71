package main

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func TestChartIsAPNG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "results.png")
	rs := []result{{name: "mysql-hot-row", ops: 6000, elapsed: time.Second}, {name: "lua", ops: 58000, elapsed: time.Second}}
	web := []httpResult{{name: "bare", rate: 15000}, {name: "seckill, selling", rate: 4000}, {name: "seckill, sold out", rate: 18000}}
	if !writeChart(path, rs, web) {
		t.Fatal("no chart written")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Fatalf("not a PNG: % x", b[:8])
	}
	if writeChart(path, nil, nil) {
		t.Fatal("a chart of nothing")
	}
}

func TestCPUSampleCountsThisProcess(t *testing.T) {
	cpuPhases = nil
	t.Cleanup(func() { cpuPhases = nil })
	// Spin until the kernel says this process burned 0.2 CPU-s (however
	// long a loaded machine takes), then the sample must have seen it
	// (/proc counts in 10 ms ticks).
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	done := measureCPU("spin")
	start := cpu()
	for deadline := time.Now().Add(time.Minute); cpu()-start < 200*time.Millisecond; {
		if time.Now().After(deadline) {
			t.Fatal("could not burn 0.2 CPU-s in a minute")
		}
	}
	done()
	if len(cpuPhases) != 1 {
		t.Fatalf("phases: %v", cpuPhases)
	}
	if got := cpuPhases[0].group["benchtable"]; got < 0.15 {
		t.Fatalf("this process burned at least 0.2 CPU-s; the sample saw %.2f", got)
	}
}

func TestGrouped(t *testing.T) {
	for n, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 174249.4: "174,249", 1e6: "1,000,000"} {
		if got := grouped(n); got != want {
			t.Errorf("grouped(%v) = %q, want %q", n, got, want)
		}
	}
}
