package mq_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/mq"
)

// With no name server answering, EnsureTopic gives up when its context ends
// and says why (the start-up variant also says what to run).
func TestEnsureTopicUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	created, err := mq.EnsureTopic(ctx, []string{"127.0.0.1:1"}, "inventory_stock", mq.DefaultQueues)
	require.False(t, created)
	require.ErrorContains(t, err, "mq: topic inventory_stock: name server 127.0.0.1:1: dial")
	require.Less(t, time.Since(start), 5*time.Second)

	ctx, cancel = context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err = mq.EnsureServiceTopic(ctx, []string{"127.0.0.1:1"}, "inventory_stock")
	require.ErrorContains(t, err, "inventoryd migrate")
}
