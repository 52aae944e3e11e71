package mq

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"sort"
	"time"
)

// DefaultQueues is the queue count the service's topic is created with: it
// bounds how many consumers share the work (per-key order holds for any count).
const DefaultQueues = 8

// topicWait bounds EnsureTopic: a name server and broker started together
// with the service (docker compose) take some seconds to register.
const topicWait = time.Minute

// EnsureTopic creates topic, with queues read and write queues, on every
// master broker the name servers know, unless a name server already routes
// it: an existing topic is left as it is (its queues are never changed). It
// returns once every name server that answers routes the topic to each of
// those brokers, because a consumer that subscribes before that fails with
// "route info not found". created says whether it created the topic.
func EnsureTopic(ctx context.Context, nameServers []string, topic string, queues int) (created bool, err error) {
	if len(nameServers) == 0 || topic == "" || queues <= 0 {
		return false, errors.New("mq: ensure topic needs name servers, a topic and a queue count")
	}
	ctx, cancel := context.WithTimeout(ctx, topicWait)
	defer cancel()
	var masters map[string]string
	err = poll(ctx, func() error {
		exists, err := routed(ctx, nameServers, topic)
		if err != nil || exists {
			return err
		}
		masters, err = masterBrokers(ctx, nameServers)
		return err
	})
	if err != nil || masters == nil {
		return false, wrapTopic(topic, err)
	}
	names := make([]string, 0, len(masters))
	for name := range masters {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := CreateTopic(ctx, nameServers, masters[name], topic, queues); err != nil {
			return false, err
		}
	}
	// The broker registers the new topic with the name servers right away;
	// wait for it rather than let the caller's consumer race it.
	err = poll(ctx, func() error {
		views, err := routes(ctx, nameServers, topic)
		if err != nil {
			return err
		}
		for _, brokers := range views {
			for _, name := range names {
				if !brokers[name] {
					return fmt.Errorf("broker %s does not route it yet", name)
				}
			}
		}
		return nil
	})
	return true, wrapTopic(topic, err)
}

// EnsureServiceTopic is EnsureTopic for service start-up, so that a user who
// skipped `inventoryd migrate` gets the topic instead of a consumer that
// cannot subscribe; a failure says what to run.
func EnsureServiceTopic(ctx context.Context, nameServers []string, topic string) error {
	if _, err := EnsureTopic(ctx, nameServers, topic, DefaultQueues); err != nil {
		return fmt.Errorf("%w (create the topic with `inventoryd migrate`)", err)
	}
	return nil
}

// TopicExists reports whether any of the name servers routes topic.
func TopicExists(ctx context.Context, nameServers []string, topic string) (bool, error) {
	exists, err := routed(ctx, nameServers, topic)
	return exists, wrapTopic(topic, err)
}

func routed(ctx context.Context, nameServers []string, topic string) (bool, error) {
	views, err := routes(ctx, nameServers, topic)
	for _, brokers := range views {
		if len(brokers) > 0 {
			return true, nil
		}
	}
	return false, err
}

func wrapTopic(topic string, err error) error {
	if err != nil {
		return fmt.Errorf("mq: topic %s: %w", topic, err)
	}
	return nil
}

// poll runs f until it succeeds or ctx ends, and then returns f's last error.
func poll(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// The admin API of rocketmq-client-go v2 neither lists brokers nor reports a
// missing route as such, and its remoting client is internal, so the two name
// server queries below speak the remoting protocol themselves: a frame is its
// length, the JSON header's length, the header and the body.
const (
	reqGetRouteInfoByTopic  = 105
	reqGetBrokerClusterInfo = 106
	resSuccess              = 0
	resTopicNotExist        = 17
	masterID                = "0" // brokerAddrs key of a broker set's master
)

// routes asks each name server which brokers hold queues of topic: one set of
// broker names per name server that answered (empty when it has no route). It
// fails only when none answered.
func routes(ctx context.Context, nameServers []string, topic string) ([]map[string]bool, error) {
	var views []map[string]bool
	var lastErr error
	for _, ns := range nameServers {
		code, remark, body, err := invoke(ctx, ns, reqGetRouteInfoByTopic, map[string]string{"topic": topic})
		switch {
		case err != nil:
			lastErr = err
			continue
		case code == resTopicNotExist:
			views = append(views, map[string]bool{})
			continue
		case code != resSuccess:
			lastErr = fmt.Errorf("name server %s: route query: code %d: %s", ns, code, remark)
			continue
		}
		var route struct {
			QueueDatas []struct {
				BrokerName string `json:"brokerName"`
			} `json:"queueDatas"`
		}
		if err := decodeBody(body, &route); err != nil {
			lastErr = fmt.Errorf("name server %s: route: %w", ns, err)
			continue
		}
		brokers := map[string]bool{}
		for _, q := range route.QueueDatas {
			brokers[q.BrokerName] = true
		}
		views = append(views, brokers)
	}
	if len(views) == 0 {
		return nil, lastErr
	}
	return views, nil
}

// topicMasters returns the address of each master broker that holds queues
// of topic, by broker name, from the route of the first name server that
// has one.
func topicMasters(ctx context.Context, nameServers []string, topic string) (map[string]string, error) {
	lastErr := fmt.Errorf("no name server routes topic %s", topic)
	for _, ns := range nameServers {
		code, remark, body, err := invoke(ctx, ns, reqGetRouteInfoByTopic, map[string]string{"topic": topic})
		if err == nil && code != resSuccess {
			err = fmt.Errorf("name server %s: route query: code %d: %s", ns, code, remark)
		}
		var route struct {
			BrokerDatas []struct {
				BrokerName  string            `json:"brokerName"`
				BrokerAddrs map[string]string `json:"brokerAddrs"`
			} `json:"brokerDatas"`
		}
		if err == nil {
			err = decodeBody(body, &route)
		}
		if err != nil {
			lastErr = err
			continue
		}
		masters := map[string]string{}
		for _, b := range route.BrokerDatas {
			if addr := b.BrokerAddrs[masterID]; addr != "" {
				masters[b.BrokerName] = addr
			}
		}
		if len(masters) > 0 {
			return masters, nil
		}
	}
	return nil, lastErr
}

// masterBrokers returns the address of each master broker, by broker name,
// from the cluster info of the first name server that answers.
func masterBrokers(ctx context.Context, nameServers []string) (map[string]string, error) {
	var lastErr error
	for _, ns := range nameServers {
		code, remark, body, err := invoke(ctx, ns, reqGetBrokerClusterInfo, nil)
		if err == nil && code != resSuccess {
			err = fmt.Errorf("name server %s: cluster info: code %d: %s", ns, code, remark)
		}
		var info struct {
			BrokerAddrTable map[string]struct {
				BrokerAddrs map[string]string `json:"brokerAddrs"`
			} `json:"brokerAddrTable"`
		}
		if err == nil {
			err = decodeBody(body, &info)
		}
		if err != nil {
			lastErr = err
			continue
		}
		masters := map[string]string{}
		for name, b := range info.BrokerAddrTable {
			if addr := b.BrokerAddrs[masterID]; addr != "" {
				masters[name] = addr
			}
		}
		if len(masters) == 0 {
			lastErr = fmt.Errorf("no master broker is registered with name server %s (is the broker running?)", ns)
			continue
		}
		return masters, nil
	}
	return nil, lastErr
}

// intKey matches the unquoted integer map keys of the broker's JSON
// (fastjson writes brokerAddrs as {0:"host:port"}).
var intKey = regexp.MustCompile(`([{,])(-?\d+):`)

func decodeBody(body []byte, v any) error {
	return json.Unmarshal(intKey.ReplaceAll(body, []byte(`$1"$2":`)), v)
}

// invoke sends one request to the name server at addr and reads its
// response on a connection of its own.
func invoke(ctx context.Context, addr string, code int, ext map[string]string) (int, string, []byte, error) {
	c, remark, body, err := call(ctx, addr, code, ext, nil)
	if err != nil {
		return 0, "", nil, fmt.Errorf("name server %s: %w", addr, err)
	}
	return c, remark, body, nil
}

// call sends one remoting request (code, extension fields, body) to addr and
// reads its response on a connection of its own.
func call(ctx context.Context, addr string, code int, ext map[string]string, body []byte) (int, string, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, "", nil, err
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)

	header, err := json.Marshal(map[string]any{
		"code": code, "language": "GO", "version": 317, "opaque": 1, "flag": 0, "extFields": ext,
	})
	if err != nil {
		return 0, "", nil, err
	}
	frame := binary.BigEndian.AppendUint32(nil, uint32(4+len(header)+len(body)))
	frame = binary.BigEndian.AppendUint32(frame, uint32(len(header))) // high byte 0: JSON header
	frame = append(append(frame, header...), body...)
	if _, err := conn.Write(frame); err != nil {
		return 0, "", nil, err
	}

	var size [4]byte
	if _, err := io.ReadFull(conn, size[:]); err != nil {
		return 0, "", nil, err
	}
	n := binary.BigEndian.Uint32(size[:])
	if n < 4 || n > 16<<20 {
		return 0, "", nil, fmt.Errorf("bad frame length %d", n)
	}
	frame = make([]byte, n)
	if _, err := io.ReadFull(conn, frame); err != nil {
		return 0, "", nil, err
	}
	hlen := binary.BigEndian.Uint32(frame) & 0xFFFFFF
	if frame[0] != 0 || hlen > n-4 {
		return 0, "", nil, errors.New("response is not a JSON-header frame")
	}
	var resp struct {
		Code   int    `json:"code"`
		Remark string `json:"remark"`
	}
	if err := json.Unmarshal(frame[4:4+hlen], &resp); err != nil {
		return 0, "", nil, err
	}
	return resp.Code, resp.Remark, frame[4+hlen:], nil
}
