package main

import (
	"net"
	"os"
	"testing"
)

// The RocketMQ servers counted are the processes listening on
// rocketMQPorts: told by their sockets, as this process's own listener.
func TestListeningInodes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	saved := rocketMQPorts
	defer func() { rocketMQPorts, rocketMQPids = saved, map[int]bool{} }()
	rocketMQPorts, rocketMQPids = []int{port}, map[int]bool{}
	if len(listeningInodes([]int{port})) != 1 {
		t.Fatalf("no listening socket on port %d in /proc/net/tcp", port)
	}
	if !rocketMQServes(os.Getpid()) {
		t.Errorf("this process listens on %d: not told", port)
	}
	rocketMQPorts, rocketMQPids = []int{1}, map[int]bool{}
	if rocketMQServes(os.Getpid()) {
		t.Error("this process does not listen on port 1: told it does")
	}
}

// An answer's cost is this process's CPU over the phase's answers, the
// servers (shared with other runs) and the rest of the machine left out;
// the latest phase of a name is the one.
func TestProcessCPUPerAnswer(t *testing.T) {
	saved := cpuPhases
	defer func() { cpuPhases = saved }()
	groups := func(s float64) map[string]float64 {
		return map[string]float64{"benchtable": s, "redis-server": 0.2, "mariadbd": 0.1, "RocketMQ (java)": 0.1}
	}
	cpuPhases = []cpuPhase{
		{name: "seckill, sold out, x", group: groups(9), other: 5, busy: 14.4},
		{name: "seckill, sold out, x", group: groups(2), other: 5, busy: 7.4},
	}
	r := httpResult{name: "seckill, sold out, x", codes: map[int]int64{409: 40_000, -1: 7}}
	if got, ok := processCPUPerAnswer(r); !ok || got < 49.99 || got > 50.01 {
		t.Errorf("%.2f µs (%v), want 50: 2 CPU s over 40,000 answers, failures, the servers and everything else left out", got, ok)
	}
	if _, ok := processCPUPerAnswer(httpResult{name: "seckill, sold out, x", codes: map[int]int64{-1: 3}}); ok {
		t.Error("no answers: measured")
	}
	if _, ok := processCPUPerAnswer(httpResult{name: "not sampled", codes: map[int]int64{409: 1}}); ok {
		t.Error("no CPU sample of the phase: measured")
	}
}
