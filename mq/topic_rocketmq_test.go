//go:build !race

package mq_test

import (
	"context"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/admin"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/mq"
	"github.com/acme/inventory/testkit/testenv"
)

// publishQueues counts the queues the name server routes topic to.
func publishQueues(t *testing.T, ns []string, topic string) int {
	t.Helper()
	a, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver(ns)))
	require.NoError(t, err)
	defer a.Close()
	qs, err := a.FetchPublishMessageQueues(context.Background(), topic)
	require.NoError(t, err)
	return len(qs)
}

// A missing topic is created on the broker found through the name server, is
// routed as soon as EnsureTopic returns (a consumer can subscribe: this is
// what failed against a fresh broker), and a second call changes nothing.
func TestEnsureTopicRocketMQ(t *testing.T) {
	ctx := context.Background()
	ns := []string{testenv.RocketMQNamesrv()}
	topic := testenv.Unique("ensure")

	exists, err := mq.TopicExists(ctx, ns, topic)
	require.NoError(t, err)
	require.False(t, exists)

	created, err := mq.EnsureTopic(ctx, ns, topic, mq.DefaultQueues)
	require.NoError(t, err)
	require.True(t, created)
	exists, err = mq.TopicExists(ctx, ns, topic)
	require.NoError(t, err)
	require.True(t, exists)
	require.Equal(t, mq.DefaultQueues, publishQueues(t, ns, topic))

	// Subscribe before anything is sent: without the topic this Start fails.
	got := make(chan mq.Message, 1)
	c, err := mq.NewRocketConsumer(mq.RocketMQConfig{NameServers: ns, Topic: topic, Group: topic + "_c", Instance: topic + "_c"},
		func(_ context.Context, msgs []mq.Message) error {
			for _, m := range msgs {
				got <- m
			}
			return nil
		})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.Start())
	p, err := mq.NewRocketProducer(mq.RocketMQConfig{NameServers: ns, Topic: topic, Group: topic + "_p", Instance: topic + "_p"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	require.NoError(t, p.Send(ctx, mq.Message{Key: "TEE", Body: []byte("TEE:1")}))
	select {
	case m := <-got:
		require.Equal(t, "TEE", m.Key)
		require.Equal(t, "TEE:1", string(m.Body))
	case <-time.After(90 * time.Second):
		t.Fatal("the message never arrived")
	}

	created, err = mq.EnsureTopic(ctx, ns, topic, mq.DefaultQueues)
	require.NoError(t, err)
	require.False(t, created)
}

// A topic that exists keeps its queue count: EnsureTopic never resizes it.
func TestEnsureTopicKeepsExistingRocketMQ(t *testing.T) {
	ctx := context.Background()
	ns := []string{testenv.RocketMQNamesrv()}
	topic := testenv.Unique("keep")
	require.NoError(t, mq.CreateTopic(ctx, ns, testenv.RocketMQBroker(), topic, 2))
	require.Eventually(t, func() bool {
		exists, err := mq.TopicExists(ctx, ns, topic)
		return err == nil && exists
	}, 30*time.Second, 100*time.Millisecond)

	created, err := mq.EnsureTopic(ctx, ns, topic, mq.DefaultQueues)
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, 2, publishQueues(t, ns, topic))
}
