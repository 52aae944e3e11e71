package testenv

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/acme/inventory/mq"
)

var instances atomic.Int64

// RocketMQ creates a fresh topic of 8 queues on the real broker and returns a
// producer on it and a factory of consumers in one group (a new consumer
// resumes where the group left off). Everything is closed when the test ends.
func RocketMQ(t testing.TB) (mq.Producer, func(h mq.Handler) mq.Consumer) {
	t.Helper()
	ns := []string{RocketMQNamesrv()}
	topic := Unique("t")
	if err := mq.CreateTopic(context.Background(), ns, RocketMQBroker(), topic, 8); err != nil {
		t.Fatalf("testenv: a real RocketMQ broker at %s is required (run `make up`): %v", RocketMQBroker(), err)
	}
	instance := func() string { return fmt.Sprintf("%s_%d", topic, instances.Add(1)) }
	p, err := mq.NewRocketProducer(mq.RocketMQConfig{NameServers: ns, Topic: topic, Group: topic + "_p", Instance: instance()})
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p, func(h mq.Handler) mq.Consumer {
		c, err := mq.NewRocketConsumer(mq.RocketMQConfig{
			NameServers: ns, Topic: topic, Group: topic + "_c", Instance: instance(), Retry: 200 * time.Millisecond,
		}, h)
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
}
