package mq_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/mq"
)

// transport is one implementation under the contract: a producer and a way to
// start consumers of one group on one topic.
type transport struct {
	producer mq.Producer
	consumer func(t *testing.T, h mq.Handler) mq.Consumer
}

// collector records per-key sequences and signals when want messages came.
type collector struct {
	mu   sync.Mutex
	got  map[string][]int
	n    int
	want int
	done chan struct{}
}

func newCollector(want int) *collector {
	return &collector{got: map[string][]int{}, want: want, done: make(chan struct{})}
}

func (c *collector) add(t *testing.T, m mq.Message) {
	key, seq, ok := strings.Cut(string(m.Body), ":")
	if !ok || key != m.Key {
		t.Errorf("message %q arrived with key %q", m.Body, m.Key)
		return
	}
	n, _ := strconv.Atoi(seq)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got[key] = append(c.got[key], n)
	c.n++
	if c.n == c.want {
		close(c.done)
	}
}

func (c *collector) wait(t *testing.T) map[string][]int {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(90 * time.Second):
		c.mu.Lock()
		defer c.mu.Unlock()
		t.Fatalf("received %d of %d messages", c.n, c.want)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.got
}

// collect starts a consumer that hands every message to col.
func collect(t *testing.T, tr transport, col *collector) mq.Consumer {
	t.Helper()
	c := tr.consumer(t, func(_ context.Context, msgs []mq.Message) error {
		for _, m := range msgs {
			col.add(t, m)
		}
		return nil
	})
	require.NoError(t, c.Start())
	return c
}

func send(t *testing.T, p mq.Producer, keys, perKey int) {
	t.Helper()
	for i := 0; i < perKey; i++ {
		for k := 0; k < keys; k++ {
			key := fmt.Sprintf("SKU-%d", k)
			require.NoError(t, p.Send(context.Background(), mq.Message{Key: key, Body: []byte(fmt.Sprintf("%s:%d", key, i))}))
		}
	}
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// 1,000 messages over 10 keys reach the consumer with every key's order
// intact, none lost, none duplicated.
func contractOrderedPerKey(t *testing.T, tr transport) {
	const keys, perKey = 10, 100
	col := newCollector(keys * perKey)
	defer collect(t, tr, col).Close()
	send(t, tr.producer, keys, perKey)
	got := col.wait(t)
	require.Len(t, got, keys)
	for key, s := range got {
		require.Equal(t, seq(perKey), s, "order of %s", key)
	}
}

// A handler error redelivers the same messages, in order, before anything
// behind them on their queue.
func contractRedeliveryAfterFailure(t *testing.T, tr transport) {
	const keys, perKey = 3, 20
	col := newCollector(keys * perKey)
	var mu sync.Mutex
	failed := map[string]bool{}
	c := tr.consumer(t, func(_ context.Context, msgs []mq.Message) error {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range msgs {
			if strings.HasSuffix(string(m.Body), ":7") && !failed[m.Key] {
				failed[m.Key] = true
				return errors.New("transient")
			}
		}
		for _, m := range msgs {
			col.add(t, m)
		}
		return nil
	})
	require.NoError(t, c.Start())
	defer c.Close()
	send(t, tr.producer, keys, perKey)
	got := col.wait(t)
	for key, s := range got {
		require.Equal(t, seq(perKey), s, "order of %s after a failed batch", key)
	}
}

// Batches keep their order, and their key's order with single sends.
func contractBatches(t *testing.T, tr transport) {
	const keys, perKey = 4, 60
	col := newCollector(keys * perKey)
	defer collect(t, tr, col).Close()
	for k := 0; k < keys; k++ {
		key := fmt.Sprintf("SKU-%d", k)
		for i := 0; i < perKey; {
			n := 1 + (i+k)%7 // batches of 1 to 7, interleaved with the other keys
			var batch []mq.Message
			for j := 0; j < n && i < perKey; j++ {
				batch = append(batch, mq.Message{Key: key, Body: []byte(fmt.Sprintf("%s:%d", key, i))})
				i++
			}
			require.NoError(t, tr.producer.Send(context.Background(), batch...))
		}
	}
	require.Error(t, tr.producer.Send(context.Background(), mq.Message{Key: "a"}, mq.Message{Key: "b"}), "one key per batch")
	got := col.wait(t)
	for key, s := range got {
		require.Equal(t, seq(perKey), s, "order of %s across batches", key)
	}
}

func runContract(t *testing.T, tr func(t *testing.T) transport) {
	t.Run("ordered per key", func(t *testing.T) { contractOrderedPerKey(t, tr(t)) })
	t.Run("batches", func(t *testing.T) { contractBatches(t, tr(t)) })
	t.Run("redelivery after failure", func(t *testing.T) { contractRedeliveryAfterFailure(t, tr(t)) })
}

func TestMemoryContract(t *testing.T) {
	runContract(t, func(t *testing.T) transport {
		m := mq.NewMemory(8)
		return transport{
			producer: m.Producer(),
			consumer: func(t *testing.T, h mq.Handler) mq.Consumer { return m.Consumer(h, 32, 20*time.Millisecond) },
		}
	})
}

func TestMemoryResumesFromCommitted(t *testing.T) {
	m := mq.NewMemory(4)
	send(t, m.Producer(), 2, 10)
	first := newCollector(20)
	c := m.Consumer(func(_ context.Context, msgs []mq.Message) error {
		for _, msg := range msgs {
			first.add(t, msg)
		}
		return nil
	}, 5, time.Millisecond)
	require.NoError(t, c.Start())
	first.wait(t)
	require.NoError(t, c.Close())
	require.NoError(t, c.Close())
	require.Zero(t, m.Pending())

	send(t, m.Producer(), 2, 1) // sequence numbers restart at 0 for the new batch
	second := newCollector(2)
	c2 := m.Consumer(func(_ context.Context, msgs []mq.Message) error {
		for _, msg := range msgs {
			second.add(t, msg)
		}
		return nil
	}, 5, time.Millisecond)
	require.NoError(t, c2.Start())
	defer c2.Close()
	got := second.wait(t)
	require.Equal(t, map[string][]int{"SKU-0": {0}, "SKU-1": {0}}, got, "a new consumer sees only what was not acknowledged")
}
