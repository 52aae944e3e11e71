package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The load generator's client must send what net/http's would (method,
// path, headers, body) and read each answer's status and whole body, so the
// next answer on the connection is read from its start.
func TestRawClientSendsTheRequestAndReadsEachAnswer(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch {
		case r.Method != http.MethodPost || r.URL.RequestURI() != "/v1/seckill/X/buy?a=1":
			w.WriteHeader(http.StatusMethodNotAllowed)
		case r.Header.Get("Authorization") != "Bearer k" || r.Header.Get("X-Buyer-Token") != "tok":
			w.WriteHeader(http.StatusUnauthorized)
		case string(body) == "close":
			w.Header().Set("Connection", "close")
			w.WriteHeader(http.StatusAccepted)
		case string(body) == "{}":
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, strings.Repeat("x", 5000)) // longer than the read buffer
		default:
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, `{"error":"sold out"}`)
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()

	c := newRawClient(srv.URL+"/v1/seckill/X/buy?a=1", http.Header{"Authorization": {"Bearer k"}, "X-Buyer-Token": {"tok"}}, 5*time.Second)
	defer c.Close()
	for i, tc := range []struct {
		body  string
		want  int
		conns int64
	}{
		{"{}", 201, 1}, {"x", 409, 1}, {"{}", 201, 1}, // one keep-alive connection
		{"close", 202, 1}, {"x", 409, 2}, // the server closed it: dial again
	} {
		got, err := c.post(tc.body)
		if err != nil || got != tc.want {
			t.Fatalf("request %d (%q): status %d, err %v; want %d", i, tc.body, got, err, tc.want)
		}
		if n := conns.Load(); n != tc.conns {
			t.Fatalf("request %d: %d connections, want %d", i, n, tc.conns)
		}
	}

	bad := newRawClient(srv.URL+"/v1/seckill/X/buy?a=1", http.Header{}, 5*time.Second)
	defer bad.Close()
	if got, err := bad.post("{}"); err != nil || got != http.StatusUnauthorized {
		t.Fatalf("without credentials: status %d, err %v; want 401", got, err)
	}
}
