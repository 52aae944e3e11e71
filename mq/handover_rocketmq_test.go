//go:build !race

package mq_test

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/mq"
	"github.com/acme/inventory/testkit/servers"
	"github.com/acme/inventory/testkit/testenv"
)

// The ordered sync must resume within seconds of a change of consumer nodes or
// a broker restart (docs/SPEC.md section 7). These tests drive real
// consumers of one group through each change while a ledger plays the
// applier: it applies each key's messages exactly once, in order, and fails
// the test if two consumers ever apply one key at the same time, if a key's
// sequence skips a message, or if anything is lost.

const (
	handoverQueues = 8
	keysPerQueue   = 2
	// settleWait bounds getting a group to a steady state before the change
	// (with the client as shipped that takes up to a lock expiry and a
	// rebalance period or two).
	settleWait = 4 * time.Minute
	// resumeWait bounds the wait for the backlog after a change: far above
	// the target, so that a slow resume is measured and reported, not cut off.
	resumeWait = 3 * time.Minute
)

// ledger is the stand-in applier: per key, the next sequence number it
// expects, like a reservation's state in the real one.
type ledger struct {
	t    *testing.T
	mu   sync.Mutex
	next map[string]int
	busy map[string]string       // key -> the consumer applying it right now
	by   map[int]map[string]bool // seq -> consumers that applied some message of it
	dups int
	ch   chan struct{} // closed and replaced on every change
}

func newLedger(t *testing.T, keys []string) *ledger {
	l := &ledger{t: t, next: map[string]int{}, busy: map[string]string{}, by: map[int]map[string]bool{}, ch: make(chan struct{})}
	for _, k := range keys {
		l.next[k] = 0
	}
	return l
}

func (l *ledger) handler(name string) mq.Handler {
	return func(_ context.Context, msgs []mq.Message) error {
		l.begin(name, msgs)
		// The work of a transaction: long enough that an overlap would be seen.
		time.Sleep(2 * time.Millisecond)
		l.apply(name, msgs)
		return nil
	}
}

// begin records that consumer name started applying msgs.
func (l *ledger) begin(name string, msgs []mq.Message) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range msgs {
		if other := l.busy[m.Key]; other != "" && other != name {
			l.t.Errorf("key %s applied by %s and %s at the same time", m.Key, other, name)
		}
		l.busy[m.Key] = name
	}
}

// apply records that consumer name applied msgs (the transaction committed).
func (l *ledger) apply(name string, msgs []mq.Message) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range msgs {
		key, s, _ := strings.Cut(string(m.Body), ":")
		n, err := strconv.Atoi(s)
		if err != nil || key != m.Key {
			l.t.Errorf("bad message %q (key %q)", m.Body, m.Key)
			continue
		}
		switch want := l.next[key]; {
		case n < want:
			l.dups++
		case n == want:
			l.next[key]++
			if l.by[n] == nil {
				l.by[n] = map[string]bool{}
			}
			l.by[n][name] = true
		default:
			l.t.Errorf("key %s: %s got message %d while %d is not applied yet (lost or out of order)", key, name, n, want)
		}
		delete(l.busy, m.Key)
	}
	close(l.ch)
	l.ch = make(chan struct{})
}

// abort forgets the batches consumer name had begun and not applied: it
// died, and its transactions with it.
func (l *ledger) abort(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, who := range l.busy {
		if who == name {
			delete(l.busy, k)
		}
	}
}

// waitRound waits until every key applied message seq, and returns how long
// that took and which consumers applied messages of it.
func (l *ledger) waitRound(seq int, timeout time.Duration) (time.Duration, []string) {
	l.t.Helper()
	start := time.Now()
	deadline := time.After(timeout)
	for {
		l.mu.Lock()
		missing := 0
		for _, n := range l.next {
			if n <= seq {
				missing++
			}
		}
		ch := l.ch
		var by []string
		for name := range l.by[seq] {
			by = append(by, name)
		}
		l.mu.Unlock()
		if missing == 0 {
			sort.Strings(by)
			return time.Since(start), by
		}
		select {
		case <-ch:
		case <-deadline:
			l.t.Fatalf("message %d of %d keys not applied after %s", seq, missing, timeout)
		}
	}
}

// check asserts the exact outcome: every key applied 0..rounds-1, once each.
func (l *ledger) check(rounds int) {
	l.t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, n := range l.next {
		require.Equal(l.t, rounds, n, "messages of %s applied", k)
	}
	l.t.Logf("duplicates delivered (and skipped as already applied): %d", l.dups)
}

// queueKeys returns keysPerQueue keys for each of queues queues, as the
// producer's hash selector spreads them (FNV-1a of the key, modulo queues).
func queueKeys(queues int) []string {
	count := make([]int, queues)
	var keys []string
	for i := 0; len(keys) < queues*keysPerQueue; i++ {
		k := fmt.Sprintf("SKU-%d", i)
		if q := mq.QueueOf(k, queues); count[q] < keysPerQueue {
			count[q]++
			keys = append(keys, k)
		}
	}
	return keys
}

// sendRound sends message seq of every key, retrying a send the broker did
// not take (after a restart the producer reconnects); a retry may store a
// message twice, which the ledger skips as a duplicate.
func sendRound(t *testing.T, p mq.Producer, keys []string, seq int) {
	t.Helper()
	for _, k := range keys {
		deadline := time.Now().Add(resumeWait)
		for {
			err := p.Send(context.Background(), mq.Message{Key: k, Body: []byte(k + ":" + strconv.Itoa(seq))})
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("send %s:%d: %v", k, seq, err)
			}
		}
	}
}

type group struct {
	t           *testing.T
	ns          []string
	topic, name string
	led         *ledger
	keys        []string
	p           mq.Producer
	round       int // next sequence number to send
}

func newGroup(t *testing.T, ns []string, broker string) *group {
	t.Helper()
	topic := testenv.Unique("handover")
	require.NoError(t, mq.CreateTopic(context.Background(), ns, broker, topic, handoverQueues))
	require.Eventually(t, func() bool {
		ok, err := mq.TopicExists(context.Background(), ns, topic)
		return err == nil && ok
	}, time.Minute, 100*time.Millisecond)
	keys := queueKeys(handoverQueues)
	p, err := mq.NewRocketProducer(mq.RocketMQConfig{NameServers: ns, Topic: topic, Group: topic + "_p", Instance: topic + "_p"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return &group{t: t, ns: ns, topic: topic, name: topic + "_c", led: newLedger(t, keys), keys: keys, p: p}
}

func (g *group) consumer(name string) mq.Consumer {
	g.t.Helper()
	c, err := mq.NewRocketConsumer(mq.RocketMQConfig{
		NameServers: g.ns, Topic: g.topic, Group: g.name, Instance: g.topic + "_" + name, Retry: 200 * time.Millisecond,
	}, g.led.handler(name))
	require.NoError(g.t, err)
	g.t.Cleanup(func() { _ = c.Close() })
	require.NoError(g.t, c.Start())
	return c
}

// next sends one round and waits for it: the time from the call until the
// round is applied, and who applied it.
func (g *group) next() (time.Duration, []string) {
	g.t.Helper()
	start := time.Now()
	sendRound(g.t, g.p, g.keys, g.round)
	_, by := g.led.waitRound(g.round, resumeWait)
	g.round++
	return time.Since(start), by
}

// settle sends rounds until one round is applied by exactly the consumers
// named (the group's queues are shared out among them and locked).
func (g *group) settle(names ...string) {
	g.t.Helper()
	sort.Strings(names)
	want := strings.Join(names, ",")
	start := time.Now()
	for {
		_, by := g.next()
		if strings.Join(by, ",") == want {
			g.t.Logf("group settled on %s after %s (%d rounds)", want, time.Since(start).Round(time.Millisecond), g.round)
			return
		}
		if time.Since(start) > settleWait {
			g.t.Fatalf("group not settled on %s after %s: last round applied by %v", want, settleWait, by)
		}
	}
}

// A consumer that leaves gracefully (Close) hands its queues over, and the
// ones that stay share them out anew: with three consumers (sorted A, B, C)
// and 8 queues, A has 0-2, B 3-5 and C 6-7; once A left, B has 0-3 and C
// 4-7, so B gives queues 4 and 5 to C while both keep running, which is
// where the client, which never unlocks what a rebalance takes away, stalled.
// A round sent right after Close is applied by B and C within the bound.
func TestRocketMQHandoverOnLeave(t *testing.T) {
	g := newGroup(t, []string{testenv.RocketMQNamesrv()}, testenv.RocketMQBroker())
	a := g.consumer("A")
	g.consumer("B")
	g.consumer("C")
	g.settle("A", "B", "C")

	start := time.Now()
	require.NoError(t, a.Close())
	closed := time.Since(start)
	took, by := g.next()
	resume := time.Since(start)
	t.Logf("RESUME leave: %s from Close (Close took %s; round sent and applied in %s)",
		resume.Round(time.Millisecond), closed.Round(time.Millisecond), took.Round(time.Millisecond))
	require.Equal(t, []string{"B", "C"}, by)
	g.led.check(g.round)
	assertResume(t, "leave", resume, groupResumeBound)
}

// A consumer that joins takes over its share: a round sent right after it
// started is applied within the bound, part of it by the newcomer.
func TestRocketMQHandoverOnJoin(t *testing.T) {
	g := newGroup(t, []string{testenv.RocketMQNamesrv()}, testenv.RocketMQBroker())
	g.consumer("A")
	g.settle("A")

	start := time.Now()
	g.consumer("B")
	took, by := g.next()
	resume := time.Since(start)
	t.Logf("RESUME join: %s from Start (round sent and applied in %s, by %v)",
		resume.Round(time.Millisecond), took.Round(time.Millisecond), by)
	g.settle("A", "B")
	g.led.check(g.round)
	assertResume(t, "join", resume, groupResumeBound)
}

// After the broker is killed and started again, a round sent once it is up
// is applied within the bound. The name server may route the restarted
// broker only at its first periodic registration, 10 s after its start:
// until then no client can start (nor resolve the topic), so the resume is
// also measured from the moment the topic is routed again.
func TestRocketMQResumeAfterBrokerRestart(t *testing.T) {
	// A name server and broker of this test's own, so that killing the
	// broker touches no other test's.
	srv, err := servers.StartRocketMQ(t.TempDir(), servers.FreePort(), servers.FreePort(-2, 1), "")
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	ns := []string{srv.NameServer()}
	g := newGroup(t, ns, srv.Broker())
	g.consumer("A")
	g.consumer("B")
	g.settle("A", "B")

	killed := time.Now()
	require.NoError(t, srv.StopBroker())
	require.NoError(t, srv.StartBroker())
	up := time.Now()
	routed := make(chan time.Time, 1)
	go func() {
		for deadline := up.Add(resumeWait); time.Now().Before(deadline); {
			if ok, err := mq.TopicExists(context.Background(), ns, g.topic); err == nil && ok {
				routed <- time.Now()
				return
			}
			time.Sleep(50 * time.Millisecond) // polling the name server, not synchronising
		}
		routed <- time.Time{}
	}()
	took, by := g.next()
	done := time.Now()
	var at time.Time
	select {
	case at = <-routed:
	case <-time.After(resumeWait):
	}
	require.False(t, at.IsZero(), "the name server never routed the topic again")
	resume, afterRoute := done.Sub(up), done.Sub(at)
	t.Logf("RESUME broker restart: %s from boot success, %s from the topic routed again (%s after boot); broker down %s; round applied by %v in %s",
		resume.Round(time.Millisecond), afterRoute.Round(time.Millisecond), at.Sub(up).Round(time.Millisecond),
		up.Sub(killed).Round(time.Millisecond), by, took.Round(time.Millisecond))
	g.settle("A", "B")
	g.led.check(g.round)
	assertResume(t, "broker restart, from the topic routed again", afterRoute, restartResumeBound)
	assertResume(t, "broker restart, from boot success", resume, restartBootBound)
}

func assertResume(t *testing.T, what string, resume, bound time.Duration) {
	t.Helper()
	if resume > bound {
		t.Errorf("%s: the backlog resumed after %s, want under %s", what, resume.Round(time.Millisecond), bound)
	}
}

// The bounds the tests assert: liveness, not speed (speed is make faults'
// measure, docs/SPEC.md section 7). A queue handed over in a rebalance
// resumes in about 3.1 s, measured under a load average of 19 on 2 cores:
// the client waits a fixed 3 s before the first pull of a queue it just
// added (it creates the queue's state after locking it, so the state reads
// as unlocked, and the pull backs off by its error delay). After a broker
// restart the client is replaced once the broker answers and the topic is
// routed (BrokerCheck), then pays the same 3 s: 3.5 to 4.7 s measured; from
// boot success it adds however long the name server leaves the broker out
// of its routes (0 or about 10 s measured). Each test logs its number
// (RESUME ...); the bounds sit far above them and below what the client
// did without the handover (63 s for a join, 80 s for a leave: the broker's
// 60 s lock expiry), so a regression fails and a busy machine does not.
const (
	groupResumeBound   = 20 * time.Second
	restartResumeBound = 20 * time.Second
	restartBootBound   = 40 * time.Second
)
