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
// locked to one consumer of the group and delivered in order.
type RocketConsumer struct {
	c       rocketmq.PushConsumer
	start   sync.Once
	stop    sync.Once
	started bool
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
	)
	if err != nil {
		return nil, fmt.Errorf("mq: consumer: %w", err)
	}
	err = c.Subscribe(cfg.Topic, consumer.MessageSelector{}, func(ctx context.Context, ext ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		msgs := make([]Message, len(ext))
		for i, m := range ext {
			msgs[i] = Message{Key: m.GetShardingKey(), Body: m.Body, ID: m.MsgId}
		}
		if err := h(ctx, msgs); err != nil {
			return consumer.SuspendCurrentQueueAMoment, err
		}
		return consumer.ConsumeSuccess, nil
	})
	if err != nil {
		return nil, fmt.Errorf("mq: subscribe %s: %w", cfg.Topic, err)
	}
	return &RocketConsumer{c: c}, nil
}

func (r *RocketConsumer) Start() error {
	var err error
	r.start.Do(func() {
		err = r.c.Start()
		r.started = err == nil
	})
	return err
}

// Close stops delivery; safe before Start and more than once.
func (r *RocketConsumer) Close() error {
	var err error
	r.stop.Do(func() {
		if r.started {
			err = r.c.Shutdown()
		}
	})
	return err
}
