package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/httpapi"
)

// TestMeasure: the timing counts answers, not requests that got none; it
// takes the answers to requests sent once the dependency was known down,
// and the first success that came after the heal.
func TestMeasure(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	req := func(start, end float64, status int, method, route string) sample {
		return sample{start: at(start), end: at(end), status: status, method: method, route: route}
	}
	dark := &Dark{Link: "mariadb", From: at(10), Heal: at(20)}
	samples := []sample{
		req(1, 1.01, http.StatusCreated, http.MethodPost, "/v1/seckill"),
		req(11, 21, http.StatusCreated, http.MethodPost, "/v1/orders"), // hung through the dark: slow, and a success after the heal
		req(14, 14.02, http.StatusServiceUnavailable, http.MethodPost, "/v1/seckill"),
		req(15, 15.2, http.StatusServiceUnavailable, http.MethodPost, "/v1/orders"),
		req(16, 46, 0, http.MethodPost, "/v1/orders"),                                         // the client gave up
		{start: at(17), end: at(19), method: http.MethodPost, route: "/v1/orders", cut: true}, // cut by the run's end
		req(20.5, 20.6, http.StatusOK, http.MethodPost, "/v1/stock/deduct"),
		req(20.1, 20.3, http.StatusOK, http.MethodGet, "/v1/skus"),                     // not a success: needs no Redis
		req(12.9, 13.5, http.StatusServiceUnavailable, http.MethodPost, "/v1/seckill"), // before "known down"
		req(14.5, 14.58, http.StatusOK, http.MethodPost, "/v1/skus"),                   // served without the dark dependency: not judged
	}
	tm := measure(samples, dark, []Phase{{What: "slow", From: at(14), To: at(16)}})
	assert.EqualValues(t, 8, tm.Answers)
	assert.Equal(t, 10*time.Second, tm.Slowest)
	assert.EqualValues(t, 1, tm.Over)
	assert.EqualValues(t, 1, tm.GaveUp, "the give-up after 30 s; the cut request waited 2 s, not more")
	require.Len(t, tm.Phases, 1)
	assert.EqualValues(t, 3, tm.Phases[0].Answers, "answers to requests sent in the phase")
	assert.Equal(t, 200*time.Millisecond, tm.Phases[0].Slowest)
	require.NotNil(t, tm.Dark)
	assert.EqualValues(t, 2, tm.Dark.Open, "the 503s")
	assert.Equal(t, 200*time.Millisecond, tm.Dark.OpenSlowest)
	assert.EqualValues(t, 1, tm.Dark.Served)
	assert.Equal(t, 80*time.Millisecond, tm.Dark.ServedSlowest.Round(time.Millisecond))
	assert.EqualValues(t, 1, tm.Dark.OpenOver)
	assert.EqualValues(t, 2, tm.Dark.OpenUnanswered)
	assert.Equal(t, 600*time.Millisecond, tm.Dark.FirstSuccess.Round(time.Millisecond))

	v := &Verdict{Timing: tm, Timed: true}
	v.judge()
	assert.Len(t, v.TimingProblems, 4, "slowest, over 2 s, gave up, slow while dark: %v", v.TimingProblems)
	assert.False(t, v.Passed())

	calm := &Verdict{Timing: measure(samples[:1], nil, nil), Timed: true, Drift: "clean"}
	calm.judge()
	assert.Empty(t, calm.TimingProblems)
	assert.True(t, calm.Passed())
}

// The takeover of a killed consumer node's queues is a verdict in any
// scenario that measured one: within syncLimit, or a timing problem.
func TestTakeoverIsJudged(t *testing.T) {
	for _, c := range []struct {
		tk       *Takeover
		problems int
	}{
		{nil, 0},
		{&Takeover{Victim: "a", Resumed: 4200 * time.Millisecond}, 0},
		{&Takeover{Victim: "a", Resumed: 5100 * time.Millisecond}, 1},
		{&Takeover{Victim: "a", Resumed: -1, MeasuredUntil: time.Minute, Pending: 12}, 1},
		{&Takeover{Victim: "a", Resumed: -1, MeasuredUntil: time.Minute}, 1}, // nothing to measure
	} {
		v := &Verdict{Timing: Timing{Takeover: c.tk}}
		v.judgeTakeover()
		assert.Len(t, v.TimingProblems, c.problems, "%+v: %v", c.tk, v.TimingProblems)
		if c.tk != nil {
			assert.Contains(t, v.timingLines()[1], "SIGKILLed")
		}
	}
}

// A stock count has a deadline of its own (httpapi.CountTimeout): one that
// waited out a dark database and was answered 10 s after it was sent is
// within it, and not the run's slowest answer; one past it is a problem.
func TestACountIsJudgedByItsOwnDeadline(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	count := func(took time.Duration) sample {
		return sample{start: t0, end: t0.Add(took), status: http.StatusOK, method: http.MethodPost, route: route("/v1/stock/counts")}
	}
	sale := sample{start: t0, end: t0.Add(300 * time.Millisecond), status: http.StatusCreated, method: http.MethodPost, route: route("/v1/seckill")}
	within := &Verdict{Timing: measure([]sample{sale, count(10 * time.Second)}, nil, nil), Timed: true, Drift: "clean"}
	within.judge()
	assert.Empty(t, within.TimingProblems)
	assert.Equal(t, 300*time.Millisecond, within.Timing.Slowest)

	past := &Verdict{Timing: measure([]sample{sale, count(httpapi.CountTimeout + time.Second)}, nil, nil), Timed: true, Drift: "clean"}
	past.judge()
	assert.Len(t, past.TimingProblems, 1, "over its deadline: %v", past.TimingProblems)
	assert.EqualValues(t, 1, past.Timing.Over)
}

// A 5xx answer other than 503 is named whole in the run's problems (the
// request, its id and its body), the first keptErrors of them: a failed
// run says where its 500 came from.
func TestFailedAnswersAreNamed(t *testing.T) {
	var s Stats
	for i := range keptErrors + 2 {
		s.failed(http.MethodPost, "/v1/orders", http.StatusInternalServerError, fmt.Sprintf("req-%d", i), []byte(`{"error":"internal"}`))
	}
	got := s.failures()
	require.Len(t, got, keptErrors)
	assert.Equal(t, failure{`POST /v1/orders 500 (request req-0): {"error":"internal"}`, "req-0"}, got[0])
}

// The cause a node logged under a failed answer's request id comes with
// the problem that names the answer: CI keeps no node logs.
func TestFailedAnswersCarryTheirLoggedCause(t *testing.T) {
	r := &Run{dir: t.TempDir()}
	require.NoError(t, os.WriteFile(filepath.Join(r.dir, "inventoryd-0.log"), []byte(
		"time=1 level=INFO msg=started\n"+
			"time=2 level=ERROR msg=\"internal error\" request_id=req-7 err=\"Error 1213: Deadlock\"\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(r.dir, "inventoryd-1.log"), []byte("time=3 level=ERROR request_id=req-8\n"), 0o644))
	assert.Equal(t, `; logged: inventoryd-0.log: time=2 level=ERROR msg="internal error" request_id=req-7 err="Error 1213: Deadlock"`,
		r.loggedCause("req-7"))
	assert.Empty(t, r.loggedCause("req-9"), "nothing logged under it")
	assert.Empty(t, r.loggedCause(""), "no request id")
}
