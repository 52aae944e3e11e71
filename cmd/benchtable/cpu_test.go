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
