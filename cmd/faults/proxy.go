package main

import (
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// Proxy is a TCP forwarder on 127.0.0.1:port in front of a server (a Redis),
// so the driver can fail over to another server without reconfiguring its
// clients: Switch sends new connections to the new target and cuts every
// existing one, as a failover does.
type Proxy struct {
	ln net.Listener
	wg sync.WaitGroup // the accept loop and every connection's goroutine

	mu     sync.Mutex
	target string
	gen    int                   // incremented by every Switch
	conns  map[net.Conn]struct{} // both ends of every forwarded connection
	closed bool
}

// StartProxy listens on 127.0.0.1:port and forwards every connection to
// target.
func StartProxy(port int, target string) (*Proxy, error) {
	if sharedPorts[port] {
		return nil, fmt.Errorf("proxy: port %d belongs to the shared servers of scripts/up.sh", port)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the address clients connect to, "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Switch makes new connections go to target and closes every existing
// connection (both ends) at once.
func (p *Proxy) Switch(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
	p.gen++
	p.closeAllLocked()
}

// Close stops listening, closes every connection and waits until all of the
// proxy's goroutines have returned.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	_ = p.ln.Close()
	p.closeAllLocked()
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) closeAllLocked() {
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return
			}
			time.Sleep(10 * time.Millisecond) // e.g. out of file descriptors
			continue
		}
		p.wg.Add(1)
		go p.forward(c)
	}
}

// forward connects c to the current target and copies both ways until either
// side closes or Switch or Close cuts them.
func (p *Proxy) forward(c net.Conn) {
	defer p.wg.Done()
	p.mu.Lock()
	target, gen := p.target, p.gen
	p.mu.Unlock()
	up, err := net.DialTimeout("tcp", target, 2*time.Second)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	if p.closed || p.gen != gen { // switched while dialing: the old target is gone
		p.mu.Unlock()
		_ = c.Close()
		_ = up.Close()
		return
	}
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	p.mu.Unlock()

	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	_ = c.Close()
	_ = up.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}
