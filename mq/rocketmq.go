package mq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/admin"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/apache/rocketmq-client-go/v2/rlog"
)

func init() {
	// The client logs every rebalance and heartbeat at info level.
	rlog.SetLogLevel("error")
}

// RocketMQConfig names the topic and group a producer or consumer works on.
type RocketMQConfig struct {
	NameServers []string
	Topic       string
	Group       string
	// Instance distinguishes clients in one process: clients sharing an
	// instance name share internals, and closing one breaks the others.
	Instance string
	// BatchSize bounds how many consecutive messages of a queue a handler
	// receives at once (default 32).
	BatchSize int
	// Retry is how long a queue pauses after its handler failed (default 1s).
	Retry time.Duration
	// HandoverWait bounds how long a consumer given a queue in a rebalance
	// retries its lock while the previous owner finishes its batch and
	// releases it, or while the lock of an owner that died lapses on the
	// broker (BrokerLockLifetime) (default 10s); after that the client
	// retries at its next rebalance (every 20 s), as it does with a broker
	// whose locks live longer (the default 60 s).
	HandoverWait time.Duration
	// BrokerCheck is how often a consumer asks the brokers whether they still
	// know it, to resume at once after a broker restart (default 500ms).
	BrokerCheck time.Duration
}

func (c RocketMQConfig) validate() error {
	if len(c.NameServers) == 0 || c.Topic == "" || c.Group == "" || c.Instance == "" {
		return errors.New("mq: rocketmq needs name servers, topic, group and instance")
	}
	return nil
}

// CreateTopic creates topic with the given number of queues on brokerAddr (the
// queue count bounds consumer parallelism; per-key order holds for any count).
func CreateTopic(ctx context.Context, nameServers []string, brokerAddr, topic string, queues int) error {
	a, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver(nameServers)))
	if err != nil {
		return fmt.Errorf("mq: admin: %w", err)
	}
	defer a.Close()
	err = a.CreateTopic(ctx, admin.WithTopicCreate(topic), admin.WithBrokerAddrCreate(brokerAddr),
		admin.WithReadQueueNums(queues), admin.WithWriteQueueNums(queues))
	if err != nil {
		return fmt.Errorf("mq: create topic %s: %w", topic, err)
	}
	return nil
}

// RocketProducer sends through a hash queue selector on Message.Key, so one
// key always lands on one queue and keeps its order.
type RocketProducer struct {
	topic string
	p     rocketmq.Producer
	once  sync.Once
}

func NewRocketProducer(cfg RocketMQConfig) (*RocketProducer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	p, err := rocketmq.NewProducer(
		producer.WithNsResolver(primitive.NewPassthroughResolver(cfg.NameServers)),
		producer.WithGroupName(cfg.Group),
		producer.WithInstanceName(cfg.Instance),
		producer.WithQueueSelector(producer.NewHashQueueSelector()),
		producer.WithInterceptor(batchKey),
		producer.WithRetry(2),
		producer.WithSendMsgTimeout(3*time.Second),
	)
	if err != nil {
		return nil, fmt.Errorf("mq: producer: %w", err)
	}
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("mq: start producer: %w", err)
	}
	return &RocketProducer{topic: cfg.Topic, p: p}, nil
}

type batchKeyCtx struct{}

// batchKey gives a batch the sharding key of its messages: the client builds
// a new message for a batch and drops their properties, so without this the
// hash selector would pick a random queue and break the per-key order.
func batchKey(ctx context.Context, req, reply any, next primitive.Invoker) error {
	if m, ok := req.(*primitive.Message); ok && m.Batch {
		if key, ok := ctx.Value(batchKeyCtx{}).(string); ok {
			m.WithShardingKey(key)
		}
	}
	return next(ctx, req, reply)
}

func (r *RocketProducer) Send(ctx context.Context, msgs ...Message) error {
	if err := sameKey(msgs); err != nil {
		return err
	}
	out := make([]*primitive.Message, len(msgs))
	for i, msg := range msgs {
		m := primitive.NewMessage(r.topic, msg.Body)
		m.WithShardingKey(msg.Key)
		m.WithKeys([]string{msg.Key})
		out[i] = m
	}
	res, err := r.p.SendSync(context.WithValue(ctx, batchKeyCtx{}, msgs[0].Key), out...)
	if err != nil {
		return fmt.Errorf("mq: send: %w", err)
	}
	if res.Status != primitive.SendOK {
		return fmt.Errorf("mq: send: broker status %d", res.Status)
	}
	return nil
}

func (r *RocketProducer) Close() error {
	var err error
	r.once.Do(func() { err = r.p.Shutdown() })
	return err
}

// RocketConsumer is an orderly push consumer (clustering mode): each queue is
// locked to one consumer of the group and delivered in order. Around the
// client it hands queues over promptly when nodes join or leave, keeps its
// queue locks alive and applies a queue only while its lock holds, so that a
// node that died loses its queues within seconds (see queueGuard), and it
// replaces its client when a broker restarted and no longer knows it (see
// watch). The handler's context is cancelled when the consumer closes, or
// when the lock of the batch's queue can no longer be counted on.
type RocketConsumer struct {
	cfg   RocketMQConfig
	h     Handler
	guard *queueGuard
	// ctx is the handlers' context, cancelled by Close.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex // guards c and gen
	c       rocketmq.PushConsumer
	gen     int
	start   sync.Once
	stop    sync.Once
	started bool
	done    chan struct{} // closed by Close: stops watch
	watched sync.WaitGroup
}

func NewRocketConsumer(cfg RocketMQConfig, h Handler) (*RocketConsumer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 32
	}
	if cfg.Retry <= 0 {
		cfg.Retry = time.Second
	}
	if cfg.HandoverWait <= 0 {
		cfg.HandoverWait = 10 * time.Second
	}
	if cfg.BrokerCheck <= 0 {
		cfg.BrokerCheck = 500 * time.Millisecond
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &RocketConsumer{cfg: cfg, h: h, guard: newQueueGuard(cfg.NameServers, cfg.HandoverWait, max(leaseTTL, 4*cfg.BrokerCheck)),
		ctx: ctx, cancel: cancel, done: make(chan struct{})}
	c, err := r.newClient(0)
	if err != nil {
		cancel()
		return nil, err
	}
	r.c = c
	return r, nil
}

// leaseTTL is how long a check that found this consumer registered on a
// broker lets it apply that broker's queues (see queueGuard.begin): several
// BrokerCheck periods (at least 4), and shorter than a broker's restart plus
// the 3 s a new client waits before its first pull.
const leaseTTL = 3 * time.Second

// newClient builds client instance gen: its batches are applied only while
// gen is the guard's current instance.
func (r *RocketConsumer) newClient(gen int) (rocketmq.PushConsumer, error) {
	cfg := r.cfg
	c, err := rocketmq.NewPushConsumer(
		consumer.WithNsResolver(primitive.NewPassthroughResolver(cfg.NameServers)),
		consumer.WithGroupName(cfg.Group),
		consumer.WithInstance(cfg.Instance),
		consumer.WithConsumerModel(consumer.Clustering),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
		consumer.WithConsumerOrder(true),
		consumer.WithConsumeMessageBatchMaxSize(cfg.BatchSize),
		consumer.WithPullBatchSize(int32(4*cfg.BatchSize)),
		// Orderly mode: a failed batch must pause its queue and come back, not
		// go to a retry topic out of order (ConsumeRetryLater blocks the queue).
		consumer.WithSuspendCurrentQueueTimeMillis(cfg.Retry),
		consumer.WithStrategy(r.guard.allocate(gen)),
	)
	if err != nil {
		return nil, fmt.Errorf("mq: consumer: %w", err)
	}
	err = c.Subscribe(cfg.Topic, consumer.MessageSelector{}, func(ctx context.Context, ext ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		oc, ok := primitive.GetOrderlyCtx(ctx)
		if !ok {
			return consumer.SuspendCurrentQueueAMoment, errors.New("mq: delivery without its queue")
		}
		hctx, ok := r.guard.begin(r.ctx, gen, oc.MQ)
		if !ok {
			// The queue is no longer this node's, its lock was not renewed
			// in time (or the batch before it, of the client this one
			// replaced, is still being applied).
			return consumer.SuspendCurrentQueueAMoment, nil
		}
		defer r.guard.end(oc.MQ)
		msgs := make([]Message, len(ext))
		for i, m := range ext {
			msgs[i] = Message{Key: m.GetShardingKey(), Body: m.Body, ID: m.MsgId}
		}
		if err := r.h(hctx, msgs); err != nil {
			return consumer.SuspendCurrentQueueAMoment, err
		}
		return consumer.ConsumeSuccess, nil
	})
	if err != nil {
		_ = c.Shutdown()
		return nil, fmt.Errorf("mq: subscribe %s: %w", cfg.Topic, err)
	}
	return c, nil
}

func (r *RocketConsumer) Start() error {
	var err error
	r.start.Do(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		select {
		case <-r.done:
			return // a Start after Close does nothing
		default:
		}
		err = r.c.Start()
		r.started = err == nil
		if r.started {
			r.watched.Add(2)
			go r.watch()
			go func() {
				defer r.watched.Done()
				r.guard.keepLocks(r.done)
			}()
		}
	})
	return err
}

// watch asks the brokers every BrokerCheck whether they still count this
// consumer in its group, and replaces the client when one is back after it
// could not be reached, or answers without knowing this consumer. A broker
// that restarted has forgotten every consumer and refuses their pulls until
// their next heartbeat (the client sends one every 30 s), and each pull the
// client had in flight when the connection broke waits out its 30 s timeout
// (the client fails no request when its connection closes). A new client
// registers, rebalances and pulls at once.
func (r *RocketConsumer) watch() {
	defer r.watched.Done()
	t := time.NewTicker(r.cfg.BrokerCheck)
	defer t.Stop()
	wasDown, due := false, false
	for {
		select {
		case <-r.done:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(r.ctx, 3*time.Second)
		forgotten, unreachable := r.guard.brokers(ctx, r.cfg.Topic)
		due = due || forgotten || (wasDown && !unreachable) || r.client() == nil
		wasDown = unreachable
		// A new client cannot start before the name servers route the topic
		// again (a RocketMQ 5.3.3 broker can lose the race between its first
		// registration and its connection to the name servers, and is then
		// routed only by its periodic registration, 10 s after its start:
		// docs/faults.md): until then the old one is kept, and replaced
		// once they do.
		if due && !unreachable && r.guard.routed(ctx, r.cfg.Topic) {
			due = !r.replace()
		}
		cancel()
	}
}

func (r *RocketConsumer) client() rocketmq.PushConsumer {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.c
}

// replace stops the client (once its batches in flight ended) and starts a
// new one, and says whether it did; if not, watch tries again.
func (r *RocketConsumer) replace() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.done:
		return true
	default:
	}
	r.gen = r.guard.retire()
	if r.c != nil {
		r.guard.waitIdle()
		shutdown(r.c)
		r.c = nil
	}
	c, err := r.newClient(r.gen)
	if err != nil {
		return false
	}
	if err := c.Start(); err != nil {
		_ = c.Shutdown()
		return false
	}
	r.c = c
	return true
}

// shutdown stores the client's offsets before the client's Shutdown, which
// unlocks its queues first and stores them after: the next owner then starts
// where this one stopped rather than a few seconds back.
func shutdown(c rocketmq.PushConsumer) error {
	if p, ok := c.(interface{ PersistConsumerOffset() error }); ok {
		_ = p.PersistConsumerOffset()
	}
	return c.Shutdown()
}

// Close stops delivery, cancels the handlers' context and waits for the
// batches in flight, then stops the client (which unlocks its queues for
// the next owner); safe before Start and more than once.
func (r *RocketConsumer) Close() error {
	var err error
	r.stop.Do(func() {
		close(r.done)
		r.guard.close()
		r.cancel()
		r.watched.Wait()
		r.guard.waitIdle()
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.started && r.c != nil {
			err = shutdown(r.c)
		}
		r.c = nil
	})
	return err
}
