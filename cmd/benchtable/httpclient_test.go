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

// A GET is sent without a body, and a Retry-After header is reported (a
// campaign's sale_not_started carries one, its sold-out answer none).
func TestRawClientGetAndRetryAfter(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch {
		case r.Method == http.MethodGet && len(body) == 0:
			_, _ = io.WriteString(w, `{"state":"SCHEDULED"}`)
		case r.Method == http.MethodPost && string(body) == "early":
			w.Header().Set("Retry-After", "3")
			w.WriteHeader(http.StatusConflict)
		default:
			w.WriteHeader(http.StatusConflict)
		}
	}))
	defer srv.Close()
	get := newRawRequest(http.MethodGet, srv.URL+"/v1/campaigns/c", http.Header{}, 5*time.Second)
	defer get.Close()
	for range 2 {
		if got, err := get.post(""); err != nil || got != http.StatusOK {
			t.Fatalf("GET: status %d, err %v", got, err)
		}
	}
	buy := newRawClient(srv.URL+"/v1/campaigns/c/buy", http.Header{}, 5*time.Second)
	defer buy.Close()
	for _, tc := range []struct {
		body  string
		retry bool
	}{{"early", true}, {"{}", false}, {"early", true}} {
		if got, err := buy.post(tc.body); err != nil || got != http.StatusConflict || buy.retryAfter != tc.retry {
			t.Fatalf("%q: status %d, err %v, Retry-After %v; want 409, %v", tc.body, got, err, buy.retryAfter, tc.retry)
		}
	}
}

// A revalidating client sends the last ETag in If-None-Match (none on the
// first request) and reads a 304, which has no body, then the next answer
// on the same connection from its start.
func TestRawClientRevalidates(t *testing.T) {
	var sent []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inm := r.Header.Get("If-None-Match")
		sent = append(sent, inm)
		w.Header().Set("ETag", `W/"v1"`)
		if inm == `W/"v1"` {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		_, _ = io.WriteString(w, `{"state":"SCHEDULED"}`)
	}))
	defer srv.Close()
	c := newRawRequest(http.MethodGet, srv.URL+"/v1/campaigns/c", http.Header{}, 5*time.Second)
	c.revalidate = true
	defer c.Close()
	for i, want := range []int{200, 304, 304} {
		if got, err := c.post(""); err != nil || got != want {
			t.Fatalf("poll %d: status %d, err %v; want %d", i, got, err, want)
		}
	}
	if want := []string{"", `W/"v1"`, `W/"v1"`}; strings.Join(sent, "|") != strings.Join(want, "|") {
		t.Fatalf("If-None-Match sent %q, want %q", sent, want)
	}
}
