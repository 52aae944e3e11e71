package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestScheduleIsFixed(t *testing.T) {
	start := time.Unix(1000, 0)
	s := newSchedule(start, 4000, 5*time.Second)
	if s.n != 20000 {
		t.Fatalf("n = %d, want 20000", s.n)
	}
	for i, want := range map[int]time.Duration{0: 0, 1: 250 * time.Microsecond, 4000: time.Second, 19999: 5*time.Second - 250*time.Microsecond} {
		if got := s.at(i).Sub(start); got != want {
			t.Errorf("at(%d) = start + %s, want + %s", i, got, want)
		}
	}
	// A fractional interval does not drift: request i is at i/rate exactly.
	s = newSchedule(start, 3, time.Second)
	if got := s.at(3).Sub(start); got != time.Second {
		t.Errorf("at 3/s, at(3) = start + %s, want 1s", got)
	}
}

func TestPercentileNearestRank(t *testing.T) {
	var ms []time.Duration
	for i := 1; i <= 1000; i++ {
		ms = append(ms, time.Duration(i)*time.Millisecond)
	}
	d := distribution(ms)
	want := latencyDist{n: 1000, p50: 500 * time.Millisecond, p90: 900 * time.Millisecond, p99: 990 * time.Millisecond,
		p999: 999 * time.Millisecond, max: 1000 * time.Millisecond}
	if d != want {
		t.Errorf("distribution(1..1000 ms) = %+v, want %+v", d, want)
	}
	if got := percentile([]time.Duration{7}, 0.999); got != 7 {
		t.Errorf("percentile of one sample = %d, want 7", got)
	}
	if got := percentile(nil, 0.5); got != 0 {
		t.Errorf("percentile of none = %d, want 0", got)
	}
	// Ten samples: p99 is the largest, not the ninth.
	if got := percentile([]time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 0.99); got != 10 {
		t.Errorf("p99 of 1..10 = %d, want 10", got)
	}
}

// A server that stalls for 200 ms while the schedule goes on: the requests
// meant to be sent during the stall wait for it, and their latencies, taken
// from their intended send times, show it. A closed-loop account (from the
// send) would show the stall in at most one request per sender.
func TestOpenLoopShowsAStall(t *testing.T) {
	const senders = 8
	start := time.Now().Add(10 * time.Millisecond)
	stallFrom, stallTo := start.Add(300*time.Millisecond), start.Add(500*time.Millisecond)
	st := runSchedule(newSchedule(start, 1000, time.Second), senders, func(int) (int, error) {
		if now := time.Now(); !now.Before(stallFrom) && now.Before(stallTo) {
			time.Sleep(time.Until(stallTo))
		} else {
			time.Sleep(time.Millisecond)
		}
		return 201, nil
	})
	if st.codes[201] != 1000 || len(st.lat) != 1000 {
		t.Fatalf("answers %v, %d latencies; want 1000 × 201", st.codes, len(st.lat))
	}
	slow := 0
	for _, l := range st.lat {
		if l >= 100*time.Millisecond {
			slow++
		}
	}
	// The requests meant for the stall's first 100 ms waited ≥ 100 ms.
	if slow < 90 {
		t.Errorf("%d requests took ≥ 100 ms from their intended time, want ≥ 90 (the stall hidden)", slow)
	}
	d := distribution(st.lat)
	if d.p99 < 150*time.Millisecond || d.max < 180*time.Millisecond {
		t.Errorf("p99 %s, max %s: want ≥ 150 ms and ≥ 180 ms (the stall)", d.p99, d.max)
	}
	// The majority, meant for before or after the stall, did not wait for
	// it: their p50 is under half the stall (a busy machine's late
	// senders add milliseconds, never the stall).
	if d.p50 >= 100*time.Millisecond {
		t.Errorf("p50 %s: want the unstalled majority under half the stall", d.p50)
	}
	// Every sender was stuck, so the stall's requests started late.
	if st.maxInFlight != senders || st.startedLate() < 150 {
		t.Errorf("at most %d in flight, %d started late: want %d and ≥ 150", st.maxInFlight, st.startedLate(), senders)
	}
}

// The same through HTTP, with senders to spare: the requests go out on
// time and wait in the server, and still count from their intended times.
func TestOpenLoadThroughHTTPShowsAStall(t *testing.T) {
	var mu sync.Mutex
	var stallUntil time.Time
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		if n.Add(1) == 150 {
			stallUntil = time.Now().Add(200 * time.Millisecond)
		}
		until := stallUntil
		mu.Unlock()
		time.Sleep(time.Until(until))
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	// In this process: the test binary cannot be the generator's process.
	defer func(v bool) { *openProcess = v }(*openProcess)
	*openProcess = false
	r, row := openLoad("stall", srv.URL+"/buy", 500, time.Second, func(int) http.Header { return http.Header{} }, `{}`)
	if r.codes[201] != 500 {
		t.Fatalf("answers %v, want 500 × 201", r.codes)
	}
	if row.dist.p90 < 90*time.Millisecond || row.dist.max < 180*time.Millisecond {
		t.Errorf("p90 %s, max %s: want ≥ 90 ms and ≥ 180 ms (100 of 500 requests meant for the stall)", row.dist.p90, row.dist.max)
	}
	if !strings.Contains(row.late, "256 senders") {
		t.Errorf("late = %q, want the senders named", row.late)
	}
}

func TestAgreement(t *testing.T) {
	for _, c := range []struct {
		theirs, ours float64
		ok           bool
	}{{100, 100, true}, {114, 100, true}, {86, 100, true}, {116, 100, false}, {84, 100, false}, {0, 100, false}} {
		if _, ok := agreement(c.theirs, c.ours); ok != c.ok {
			t.Errorf("agreement(%v, %v) = %v, want %v", c.theirs, c.ours, ok, c.ok)
		}
	}
}

// loadGenerator is the path of a load generator make test installed
// (scripts/lib.sh's load_generators exports it as env), or the flag's; a
// missing one fails the test: make bench needs it.
func loadGenerator(t *testing.T, env, flagValue string) string {
	t.Helper()
	path := os.Getenv(env)
	if path == "" {
		path = flagValue
	}
	found, err := exec.LookPath(path)
	if err != nil {
		t.Fatalf("%s is not installed (%v): make test installs it (scripts/lib.sh load_generators), or set %s", path, err, env)
	}
	return found
}

// wrk sends the headers it is given and its line is read.
func TestWrkRun(t *testing.T) {
	*wrkPath = loadGenerator(t, "INVENTORY_WRK", *wrkPath)
	var tokens sync.Map
	var bad atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || string(b) != `{}` || r.Header.Get("Authorization") != "Bearer c" || r.URL.Path != "/v1/buy" {
			bad.Add(1)
		}
		tokens.Store(r.Header.Get(idHeader), true)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	hs := []http.Header{{"Authorization": {"Bearer c"}, idHeader: {"t1"}}, {"Authorization": {"Bearer c"}, idHeader: {"t2"}}}
	r, row := wrkRun("wrk", srv.URL+"/v1/buy", 4, time.Second, hs, `{}`)
	if row.err != "" || r.rate <= 0 || row.codes[201] == 0 || row.dist.p50 <= 0 {
		t.Fatalf("wrk: %+v", row)
	}
	if bad.Load() > 0 {
		t.Errorf("%d requests not as built", bad.Load())
	}
	for _, tok := range []string{"t1", "t2"} {
		if _, ok := tokens.Load(tok); !ok {
			t.Errorf("token %s never sent", tok)
		}
	}
}

// vegeta sends the targets it is given at the rate asked and its report
// is read.
func TestVegetaRun(t *testing.T) {
	*vegetaPath = loadGenerator(t, "INVENTORY_VEGETA", *vegetaPath)
	var bad, n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || string(b) != `{}` || r.Header.Get("Authorization") != "Bearer c" || r.Header.Get(idHeader) == "" {
			bad.Add(1)
		}
		n.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	hs := []http.Header{{"Authorization": {"Bearer c"}, idHeader: {"t1"}}, {"Authorization": {"Bearer c"}, idHeader: {"t2"}}}
	r, row := vegetaRun("vegeta", srv.URL+"/v1/buy", 200, time.Second, hs, `{}`)
	if row.err != "" || row.codes[201] != 200 || r.rate < 150 || row.dist.p50 <= 0 {
		t.Fatalf("vegeta: %+v", row)
	}
	if bad.Load() > 0 || n.Load() != 200 {
		t.Errorf("%d requests, %d not as built", n.Load(), bad.Load())
	}
}
