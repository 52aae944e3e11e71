// rocketmq-client-go v2.1.2 has data races inside its own consumer
// (processQueue.takeMessages reads the message tree without its lock:
// apache/rocketmq-client-go#1213, unfixed upstream), which the race detector
// reports and cannot suppress. Tests that drive the real client therefore run
// in scripts/test.sh's second pass, without -race; our own concurrent code is
// tested under -race elsewhere (on the in-process queue, same contract).

//go:build !race

package mq_test

import (
	"testing"

	"github.com/acme/inventory/mq"
	"github.com/acme/inventory/testkit/testenv"
)

func TestRocketMQContract(t *testing.T) {
	runContract(t, func(t *testing.T) transport {
		p, consumer := testenv.RocketMQ(t)
		return transport{producer: p, consumer: func(_ *testing.T, h mq.Handler) mq.Consumer { return consumer(h) }}
	})
}
