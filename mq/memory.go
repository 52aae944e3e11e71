package mq

import (
	"context"
	"errors"
	"hash/fnv"
	"strconv"
	"sync"
	"time"
)

// Memory is an in-process ordered queue for the embedded default: a topic of
// N queues, each a log with one committed offset, like one RocketMQ consumer
// group. Messages of one key go to one queue (FNV-1a hash, as the RocketMQ
// hash selector does), and a consumer delivers each queue in order, at least
// once. Nothing survives the process.
type Memory struct {
	mu     sync.Mutex
	queues []*memQueue
	seq    int64
}

type memQueue struct {
	log       []Message
	committed int
	wake      chan struct{} // closed and replaced on every append
}

func NewMemory(queues int) *Memory {
	if queues < 1 {
		queues = 1
	}
	m := &Memory{queues: make([]*memQueue, queues)}
	for i := range m.queues {
		m.queues[i] = &memQueue{wake: make(chan struct{})}
	}
	return m
}

func (m *Memory) queueOf(key string) *memQueue {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return m.queues[int(h.Sum32()%uint32(len(m.queues)))]
}

// Producer returns a producer on this topic.
func (m *Memory) Producer() Producer { return memProducer{m} }

type memProducer struct{ m *Memory }

func (p memProducer) Send(ctx context.Context, msgs ...Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := sameKey(msgs); err != nil {
		return err
	}
	p.m.mu.Lock()
	defer p.m.mu.Unlock()
	q := p.m.queueOf(msgs[0].Key)
	for _, msg := range msgs {
		p.m.seq++
		msg.ID = strconv.FormatInt(p.m.seq, 10)
		msg.Body = append([]byte(nil), msg.Body...)
		q.log = append(q.log, msg)
	}
	close(q.wake)
	q.wake = make(chan struct{})
	return nil
}

func (memProducer) Close() error { return nil }

// Pending is how many messages are not yet acknowledged, over all queues.
func (m *Memory) Pending() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, q := range m.queues {
		n += len(q.log) - q.committed
	}
	return n
}

// Consumer returns a consumer of this topic; batch bounds a delivery, retry is
// the pause after a failed one. Run one consumer at a time per Memory (one
// group); a new one resumes from the committed offsets.
func (m *Memory) Consumer(h Handler, batch int, retry time.Duration) Consumer {
	if batch < 1 {
		batch = 32
	}
	if retry <= 0 {
		retry = 100 * time.Millisecond
	}
	return &memConsumer{m: m, h: h, batch: batch, retry: retry}
}

type memConsumer struct {
	m         *Memory
	h         Handler
	batch     int
	retry     time.Duration
	startOnce sync.Once
	stopOnce  sync.Once
	cancel    context.CancelFunc
	wg        sync.WaitGroup
}

func (c *memConsumer) Start() error {
	started := false
	c.startOnce.Do(func() {
		ctx, cancel := context.WithCancel(context.Background())
		c.cancel = cancel
		for _, q := range c.m.queues {
			c.wg.Add(1)
			go c.run(ctx, q)
		}
		started = true
	})
	if !started {
		return errors.New("mq: consumer already started")
	}
	return nil
}

func (c *memConsumer) run(ctx context.Context, q *memQueue) {
	defer c.wg.Done()
	for {
		c.m.mu.Lock()
		from := q.committed
		to := min(len(q.log), from+c.batch)
		msgs := append([]Message(nil), q.log[from:to]...)
		wake := q.wake
		c.m.mu.Unlock()

		if len(msgs) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-wake:
			}
			continue
		}
		if err := c.h(ctx, msgs); err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(c.retry):
			}
			continue
		}
		c.m.mu.Lock()
		if q.committed == from {
			q.committed = to
		}
		c.m.mu.Unlock()
	}
}

// Close stops delivery and waits for the handler calls in flight; safe
// before Start and more than once.
func (c *memConsumer) Close() error {
	c.stopOnce.Do(func() {
		c.startOnce.Do(func() {}) // a Start after Close does nothing
		if c.cancel != nil {
			c.cancel()
		}
		c.wg.Wait()
	})
	return nil
}
