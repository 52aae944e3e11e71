package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
)

// A POST with an Idempotency-Key is replayable to net/http: when the
// server dies after reading it on a kept-alive connection, the Transport
// sends it again on a new connection, and if that dial fails (the node is
// down) the error the client sees is the dial's. The request reached the
// service all the same, so the history must keep it (unknown outcome).
func TestHistoryKeepsARequestTheTransportRetried(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var posts atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		br := bufio.NewReader(conn)
		// The first request is answered: the connection is kept alive.
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
		// The second is read (it took effect), then the node dies: no
		// answer, and nothing listens any more.
		req, err = http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		posts.Add(1)
		ln.Close()
		conn.(*net.TCPConn).SetLinger(0) // a reset, as after SIGKILL
		conn.Close()
	}()
	base := "http://" + ln.Addr().String()
	hist := newHistory()
	c := newClient(Secrets{}, []string{base}, &Stats{}, hist, nil)
	ctx := context.Background()
	c.doAt(ctx, base, http.MethodGet, "/v1/skus/CART-1", nil, c.clientHeader())
	h := c.clientHeader()
	h.Set("Idempotency-Key", "cart-1-1")
	a := c.doAt(ctx, base, http.MethodPost, "/v1/orders", map[string]any{"user_id": "u", "items": []map[string]any{{"sku": "CART-1", "qty": 1}}}, h)
	<-done
	if posts.Load() != 1 {
		t.Fatalf("the server read %d POSTs, want 1", posts.Load())
	}
	t.Logf("the client's error: %v (neverSent: %v)", a.Err, neverSent(a.Err))
	for _, op := range hist.snapshot() {
		if op.Kind == opCreate {
			if op.Out != outUnknown {
				t.Fatalf("the POST is recorded %v, want unknown", op.Out)
			}
			return
		}
	}
	t.Fatalf("the POST reached the service but the history has no operation for it")
}

// A request whose only connection was never made reached no one: it is
// not an operation.
func TestHistoryDropsARequestNeverSent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	ln.Close()
	hist := newHistory()
	c := newClient(Secrets{}, []string{base}, &Stats{}, hist, nil)
	h := c.clientHeader()
	h.Set("Idempotency-Key", "cart-1-1")
	c.doAt(context.Background(), base, http.MethodPost, "/v1/orders", map[string]any{"user_id": "u", "items": []map[string]any{{"sku": "CART-1", "qty": 1}}}, h)
	if ops := hist.snapshot(); len(ops) != 0 {
		t.Fatalf("recorded %+v, want nothing", ops)
	}
}
