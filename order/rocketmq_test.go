// Tests over the real RocketMQ client, which has data races of its own (see
// mq/rocketmq_test.go): they run in scripts/test.sh's second pass, without
// -race. The same scenarios run under -race on the in-process queue.

//go:build !race

package order_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/mq"
	"github.com/acme/inventory/testkit/testenv"
	"github.com/acme/inventory/testkit/testrig"
)

func rocketTransport(t *testing.T) testrig.Transport {
	p, consumer := testenv.RocketMQ(t)
	return testrig.Transport{Producer: p, Consumer: func(_ testing.TB, h mq.Handler) mq.Consumer { return consumer(h) }}
}

func TestEndToEndRocketMQ(t *testing.T) { endToEnd(t, rocketTransport(t)) }

// The consumer is shut down in the middle of the stream and a new one of the
// same group takes over: nothing lost, nothing applied twice.
func TestConsumerRestartRocketMQ(t *testing.T) {
	r := testrig.New(t, rocketTransport(t))
	ctx := context.Background()
	r.AddSKU("A", 1000)
	const orders = 200
	for i := 0; i < orders; i++ {
		o, err := r.Orders.Create(ctx, fmt.Sprintf("u%d", i), "", testrig.Line("A", 2))
		require.NoError(t, err)
		_, err = r.Orders.Pay(ctx, o.ID, fmt.Sprintf("pay-%d", i))
		require.NoError(t, err)
	}
	var seen atomic.Int64
	half := make(chan struct{})
	first := r.Transport.Consumer(t, func(ctx context.Context, msgs []mq.Message) error {
		if err := r.Applier.Handle(ctx, msgs); err != nil {
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
	r.Relay.Start(ctx)
	defer r.Relay.Stop()
	<-half
	require.NoError(t, first.Close())

	second := r.Transport.Consumer(t, r.Applier.Handle)
	require.NoError(t, second.Start())
	defer second.Close()
	r.WaitApplied()
	r.RequireQty("A", 1000-2*orders, 0)
	require.EqualValues(t, orders, r.Count(`SELECT COUNT(*) FROM stock_reservations WHERE state = 'SOLD'`))
	require.EqualValues(t, orders, r.Count(`SELECT COUNT(*) FROM stock_ledger`))
	r.CheckInvariant("A")
	t.Logf("consumer restart: %d applied, %d redeliveries absorbed", r.Applier.Applied.Load(), r.Applier.Duplicate.Load())
}
