// Package faultnet is a network that can fail: links to a server (MariaDB,
// Redis, the RocketMQ broker) through a Toxiproxy proxy
// (github.com/Shopify/toxiproxy/v2) run inside the process, which a fault
// run (cmd/faults) or a test can cut (a blackhole), slow down or narrow, and
// heal, while the servers themselves keep running. Loopback only.
package faultnet

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// holdToxic is a blackhole as a dead switch makes one: no byte flows either
// way, no connection is closed or reset, and what was sent meanwhile is held
// (the sender's goroutine blocks, TCP's buffers fill, the sender stalls) and
// delivered once the link heals, as TCP's retransmissions would deliver it.
//
// Toxiproxy's own "timeout" toxic with timeout 0 is not that: it drops
// every byte on the floor while it is on (the streams are corrupt after
// the heal) and closes every connection that crossed it when it is removed
// (its Cleanup), so a client that recovers only because its connections
// were reset would pass under it and fail under a real partition.
type holdToxic struct{}

// Pipe reads nothing: the previous stage blocks on its send into this
// stage's unbuffered input. When the toxic is removed, Toxiproxy forwards
// the pending chunk and splices the chain, and the bytes flow again.
func (holdToxic) Pipe(stub *toxics.ToxicStub) { <-stub.Interrupt }

func init() {
	toxics.Register("hold", new(holdToxic))
	zerolog.SetGlobalLevel(zerolog.Disabled) // Toxiproxy's toxics log through the global logger
}

// Toxiproxy is the proxy server of a run; its proxies are the links.
type Toxiproxy struct {
	srv *toxiproxy.ApiServer
}

// New starts a proxy server (nothing listens until Link).
func New() *Toxiproxy {
	return &Toxiproxy{srv: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())}
}

// Link is one proxied connection path: clients dial Addr, the proxy dials
// the upstream, and toxics act on every connection, present and future.
type Link struct {
	Name string
	p    *toxiproxy.Proxy

	mu     sync.Mutex
	toxics []string // names of the toxics on now
}

// Link starts a proxy named name listening on listen ("127.0.0.1:port")
// in front of upstream.
func (t *Toxiproxy) Link(name, listen, upstream string) (*Link, error) {
	host, _, _ := strings.Cut(listen, ":")
	if !strings.HasPrefix(host, "127.") {
		return nil, fmt.Errorf("link %s: %s is not a loopback address", name, listen)
	}
	p := toxiproxy.NewProxy(t.srv, name, listen, upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("link %s: %w", name, err)
	}
	return &Link{Name: name, p: p}, nil
}

// Addr is the address clients dial.
func (l *Link) Addr() string { return l.p.Listen }

// Blackhole stops every byte both ways on every connection, open and new
// (new ones are accepted and get nothing), without closing any.
func (l *Link) Blackhole() error {
	return l.add("hold", nil, "upstream", "downstream")
}

// HoldAnswers stops every byte the server sends, on every connection,
// open and new, while what clients send still reaches it: a request is
// carried out and its answer lost (held until Heal), as when the network
// fails between a server's work and its reply.
func (l *Link) HoldAnswers() error {
	return l.add("hold", nil, "downstream")
}

// Latency delays what the server sends by ms ± jitter milliseconds per
// chunk (every answer), on every connection.
func (l *Link) Latency(ms, jitter int) error {
	return l.add("latency", map[string]any{"latency": ms, "jitter": jitter}, "downstream")
}

// Bandwidth limits each connection to kbps KB/s each way.
func (l *Link) Bandwidth(kbps int) error {
	return l.add("bandwidth", map[string]any{"rate": kbps}, "upstream", "downstream")
}

func (l *Link) add(typ string, attrs map[string]any, streams ...string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range streams {
		name := typ + "_" + s
		body, _ := json.Marshal(map[string]any{"name": name, "type": typ, "stream": s, "toxicity": 1.0, "attributes": attrs})
		if _, err := l.p.Toxics.AddToxicJson(strings.NewReader(string(body))); err != nil {
			return fmt.Errorf("link %s: %s %s: %w", l.Name, typ, s, err)
		}
		l.toxics = append(l.toxics, name)
	}
	return nil
}

// Heal removes every toxic: held bytes are delivered and the link works
// as before; no connection was closed.
func (l *Link) Heal() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, name := range l.toxics {
		if err := l.p.Toxics.RemoveToxic(context.Background(), name); err != nil {
			return fmt.Errorf("link %s: heal %s: %w", l.Name, name, err)
		}
	}
	l.toxics = nil
	return nil
}

// Switch makes new connections go to upstream and closes every existing
// one (both ends), as a failover does; the listener is reopened on the
// same address, so a connection attempt in that instant is refused.
func (l *Link) Switch(upstream string) error {
	return l.p.Update(&toxiproxy.Proxy{Listen: l.p.Listen, Upstream: upstream, Enabled: true})
}

// Close heals the link (so no goroutine stays blocked in a toxic), closes
// every connection and stops listening.
func (l *Link) Close() {
	_ = l.Heal()
	l.p.Stop()
}
