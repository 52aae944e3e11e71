package mq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
)

// Queue ownership of the orderly consumer, and its handover between nodes.
//
// In orderly mode a consumer applies a queue only while the broker holds
// that queue's lock for it (LOCK_BATCH_MQ; the client renews it every 20 s,
// the broker lets it lapse after rocketmq.broker.rebalance.lockMaxLiveTime,
// 60 s by default; ours run with BrokerLockLifetime, and the guard renews
// the locks itself: see below).
// rocketmq-client-go v2.1.2 never gives a lock back when a rebalance takes a
// queue away from it (pushConsumer.removeUnnecessaryMessageQueue, "TODO
// orderly"), so the node the queue goes to cannot lock it until the lock
// lapses, and only tries again at its next rebalance (every 20 s): queues
// stood still for 63 s when a node joined, 80 s when one of three left
// (the two that stay trade queues too). The guard below does
// what the client leaves out, through the allocation strategy, the one hook
// the client calls on every rebalance:
//
//   - a node that loses a queue stops applying it at once (a batch the client
//     still hands over is refused and stays unacknowledged), waits for the
//     batch in flight on it to end, and then unlocks it on the broker;
//   - a node that gains a queue locks it itself, retrying for up to
//     HandoverWait, before it lets the client go on (the client tries the lock
//     once and would otherwise wait for its next rebalance).
//
// One queue is therefore never applied by two nodes at once: the new owner
// can lock it only after the old one stopped applying it (or after the
// broker's lock expiry if the old one died).
//
// A node that dies (SIGKILL, OOM, panic) never gives its locks back: the
// broker drops it from the group as soon as its connections close and the
// nodes that stay rebalance at once, but they can lock its queues only when
// the locks lapse. With the broker's default lifetime that stalled the dead
// node's queues for 50-80 s; our brokers run with BrokerLockLifetime (1 s),
// and the guard keeps its own locks alive and obeys them:
//
//   - it renews the locks of the queues it owns every lockRenew (the client
//     does every 20 s, far beyond a 1 s lifetime);
//   - a batch of a queue is admitted only until lockValid after the last
//     granted lock request of that queue was sent (the broker stamped the lock
//     when it received the request, later), and a batch in flight has its
//     context cancelled at that moment unless a renewal pushed it further,
//     or at once when the broker says another client holds the lock. A node
//     that is slow rather than dead (a long pause, a partition from the
//     broker) therefore stops applying a queue lockMargin before the broker
//     can give its lock to another node, which then waits 3 s more before its
//     first pull of that queue (the client's delay for a queue it just locked).
//
// A broker with a longer lifetime (the default 60 s) is safe, only slow to
// hand a dead node's queues over; a shorter one than BrokerLockLifetime is
// not: the guard would go on applying a queue whose lock may have lapsed.
type queueGuard struct {
	nameServers []string
	wait        time.Duration // HandoverWait
	stop        chan struct{} // closed by close

	// relMu is held while an allocation changes which queues are owned and
	// while an unlock is sent, so an unlock never lands after this node was
	// given the queue back and locked it again.
	relMu sync.Mutex

	mu    sync.Mutex
	idle  *sync.Cond // broadcast when a batch ends or ownership changes
	gen   int        // the client instance whose batches are accepted
	owned map[primitive.MessageQueue]bool
	busy  map[primitive.MessageQueue]*batch // the batch in flight of each queue
	// lockedUntil is until when batches of each queue may run (see
	// queueGuard): lockFor after the last granted lock request was sent.
	lockedUntil map[primitive.MessageQueue]time.Time
	lockFor     time.Duration
	closed      bool
	cid         string               // the client's id, as the broker knows it
	group       string               // the consumer group, as the broker knows it
	addrs       map[string]string    // broker name -> master address
	lease       map[string]time.Time // broker name -> until when batches of its queues are admitted
	leaseTTL    time.Duration
	routedAt    time.Time // when the route was last read
}

func newQueueGuard(nameServers []string, wait, leaseTTL time.Duration) *queueGuard {
	g := &queueGuard{nameServers: nameServers, wait: wait, stop: make(chan struct{}), leaseTTL: leaseTTL,
		owned: map[primitive.MessageQueue]bool{}, busy: map[primitive.MessageQueue]*batch{},
		lockedUntil: map[primitive.MessageQueue]time.Time{}, lockFor: lockValid,
		addrs: map[string]string{}, lease: map[string]time.Time{}}
	g.idle = sync.NewCond(&g.mu)
	return g
}

// BrokerLockLifetime is how long a broker keeps a queue lock its holder does
// not renew: the value of rocketmq.broker.rebalance.lockMaxLiveTime (a JVM
// system property, in milliseconds) that scripts/up.sh, testkit/servers and
// docker-compose.yml give the broker, and the least a broker of this service
// may have (docs/operations.md).
const BrokerLockLifetime = time.Second

// The guard's own lock keeping (see queueGuard).
const (
	// lockRenew is how often the locks of owned queues are renewed.
	lockRenew = 200 * time.Millisecond
	// lockMargin is how long before the broker could let a lock lapse the
	// guard stops applying its queue: for a transaction cancelled at that
	// moment to end.
	lockMargin = 300 * time.Millisecond
	// lockValid is how long after a granted lock request was sent its queue
	// may be applied.
	lockValid = BrokerLockLifetime - lockMargin
)

// errLockLapsed and errLockLost cancel a batch whose queue's lock this node
// can no longer count on.
var (
	errLockLapsed = errors.New("mq: the queue's lock was not renewed in time: it may have lapsed on the broker")
	errLockLost   = errors.New("mq: the broker gave the queue's lock to another consumer")
)

// batch is a batch in flight: its context is cancelled when its queue's lock
// can no longer be counted on.
type batch struct {
	cancel context.CancelCauseFunc
	timer  *time.Timer // cancels at the queue's lockedUntil; reset by renewals
}

// begin admits a batch of q from client instance gen and returns the context
// it runs under (derived from parent): only while q is this node's and no
// other batch of q is in flight (one from an instance being replaced), and
// while q's lock is valid (see queueGuard). A batch begin refuses is not
// applied and comes back later.
//
// It also needs a lease on q's broker: the broker listed this client among
// the group's consumers in a check sent less than leaseTTL ago. After a
// broker restart the broker has forgotten every lock and every consumer,
// and another node's new client may be allocated and lock this node's
// queues before this node noticed; the lease makes this node stop applying
// them by leaseTTL after the broker went down, before any other node can
// have started (a broker takes seconds to start, and a new client pulls 3 s
// after it locked a queue). The same holds when this node is cut off from
// the broker while the broker lets its locks expire.
func (g *queueGuard) begin(parent context.Context, gen int, q primitive.MessageQueue) (context.Context, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	if g.closed || gen != g.gen || !g.owned[q] || g.busy[q] != nil || now.After(g.lease[q.BrokerName]) || !now.Before(g.lockedUntil[q]) {
		return nil, false
	}
	ctx, cancel := context.WithCancelCause(parent)
	g.busy[q] = &batch{cancel: cancel, timer: time.AfterFunc(g.lockedUntil[q].Sub(now), func() { cancel(errLockLapsed) })}
	return ctx, true
}

func (g *queueGuard) end(q primitive.MessageQueue) {
	g.mu.Lock()
	if b := g.busy[q]; b != nil {
		b.timer.Stop()
		b.cancel(nil)
	}
	delete(g.busy, q)
	g.idle.Broadcast()
	g.mu.Unlock()
}

// locked records the answer to a lock request for qs sent at sent: the
// queues granted may be applied until lockFor after it; those the broker
// refused (it answered, and another client holds them) not at all, and a
// batch of them in flight is cancelled.
func (g *queueGuard) locked(sent time.Time, qs []primitive.MessageQueue, granted, answered map[primitive.MessageQueue]bool) {
	until := sent.Add(g.lockFor)
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, q := range qs {
		b := g.busy[q]
		switch {
		case granted[q]:
			if until.After(g.lockedUntil[q]) {
				g.lockedUntil[q] = until
				if b != nil {
					b.timer.Reset(time.Until(until))
				}
			}
		case answered[q]:
			delete(g.lockedUntil, q)
			if b != nil {
				b.cancel(errLockLost)
			}
		}
	}
}

// keepLocks renews the locks of the queues this node owns every lockRenew,
// until done or close.
func (g *queueGuard) keepLocks(done <-chan struct{}) {
	t := time.NewTicker(lockRenew)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-g.stop:
			return
		case <-t.C:
		}
		g.renewLocks()
	}
}

// renewLocks sends one lock request for the queues owned, under relMu so
// that it never lands after the unlock of a queue this node just lost.
func (g *queueGuard) renewLocks() {
	g.relMu.Lock()
	defer g.relMu.Unlock()
	g.mu.Lock()
	group, cid := g.group, g.cid
	qs := slices.Collect(maps.Keys(g.owned))
	g.mu.Unlock()
	if cid == "" || len(qs) == 0 {
		return
	}
	// Past BrokerLockLifetime an answer can no longer extend anything.
	ctx, cancel := context.WithTimeout(context.Background(), BrokerLockLifetime)
	defer cancel()
	sent := time.Now()
	granted, answered, _ := g.locks(ctx, reqLockBatchMQ, group, cid, qs)
	g.locked(sent, qs, granted, answered)
}

// retire stops accepting batches of the current client instance (it is
// being replaced) and returns the next instance's number.
func (g *queueGuard) retire() int {
	g.relMu.Lock()
	defer g.relMu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gen++
	clear(g.owned)
	clear(g.lockedUntil)
	g.idle.Broadcast()
	return g.gen
}

// close stops accepting batches for good.
func (g *queueGuard) close() {
	g.relMu.Lock()
	defer g.relMu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.closed = true
		close(g.stop)
		g.idle.Broadcast()
	}
}

// waitIdle returns once no batch is in flight.
func (g *queueGuard) waitIdle() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for len(g.busy) > 0 {
		g.idle.Wait()
	}
}

// current reports whether gen is the client instance whose batches are
// accepted.
func (g *queueGuard) current(gen int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return gen == g.gen && !g.closed
}

// allocate is the allocation strategy of client instance gen: the client's
// own (AllocateByAveragely), plus the handover of the queues it moves.
func (g *queueGuard) allocate(gen int) consumer.AllocateStrategy {
	return func(group, cid string, mqAll []*primitive.MessageQueue, cidAll []string) []*primitive.MessageQueue {
		res := consumer.AllocateByAveragely(group, cid, mqAll, cidAll)
		if len(mqAll) == 0 {
			return res
		}
		topic := mqAll[0].Topic
		mine := map[primitive.MessageQueue]bool{}
		var wanted []primitive.MessageQueue
		for _, q := range res {
			mine[*q] = true
			wanted = append(wanted, *q)
		}

		g.relMu.Lock()
		g.mu.Lock()
		if gen != g.gen || g.closed {
			g.mu.Unlock()
			g.relMu.Unlock()
			return res
		}
		g.group, g.cid = group, cid
		var lost []primitive.MessageQueue
		for q := range g.owned {
			if q.Topic == topic && !mine[q] {
				lost = append(lost, q)
				delete(g.owned, q)
				delete(g.lockedUntil, q)
			}
		}
		for q := range mine {
			g.owned[q] = true
		}
		g.idle.Broadcast()
		g.mu.Unlock()
		g.relMu.Unlock()

		for _, q := range lost {
			go g.release(q) // each on its own: one long batch holds back only its queue
		}
		if len(wanted) > 0 {
			g.acquire(gen, group, cid, wanted)
		}
		return res
	}
}

// releaseRetries are the pauses between the unlocks of a released queue:
// the client may renew a lock it is dropping once more (its periodic lockAll,
// or a consume loop's last lock attempt, can still be under way), so the
// unlock is repeated for a few seconds. Repeating is harmless: the broker
// removes a lock only for the client that holds it.
var releaseRetries = []time.Duration{0, 250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second}

// release unlocks q on the broker once no batch of it is in flight, as long
// as it is still not this node's.
func (g *queueGuard) release(q primitive.MessageQueue) {
	g.mu.Lock()
	for g.busy[q] != nil && !g.owned[q] {
		g.idle.Wait()
	}
	g.mu.Unlock()
	for _, pause := range releaseRetries {
		if pause > 0 {
			time.Sleep(pause)
		}
		if !g.unlockReleased([]primitive.MessageQueue{q}) {
			return
		}
	}
}

// unlockReleased unlocks those of qs that are neither owned nor busy, and
// says whether there were any.
func (g *queueGuard) unlockReleased(qs []primitive.MessageQueue) bool {
	g.relMu.Lock()
	defer g.relMu.Unlock()
	g.mu.Lock()
	var free []primitive.MessageQueue
	for _, q := range qs {
		if !g.owned[q] && g.busy[q] == nil {
			free = append(free, q)
		}
	}
	group, cid := g.group, g.cid
	g.mu.Unlock()
	if len(free) == 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, _, _ = g.locks(ctx, reqUnlockBatchMQ, group, cid, free)
	return true
}

// acquirePause is how often acquire asks again for a queue another node
// still holds.
const acquirePause = 100 * time.Millisecond

// acquire locks qs for client cid, retrying the ones another node still
// holds for up to g.wait, so that the client's own single attempt, right
// after this, finds them locked for it. Queues it already holds are simply
// renewed.
func (g *queueGuard) acquire(gen int, group, cid string, qs []primitive.MessageQueue) {
	deadline := time.Now().Add(g.wait)
	pending := qs
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		sent := time.Now()
		locked, answered, _ := g.locks(ctx, reqLockBatchMQ, group, cid, pending)
		cancel()
		if g.current(gen) {
			g.locked(sent, pending, locked, answered)
		}
		pending = slices.DeleteFunc(pending, func(q primitive.MessageQueue) bool { return locked[q] })
		if len(pending) == 0 || time.Now().After(deadline) || !g.current(gen) {
			return
		}
		select {
		case <-g.stop:
			return
		case <-time.After(acquirePause):
		}
	}
}

// Broker requests of the guard (remoting codes of Apache RocketMQ).
const (
	reqGetConsumerListByGroup = 38
	reqLockBatchMQ            = 41
	reqUnlockBatchMQ          = 42
)

type lockBatchBody struct {
	ConsumerGroup string                   `json:"consumerGroup"`
	ClientID      string                   `json:"clientId"`
	MQs           []primitive.MessageQueue `json:"mqSet"`
}

// locks sends LOCK_BATCH_MQ or UNLOCK_BATCH_MQ for qs, one request per
// broker, and returns the queues a lock request was granted, and the queues
// whose broker answered.
func (g *queueGuard) locks(ctx context.Context, code int, group, cid string, qs []primitive.MessageQueue) (granted, answered map[primitive.MessageQueue]bool, _ error) {
	byBroker := map[string][]primitive.MessageQueue{}
	for _, q := range qs {
		byBroker[q.BrokerName] = append(byBroker[q.BrokerName], q)
	}
	granted, answered = map[primitive.MessageQueue]bool{}, map[primitive.MessageQueue]bool{}
	var lastErr error
	for name, mqs := range byBroker {
		addr, err := g.brokerAddr(ctx, name, mqs[0].Topic)
		if err != nil {
			lastErr = err
			continue
		}
		body, err := json.Marshal(lockBatchBody{ConsumerGroup: group, ClientID: cid, MQs: mqs})
		if err != nil {
			return nil, nil, err
		}
		rc, remark, resp, err := call(ctx, addr, code, nil, body)
		if err == nil && rc != resSuccess {
			err = fmt.Errorf("broker %s: code %d: %s", addr, rc, remark)
		}
		if err != nil {
			g.forgetBroker(name)
			lastErr = err
			continue
		}
		if code == reqLockBatchMQ {
			var ok struct {
				MQs []primitive.MessageQueue `json:"lockOKMQSet"`
			}
			if err := decodeBody(resp, &ok); err != nil {
				lastErr = err
				continue
			}
			for _, q := range ok.MQs {
				granted[q] = true
			}
			for _, q := range mqs {
				answered[q] = true
			}
		}
	}
	return granted, answered, lastErr
}

// brokerAddr is the master address of broker name, from the route of topic.
func (g *queueGuard) brokerAddr(ctx context.Context, name, topic string) (string, error) {
	g.mu.Lock()
	addr := g.addrs[name]
	g.mu.Unlock()
	if addr != "" {
		return addr, nil
	}
	masters, err := topicMasters(ctx, g.nameServers, topic)
	if err != nil {
		return "", err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for n, a := range masters {
		g.addrs[n] = a
	}
	if g.addrs[name] == "" {
		return "", fmt.Errorf("no master address for broker %s", name)
	}
	return g.addrs[name], nil
}

func (g *queueGuard) forgetBroker(name string) {
	g.mu.Lock()
	delete(g.addrs, name)
	g.mu.Unlock()
}

// routed reports whether the name servers route topic now (and refreshes
// the broker addresses from the route).
func (g *queueGuard) routed(ctx context.Context, topic string) bool {
	m, err := topicMasters(ctx, g.nameServers, topic)
	if err != nil {
		return false
	}
	g.mu.Lock()
	maps.Copy(g.addrs, m)
	g.routedAt = time.Now()
	g.mu.Unlock()
	return true
}

// routeRefresh is how often brokers reads the topic's route from the name
// servers again (between, it asks the brokers it knows).
const routeRefresh = 10 * time.Second

// brokers asks each master broker of topic whether it counts this client
// among the group's consumers. forgotten: one answers but does not, because
// it restarted (or dropped the client's connection) and has not had the
// client's heartbeat since, which the client sends every 30 s; until then
// the broker refuses its pulls. unreachable: one did not answer (down, or
// cut off).
func (g *queueGuard) brokers(ctx context.Context, topic string) (forgotten, unreachable bool) {
	g.mu.Lock()
	group, cid := g.group, g.cid
	masters := maps.Clone(g.addrs)
	stale := time.Since(g.routedAt) > routeRefresh
	g.mu.Unlock()
	if cid == "" {
		return false, false // no rebalance yet: the client has not registered either
	}
	if stale || len(masters) == 0 {
		// A broker that is down has left the name servers' routes: until it
		// is back, the brokers this consumer last knew are asked.
		if m, err := topicMasters(ctx, g.nameServers, topic); err == nil {
			masters = m
			g.mu.Lock()
			maps.Copy(g.addrs, m)
			g.routedAt = time.Now()
			g.mu.Unlock()
		}
	}
	for name, addr := range masters {
		sent := time.Now()
		rc, _, body, err := call(ctx, addr, reqGetConsumerListByGroup, map[string]string{"consumerGroup": group}, nil)
		if err != nil {
			unreachable = true
			continue
		}
		if rc != resSuccess {
			forgotten = true // "no consumer for this group"
			continue
		}
		var list struct {
			IDs []string `json:"consumerIdList"`
		}
		if err := decodeBody(body, &list); err != nil || !slices.Contains(list.IDs, cid) {
			forgotten = true
			continue
		}
		g.renew(name, sent)
	}
	return forgotten, unreachable
}

// renew extends the lease on broker name to leaseTTL after sent, the time
// the check that found this client registered was sent.
func (g *queueGuard) renew(name string, sent time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if until := sent.Add(g.leaseTTL); until.After(g.lease[name]) {
		g.lease[name] = until
	}
}
