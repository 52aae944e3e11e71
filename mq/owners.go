package mq

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
)

// QueueOf returns the id of the queue RocketProducer sends key's messages
// to, on a topic of queues queues held by one broker: its hash selector takes
// the FNV-1a hash of the key modulo the number of queues, listed in id order.
func QueueOf(key string, queues int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	q := int(h.Sum32()) % queues
	if q < 0 {
		q = -q
	}
	return q
}

// QueueOwners returns, by queue id, the client id of the consumer of group
// that each queue of topic is allocated to, computed as the consumers
// compute it at their rebalance (AllocateByAveragely over the group's
// consumers as the broker lists them): which consumer applies a queue once
// the group has settled. A client id ends in "@" and the consumer's instance
// name (RocketMQConfig.Instance). The topic must be held by one broker.
func QueueOwners(ctx context.Context, nameServers []string, topic, group string) (map[int]string, error) {
	masters, err := topicMasters(ctx, nameServers, topic)
	if err != nil {
		return nil, err
	}
	if len(masters) != 1 {
		return nil, fmt.Errorf("mq: topic %s is on %d brokers, not one", topic, len(masters))
	}
	var name, addr string
	for name, addr = range masters {
	}
	queues, err := readQueues(ctx, nameServers, topic, name)
	if err != nil {
		return nil, err
	}
	rc, remark, body, err := call(ctx, addr, reqGetConsumerListByGroup, map[string]string{"consumerGroup": group}, nil)
	if err == nil && rc != resSuccess {
		err = fmt.Errorf("broker %s: consumers of %s: code %d: %s", addr, group, rc, remark)
	}
	if err != nil {
		return nil, err
	}
	var list struct {
		IDs []string `json:"consumerIdList"`
	}
	if err := decodeBody(body, &list); err != nil {
		return nil, err
	}
	slices.Sort(list.IDs)
	var all []*primitive.MessageQueue
	for i := range queues {
		all = append(all, &primitive.MessageQueue{Topic: topic, BrokerName: name, QueueId: i})
	}
	owners := map[int]string{}
	for _, cid := range list.IDs {
		for _, q := range consumer.AllocateByAveragely(group, cid, all, list.IDs) {
			owners[q.QueueId] = cid
		}
	}
	return owners, nil
}

// readQueues returns how many queues consumers read of topic on broker.
func readQueues(ctx context.Context, nameServers []string, topic, broker string) (int, error) {
	lastErr := fmt.Errorf("no name server routes topic %s", topic)
	for _, ns := range nameServers {
		code, remark, body, err := invoke(ctx, ns, reqGetRouteInfoByTopic, map[string]string{"topic": topic})
		if err == nil && code != resSuccess {
			err = fmt.Errorf("name server %s: route query: code %d: %s", ns, code, remark)
		}
		var route struct {
			QueueDatas []struct {
				BrokerName    string `json:"brokerName"`
				ReadQueueNums int    `json:"readQueueNums"`
			} `json:"queueDatas"`
		}
		if err == nil {
			err = decodeBody(body, &route)
		}
		if err != nil {
			lastErr = err
			continue
		}
		for _, q := range route.QueueDatas {
			if q.BrokerName == broker {
				return q.ReadQueueNums, nil
			}
		}
	}
	return 0, lastErr
}
