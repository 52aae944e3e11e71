package mq

import (
	"context"
	"encoding/json"
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
// the broker lets it lapse after 60 s, rocketmq.broker.rebalance.lockMaxLiveTime).
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
// broker's lock expiry, as before, if the old one died).
type queueGuard struct {
	nameServers []string
	wait        time.Duration // HandoverWait
	stop        chan struct{} // closed by close

	// relMu is held while an allocation changes which queues are owned and
	// while an unlock is sent, so an unlock never lands after this node was
	// given the queue back and locked it again.
	relMu sync.Mutex

	mu       sync.Mutex
	idle     *sync.Cond // broadcast when a batch ends or ownership changes
	gen      int        // the client instance whose batches are accepted
	owned    map[primitive.MessageQueue]bool
	busy     map[primitive.MessageQueue]bool
	closed   bool
	cid      string               // the client's id, as the broker knows it
	group    string               // the consumer group, as the broker knows it
	addrs    map[string]string    // broker name -> master address
	lease    map[string]time.Time // broker name -> until when batches of its queues are admitted
	leaseTTL time.Duration
	routedAt time.Time // when the route was last read
}

func newQueueGuard(nameServers []string, wait, leaseTTL time.Duration) *queueGuard {
	g := &queueGuard{nameServers: nameServers, wait: wait, stop: make(chan struct{}), leaseTTL: leaseTTL,
		owned: map[primitive.MessageQueue]bool{}, busy: map[primitive.MessageQueue]bool{},
		addrs: map[string]string{}, lease: map[string]time.Time{}}
	g.idle = sync.NewCond(&g.mu)
	return g
}

// begin admits a batch of q from client instance gen: only while q is this
// node's and no other batch of q is in flight (one from an instance being
// replaced). A batch begin refuses is not applied and comes back later.
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
func (g *queueGuard) begin(gen int, q primitive.MessageQueue) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || gen != g.gen || !g.owned[q] || g.busy[q] || time.Now().After(g.lease[q.BrokerName]) {
		return false
	}
	g.busy[q] = true
	return true
}

func (g *queueGuard) end(q primitive.MessageQueue) {
	g.mu.Lock()
	delete(g.busy, q)
	g.idle.Broadcast()
	g.mu.Unlock()
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

func (g *queueGuard) identity() (group, cid string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.group, g.cid
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
	for g.busy[q] && !g.owned[q] {
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
		if !g.owned[q] && !g.busy[q] {
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
	_, _ = g.locks(ctx, reqUnlockBatchMQ, group, cid, free)
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
		locked, _ := g.locks(ctx, reqLockBatchMQ, group, cid, pending)
		cancel()
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
// broker, and returns the queues a lock request was granted.
func (g *queueGuard) locks(ctx context.Context, code int, group, cid string, qs []primitive.MessageQueue) (map[primitive.MessageQueue]bool, error) {
	byBroker := map[string][]primitive.MessageQueue{}
	for _, q := range qs {
		byBroker[q.BrokerName] = append(byBroker[q.BrokerName], q)
	}
	granted := map[primitive.MessageQueue]bool{}
	var lastErr error
	for name, mqs := range byBroker {
		addr, err := g.brokerAddr(ctx, name, mqs[0].Topic)
		if err != nil {
			lastErr = err
			continue
		}
		body, err := json.Marshal(lockBatchBody{ConsumerGroup: group, ClientID: cid, MQs: mqs})
		if err != nil {
			return nil, err
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
		}
	}
	return granted, lastErr
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
