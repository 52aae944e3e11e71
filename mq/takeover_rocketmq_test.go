//go:build !race

package mq_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/mq"
	"github.com/acme/inventory/testkit/servers"
)

// A consumer node that crashes holds the broker's locks on its queues until
// they lapse; the node that takes its queues over waits for that. These tests
// run the node that crashes as a child process (this test binary, see
// TestMain) and kill it with SIGKILL: no Close, no unlock, its connections
// closed by the kernel, as when a node is OOM-killed or panics.

// childEnv makes the test binary a consumer process instead of running the
// tests (see runChildConsumer).
const childEnv = "INVENTORY_MQTEST_CHILD_CONSUMER"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		runChildConsumer()
		return
	}
	os.Exit(m.Run())
}

// runChildConsumer runs one consumer of the group named by the environment
// and reports to its parent on stdout, one line per event: "B key..." when a
// batch begins, "E key:seq..." once it is applied. It runs until killed.
func runChildConsumer() {
	var mu sync.Mutex
	say := func(kind string, words []string) {
		mu.Lock()
		defer mu.Unlock()
		_, _ = fmt.Fprintln(os.Stdout, kind+" "+strings.Join(words, " "))
	}
	retry, _ := time.ParseDuration(os.Getenv("MQTEST_RETRY"))
	c, err := mq.NewRocketConsumer(mq.RocketMQConfig{
		NameServers: strings.Split(os.Getenv("MQTEST_NAMESRV"), ","), Topic: os.Getenv("MQTEST_TOPIC"),
		Group: os.Getenv("MQTEST_GROUP"), Instance: os.Getenv("MQTEST_INSTANCE"), Retry: retry,
	}, func(_ context.Context, msgs []mq.Message) error {
		keys, bodies := make([]string, len(msgs)), make([]string, len(msgs))
		for i, m := range msgs {
			keys[i], bodies[i] = m.Key, string(m.Body)
		}
		say("B", keys)
		time.Sleep(2 * time.Millisecond) // as the ledger's own handler
		say("E", bodies)
		return nil
	})
	if err == nil {
		err = c.Start()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child consumer:", err)
		os.Exit(2)
	}
	select {} // until SIGKILL
}

// child is a consumer running in a child process.
type child struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	stderr bytes.Buffer
	read   chan struct{} // closed once its stdout is read to the end
	led    *ledger
}

// childConsumer starts consumer name of the group in a child process; the
// ledger learns what it applies from its reports.
func (g *group) childConsumer(name string) *child {
	g.t.Helper()
	c := &child{t: g.t, name: name, read: make(chan struct{}), led: g.led}
	c.cmd = exec.Command(os.Args[0])
	c.cmd.Env = append(os.Environ(), childEnv+"=1",
		"MQTEST_NAMESRV="+strings.Join(g.ns, ","), "MQTEST_TOPIC="+g.topic, "MQTEST_GROUP="+g.name,
		"MQTEST_INSTANCE="+g.topic+"_"+name, "MQTEST_RETRY=200ms")
	c.cmd.Stderr = &c.stderr
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlives the test
	out, err := c.cmd.StdoutPipe()
	require.NoError(g.t, err)
	require.NoError(g.t, c.cmd.Start())
	go c.follow(out)
	g.t.Cleanup(func() {
		c.kill()
		if g.t.Failed() && c.stderr.Len() > 0 {
			g.t.Logf("consumer %s (child process) stderr:\n%s", name, c.stderr.String())
		}
	})
	return c
}

// follow feeds the ledger with the child's reports.
func (c *child) follow(out interface{ Read([]byte) (int, error) }) {
	defer close(c.read)
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		kind, rest, _ := strings.Cut(sc.Text(), " ")
		words := strings.Fields(rest)
		msgs := make([]mq.Message, len(words))
		switch kind {
		case "B":
			for i, k := range words {
				msgs[i] = mq.Message{Key: k}
			}
			c.led.begin(c.name, msgs)
		case "E":
			for i, b := range words {
				k, _, _ := strings.Cut(b, ":")
				msgs[i] = mq.Message{Key: k, Body: []byte(b)}
			}
			c.led.apply(c.name, msgs)
		default:
			c.t.Errorf("consumer %s (child process): unexpected line %q", c.name, sc.Text())
		}
	}
}

// kill ends the child with SIGKILL and waits for it and for the last of its
// reports; a batch it had begun and not reported applied died with it.
func (c *child) kill() {
	if c.cmd.ProcessState != nil {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.read
	_ = c.cmd.Wait()
	c.led.abort(c.name)
}

// A consumer node killed with SIGKILL (no Close: its locks are not given
// back) loses its queues to the node that stays, and a round sent right
// after the kill is applied, all of it by the survivor, within the bound.
// The broker drops the dead node from the group as soon as its connections
// close and tells the survivor, which rebalances at once; it can lock the
// dead node's queues only once their locks lapse on the broker
// (rocketmq.broker.rebalance.lockMaxLiveTime, which StartRocketMQ sets as
// scripts/up.sh does), and the client pulls a queue it just locked 3 s later.
func TestRocketMQTakeoverAfterKill(t *testing.T) {
	// A broker of this test's own: it runs with testkit/servers' settings
	// whatever the shared broker was started with.
	srv, err := servers.StartRocketMQ(t.TempDir(), servers.FreePort(), servers.FreePort(-2, 1), "")
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	g := newGroup(t, []string{srv.NameServer()}, srv.Broker())
	a := g.childConsumer("A")
	g.consumer("B")
	g.settle("A", "B")
	// Who holds what, as make faults reads it to pick its victim.
	owners, err := mq.QueueOwners(context.Background(), g.ns, g.topic, g.name)
	require.NoError(t, err)
	held := map[string]int{}
	for _, cid := range owners {
		_, inst, _ := strings.Cut(cid, "@")
		held[inst]++
	}
	require.Equal(t, map[string]int{g.topic + "_A": handoverQueues / 2, g.topic + "_B": handoverQueues / 2}, held)

	killed := time.Now()
	a.kill()
	took, by := g.next()
	resume := time.Since(killed)
	t.Logf("RESUME kill: %s from SIGKILL (round sent and applied in %s, by %v)",
		resume.Round(time.Millisecond), took.Round(time.Millisecond), by)
	require.Equal(t, []string{"B"}, by)
	g.led.check(g.round)
	assertResume(t, "kill", resume, killResumeBound)
}

// killResumeBound: what the design guarantees after a crash is the broker's
// lock lifetime (1 s) plus the client's 3 s wait before its first pull of a
// queue it just locked, about 4.3 s measured; the bound sits far above it, for
// a busy machine, and far below the 60-80 s the broker's default lifetime
// gave (the survivor retried its lock at each 20 s rebalance).
const killResumeBound = 20 * time.Second
