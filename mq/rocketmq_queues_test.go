package mq

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/require"
)

// lockBroker answers LOCK_BATCH_MQ and UNLOCK_BATCH_MQ as the broker's
// RebalanceLockManager does (a queue is granted to the client holding it or
// to anyone when free; only the holder unlocks it), with no expiry.
type lockBroker struct {
	ln      net.Listener
	mu      sync.Mutex
	holder  map[primitive.MessageQueue]string
	changed chan struct{} // closed and replaced on every change
}

func newLockBroker(t *testing.T) *lockBroker {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	b := &lockBroker{ln: ln, holder: map[primitive.MessageQueue]string{}, changed: make(chan struct{})}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go b.serve(conn)
		}
	}()
	return b
}

func (b *lockBroker) serve(conn net.Conn) {
	defer conn.Close()
	var size [4]byte
	if _, err := io.ReadFull(conn, size[:]); err != nil {
		return
	}
	frame := make([]byte, binary.BigEndian.Uint32(size[:]))
	if _, err := io.ReadFull(conn, frame); err != nil {
		return
	}
	hlen := binary.BigEndian.Uint32(frame) & 0xFFFFFF
	var header struct {
		Code int `json:"code"`
	}
	if json.Unmarshal(frame[4:4+hlen], &header) != nil {
		return
	}
	var req lockBatchBody
	if json.Unmarshal(frame[4+hlen:], &req) != nil {
		return
	}
	var granted []primitive.MessageQueue
	b.mu.Lock()
	for _, q := range req.MQs {
		switch h := b.holder[q]; {
		case header.Code == reqLockBatchMQ && (h == "" || h == req.ClientID):
			b.holder[q] = req.ClientID
			granted = append(granted, q)
		case header.Code == reqUnlockBatchMQ && h == req.ClientID:
			delete(b.holder, q)
		}
	}
	close(b.changed)
	b.changed = make(chan struct{})
	b.mu.Unlock()
	body, _ := json.Marshal(map[string]any{"lockOKMQSet": granted})
	resp, _ := json.Marshal(map[string]any{"code": 0, "opaque": 1, "flag": 1})
	out := binary.BigEndian.AppendUint32(nil, uint32(4+len(resp)+len(body)))
	out = binary.BigEndian.AppendUint32(out, uint32(len(resp)))
	_, _ = conn.Write(append(append(out, resp...), body...))
}

// admit is begin for a batch whose context does not matter.
func admit(g *queueGuard, gen int, q primitive.MessageQueue) bool {
	_, ok := g.begin(context.Background(), gen, q)
	return ok
}

// waitHolder waits until q is held by cid.
func (b *lockBroker) waitHolder(t *testing.T, q primitive.MessageQueue, cid string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		b.mu.Lock()
		h, ch := b.holder[q], b.changed
		b.mu.Unlock()
		if h == cid {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("%v held by %q, want %q", q, h, cid)
		}
	}
}

func (b *lockBroker) holderOf(q primitive.MessageQueue) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.holder[q]
}

// When a rebalance moves queues from A to B, A unlocks each as soon as no
// batch of it is in flight, and refuses any further batch of it; B locks
// each as soon as A let go, and returns from its allocation only once it
// holds all of them. So a queue with a batch in flight on A is B's only
// after that batch ended: never applied by both.
func TestGuardHandsQueuesOverAfterTheBatchInFlight(t *testing.T) {
	broker := newLockBroker(t)
	guard := func() *queueGuard {
		g := newQueueGuard(nil, time.Minute, time.Hour)
		g.lockFor = time.Hour // no renewals in this test
		g.addrs["b"] = broker.ln.Addr().String()
		g.renew("b", time.Now())
		t.Cleanup(g.close)
		return g
	}
	a, b := guard(), guard()
	var qs []*primitive.MessageQueue
	for i := range 4 {
		qs = append(qs, &primitive.MessageQueue{Topic: "t", BrokerName: "b", QueueId: i})
	}
	q0, q2, q3 := *qs[0], *qs[2], *qs[3]

	require.Len(t, a.allocate(0)("g", "A", qs, []string{"A"}), 4)
	for _, q := range qs {
		require.Equal(t, "A", broker.holderOf(*q))
	}
	require.True(t, admit(a, 0, q3), "a batch of q3 in flight on A")
	require.False(t, admit(a, 0, q3), "one batch of a queue at a time")

	bDone := make(chan []*primitive.MessageQueue)
	go func() { bDone <- b.allocate(0)("g", "B", qs, []string{"A", "B"}) }()
	require.Len(t, a.allocate(0)("g", "A", qs, []string{"A", "B"}), 2) // A keeps q0 and q1

	broker.waitHolder(t, q2, "B") // q2 had nothing in flight: handed over at once
	require.Equal(t, "A", broker.holderOf(q3), "q3 stays A's while its batch runs")
	require.False(t, admit(a, 0, q2), "A no longer applies q2")
	select {
	case <-bDone:
		t.Fatal("B's rebalance returned before it held q3")
	default:
	}
	require.True(t, admit(a, 0, q0))
	a.end(q0)

	a.end(q3)
	select {
	case got := <-bDone:
		require.Len(t, got, 2)
	case <-time.After(30 * time.Second):
		t.Fatal("B never got q3")
	}
	require.Equal(t, "B", broker.holderOf(q3))
	require.False(t, admit(a, 0, q3))
	require.True(t, admit(b, 0, q3))
	b.end(q3)

	// A client being replaced (gen 0 retired) has its batches refused.
	require.Equal(t, 1, b.retire())
	require.False(t, admit(b, 0, q2))
}

// A batch is admitted only under a lease on its queue's broker: a check
// that found the client registered there, sent less than the lease's length
// ago (after a broker restart, the node stops applying before another can
// have taken its queues).
func TestGuardAppliesOnlyUnderALease(t *testing.T) {
	broker := newLockBroker(t)
	g := newQueueGuard(nil, time.Minute, time.Hour)
	g.lockFor = time.Hour // no renewals in this test
	g.addrs["b"] = broker.ln.Addr().String()
	t.Cleanup(g.close)
	q := primitive.MessageQueue{Topic: "t", BrokerName: "b", QueueId: 0}
	require.Len(t, g.allocate(0)("g", "A", []*primitive.MessageQueue{&q}, []string{"A"}), 1)
	require.False(t, admit(g, 0, q), "no check has found the client registered yet")

	g.renew("b", time.Now())
	require.True(t, admit(g, 0, q))
	g.end(q)

	g.lease["b"] = time.Now().Add(-time.Millisecond) // the lease ran out: no check succeeded since
	require.False(t, admit(g, 0, q))
	g.renew("b", time.Now().Add(-2*time.Hour)) // a check older than the lease renews nothing
	require.False(t, admit(g, 0, q))
}

// A node applies a queue only while it can count on the queue's lock: a
// batch in flight runs on while renewals are granted, is cancelled when
// lockFor has passed since the last granted renewal was sent (the broker
// cannot be reached: a partition, or a pause longer than the lock's life),
// and at once when the broker says another client holds the lock. After
// either, no batch of the queue is admitted until a renewal is granted.
func TestGuardAppliesOnlyWhileItsLockHolds(t *testing.T) {
	broker := newLockBroker(t)
	const lockFor = 500 * time.Millisecond
	g := newQueueGuard(nil, time.Minute, time.Hour)
	g.lockFor = lockFor
	g.addrs["b"] = broker.ln.Addr().String()
	g.renew("b", time.Now())
	t.Cleanup(g.close)
	q := primitive.MessageQueue{Topic: "t", BrokerName: "b", QueueId: 0}
	require.Len(t, g.allocate(0)("g", "A", []*primitive.MessageQueue{&q}, []string{"A"}), 1)

	// Renewed: a batch runs on past lockFor.
	ctx, ok := g.begin(context.Background(), 0, q)
	require.True(t, ok)
	for range 4 {
		time.Sleep(lockFor / 2)
		g.renewLocks()
	}
	require.NoError(t, ctx.Err(), "renewed every lockFor/2: the batch goes on")
	g.end(q)
	require.ErrorIs(t, context.Cause(ctx), context.Canceled, "ended")

	// Another client holds the lock (the broker let ours lapse while this
	// node was paused): the batch in flight is cancelled at the answer.
	ctx, ok = g.begin(context.Background(), 0, q)
	require.True(t, ok)
	broker.mu.Lock()
	broker.holder[q] = "B"
	broker.mu.Unlock()
	g.renewLocks()
	require.ErrorIs(t, context.Cause(ctx), errLockLost)
	g.end(q)
	require.False(t, admit(g, 0, q), "the lock is B's")
	broker.mu.Lock()
	delete(broker.holder, q)
	broker.mu.Unlock()
	g.renewLocks()
	require.True(t, admit(g, 0, q), "granted again")
	g.end(q)

	// The broker cannot be reached: the batch in flight is cancelled lockFor
	// after the last granted request was sent, not later.
	before := time.Now()
	g.renewLocks()
	after := time.Now()
	g.mu.Lock()
	until := g.lockedUntil[q]
	g.mu.Unlock()
	require.False(t, until.Before(before.Add(lockFor)) || until.After(after.Add(lockFor)),
		"valid until lockFor after the request was sent")
	ctx, ok = g.begin(context.Background(), 0, q)
	require.True(t, ok)
	require.NoError(t, broker.ln.Close())
	g.renewLocks() // unanswered: changes nothing
	<-ctx.Done()
	require.ErrorIs(t, context.Cause(ctx), errLockLapsed)
	require.False(t, time.Now().Before(until), "cancelled at the lock's end, not before")
	g.end(q)
	require.False(t, admit(g, 0, q), "no batch without a valid lock")
}
