package main

import (
	"bytes"
	"os"
	"path/filepath"
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
	done := measureCPU("spin")
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
	}
	done()
	if len(cpuPhases) != 1 {
		t.Fatalf("phases: %v", cpuPhases)
	}
	if got := cpuPhases[0].group["benchtable"]; got < 0.1 {
		t.Fatalf("this process used %.2f CPU s spinning 0.3 s", got)
	}
}

func TestGrouped(t *testing.T) {
	for n, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 174249.4: "174,249", 1e6: "1,000,000"} {
		if got := grouped(n); got != want {
			t.Errorf("grouped(%v) = %q, want %q", n, got, want)
		}
	}
}
