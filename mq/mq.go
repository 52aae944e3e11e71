// Package mq carries stock operations from the payment path to the database
// consumer over a queue that keeps per-key order (the key is the SKU). It hides
// RocketMQ behind two small interfaces so the embedded default can run an
// in-process queue under the same contract.
package mq

import (
	"context"
	"errors"
)

// Message is one entry of an ordered topic.
type Message struct {
	// Key orders delivery: messages with the same key reach the handler in send
	// order. The stock sync uses the SKU.
	Key  string
	Body []byte
	// ID is set on delivery: the broker's message id.
	ID string
}

// Producer publishes messages in per-key order.
type Producer interface {
	// Send publishes msgs, which must share one Key, in one request, in
	// order, and returns once the broker has stored them all.
	Send(ctx context.Context, msgs ...Message) error
	Close() error
}

// Handler receives consecutive messages of one queue, in order (one queue
// carries many keys; a key never spans queues). A nil return acknowledges all
// of them. An error acknowledges none: the same messages come back, in the same
// order, after a pause, and nothing behind them on that queue is delivered
// first. Delivery is at least once, so handlers must be idempotent.
type Handler func(ctx context.Context, msgs []Message) error

// Consumer delivers a topic to a Handler until closed.
type Consumer interface {
	Start() error
	Close() error
}

// sameKey checks a batch for Send.
func sameKey(msgs []Message) error {
	if len(msgs) == 0 {
		return errors.New("mq: nothing to send")
	}
	for _, m := range msgs[1:] {
		if m.Key != msgs[0].Key {
			return errors.New("mq: a batch must share one key")
		}
	}
	return nil
}
