// Tests over the real RocketMQ client, which has data races of its own (see
// mq/rocketmq_test.go): they run in scripts/test.sh's second pass, without
// -race. The same scenarios run under -race on the in-process queue.

//go:build !race

package order

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/testenv"
	"github.com/acme/inventory/mq"
)

func rocketTransport(t *testing.T) transport {
	p, consumer := testenv.RocketMQ(t)
	return transport{producer: p, consumer: func(_ testing.TB, h mq.Handler) mq.Consumer { return consumer(h) }}
}

func TestEndToEndRocketMQ(t *testing.T) { endToEnd(t, rocketTransport(t)) }

// The consumer is shut down in the middle of the stream and a new one of the
// same group takes over: nothing lost, nothing applied twice.
func TestConsumerRestartRocketMQ(t *testing.T) {
	r := newRig(t, rocketTransport(t))
	ctx := context.Background()
	r.addSKU("A", 1000)
	const orders = 200
	for i := 0; i < orders; i++ {
		o, err := r.svc.Create(ctx, fmt.Sprintf("u%d", i), "", line("A", 2))
		require.NoError(t, err)
		_, err = r.svc.Pay(ctx, o.ID, fmt.Sprintf("pay-%d", i))
		require.NoError(t, err)
	}
	var seen atomic.Int64
	half := make(chan struct{})
	first := r.tr.consumer(t, func(ctx context.Context, msgs []mq.Message) error {
		if err := r.applier.Handle(ctx, msgs); err != nil {
			return err
		}
		if seen.Add(int64(len(msgs))) >= orders/2 {
			select {
			case <-half:
			default:
				close(half)
			}
		}
		return nil
	})
	require.NoError(t, first.Start())
	r.relay.Start(ctx)
	defer r.relay.Stop()
	<-half
	require.NoError(t, first.Close())

	second := r.tr.consumer(t, r.applier.Handle)
	require.NoError(t, second.Start())
	defer second.Close()
	r.waitApplied()
	r.requireQty("A", 1000-2*orders, 0)
	require.EqualValues(t, orders, r.count(`SELECT COUNT(*) FROM stock_reservations WHERE state = 'SOLD'`))
	require.EqualValues(t, orders, r.count(`SELECT COUNT(*) FROM stock_ledger`))
	r.checkInvariant("A")
	t.Logf("consumer restart: %d applied, %d redeliveries absorbed", r.applier.Applied.Load(), r.applier.Duplicate.Load())
}
