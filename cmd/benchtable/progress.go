package main

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// step is one phase of a run and what it is expected to take, for the
// progress bar's estimate of the whole.
type step struct {
	name string
	took time.Duration
}

// progress shows on stderr which phase runs and the time elapsed against the
// estimated total: a bar on a terminal, a line per phase otherwise (a log or
// a pipe). The estimate is the time spent so far plus what the phases left
// were planned to take, so it corrects itself as phases run long or short.
type progress struct {
	mu      sync.Mutex
	steps   []step
	cur     int // index into steps; -1 before the first
	started time.Time
	phaseAt time.Time
	bar     *progressbar.ProgressBar // nil when stderr is not a terminal
	done    chan struct{}
	stopped sync.WaitGroup
}

// prog is the run's progress; nil (no output) outside a planned run.
var prog *progress

const tick = 100 * time.Millisecond // the bar's unit

func startProgress(steps []step) *progress {
	p := &progress{steps: steps, cur: -1, started: time.Now(), phaseAt: time.Now(), done: make(chan struct{})}
	if fd := int(os.Stderr.Fd()); term.IsTerminal(fd) {
		width := progressbar.OptionFullWidth()
		if cols, _, err := term.GetSize(fd); err != nil || cols < 100 {
			width = progressbar.OptionSetWidth(30) // a terminal that does not say its size, or a narrow one
		}
		p.bar = progressbar.NewOptions64(int64(p.estimate()/tick),
			progressbar.OptionSetWriter(os.Stderr),
			progressbar.OptionSetPredictTime(false),
			progressbar.OptionSetElapsedTime(false),
			width,
			progressbar.OptionThrottle(200*time.Millisecond),
			progressbar.OptionSetRenderBlankState(true),
		)
		p.stopped.Add(1)
		go p.refresh()
	}
	return p
}

// phase marks the start of the named phase (a repeat of the current name is a
// no-op). Safe on a nil progress.
func (p *progress) phase(name string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur >= 0 && p.steps[p.cur].name == name {
		return
	}
	i := slices.IndexFunc(p.steps, func(s step) bool { return s.name == name })
	if i < 0 { // not planned: shown, but not counted in the estimate
		p.steps = slices.Insert(p.steps, p.cur+1, step{name: name})
		i = p.cur + 1
	}
	p.cur, p.phaseAt = i, time.Now()
	if p.bar == nil {
		fmt.Fprintf(os.Stderr, "bench: %s\n", p.describe())
		return
	}
	p.render()
}

// finish stops the bar and says how long the run took.
func (p *progress) finish() {
	if p == nil {
		return
	}
	close(p.done)
	p.stopped.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bar != nil {
		_ = p.bar.Clear()
	}
	fmt.Fprintf(os.Stderr, "bench: done in %s\n", time.Since(p.started).Round(time.Second))
}

func (p *progress) refresh() {
	defer p.stopped.Done()
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-t.C:
			p.mu.Lock()
			p.render()
			p.mu.Unlock()
		}
	}
}

// estimate is the elapsed time plus what the current phase still has (at
// least a second) and the phases after it were planned to take.
func (p *progress) estimate() time.Duration {
	total := time.Since(p.started)
	if p.cur >= 0 {
		total += max(p.steps[p.cur].took-time.Since(p.phaseAt), time.Second)
	}
	for _, s := range p.steps[p.cur+1:] {
		total += s.took
	}
	return total
}

func (p *progress) describe() string {
	name := "starting"
	if p.cur >= 0 {
		name = p.steps[p.cur].name
	}
	return fmt.Sprintf("[%d/%d] %-24s %s / ~%s", p.cur+1, len(p.steps), name,
		time.Since(p.started).Round(time.Second), p.estimate().Round(time.Second))
}

// render draws the bar; p.mu is held.
func (p *progress) render() {
	elapsed, total := int64(time.Since(p.started)/tick), int64(p.estimate()/tick)
	p.bar.ChangeMax64(max(total, elapsed+1))
	p.bar.Describe(p.describe())
	_ = p.bar.Set64(elapsed)
}

// plan is what a run of the given group will go through, in order, with the
// time each phase is expected to take at the flags' settings.
func plan(group string) []step {
	d := *duration
	var s []step
	if group == "" {
		s = append(s,
			step{"mysql-hot-row", d}, step{"redis-lock", d},
			step{"lua-first-million", 8 * time.Second}, step{"lua", d}, step{"lua-pipelined", d},
			// redis-benchmark sends 400k EVALSHA per second of -duration at ~180k/s.
			step{"redis-benchmark", time.Duration(float64(d) * 2.2)})
	}
	if group == "" || group == "sync" {
		// Each writes the reservations it may apply, then pauses 3 s.
		s = append(s, step{"sync-merged-32", d + 8*time.Second}, step{"sync-per-message", d + 4*time.Second})
	}
	if group == "" || group == "http" {
		s = append(s, step{"http setup", 5 * time.Second},
			step{"bare net/http + EVALSHA #1", d}, step{"seckill, selling", d}, step{floorPhase, d}, step{"seckill, sold out #1", d})
		for i := 2; i <= pairRounds; i++ {
			s = append(s, step{fmt.Sprintf("bare net/http + EVALSHA #%d", i), d}, step{fmt.Sprintf("seckill, sold out #%d", i), d})
		}
		s = append(s, step{"seckill, 2000 units", d}, step{cartBarePhase, d}, step{"orders, 2-line cart", d}, step{"sync lag", d + time.Second})
		if *soakFor > 0 {
			s = append(s, step{"soak", *soakFor})
			if *churnN > 0 {
				s = append(s, step{"campaign churn", churnWindow + time.Duration(*churnN)*5*time.Millisecond})
			}
		}
	}
	if group == "" || group == "campaign" {
		refs := func(at string) {
			s = append(s, step{"seckill, selling, " + at, d}, step{"seckill, sold out, " + at, *campBefore})
		}
		s = append(s, step{"campaign setup", 5 * time.Second})
		refs("before opening #1")
		for i := 1; i <= *campOpenings; i++ {
			s = append(s, step{fmt.Sprintf("campaign #%d, before the opening", i), *campBefore},
				step{fmt.Sprintf("campaign #%d, selling", i), d})
			if i < *campOpenings {
				refs(fmt.Sprintf("between openings #%d and #%d", i, i+1))
			} else {
				refs(fmt.Sprintf("after opening #%d", i))
			}
		}
		s = append(s, step{"extend setup", time.Second}, step{"orders extend", max(d/2, time.Second) + time.Second},
			step{"stock extend", max(d/2, time.Second) + time.Second})
	}
	if group == "" || group == "webhooks" {
		s = append(s, step{"webhooks setup", 5 * time.Second}, step{"seckill, selling, warm-up (not judged)", d + hookSettle})
		for i := 1; i <= *hookPairs; i++ {
			none, with := step{fmt.Sprintf("seckill, selling, no subscription #%d", i), d + hookSettle},
				step{fmt.Sprintf("seckill, selling, one subscription #%d", i), d + hookSettle}
			if *hookWithFirst {
				none, with = with, none
			}
			s = append(s, none, with)
		}
		s = append(s, step{soldOutPhase, 3 * time.Second}, step{"waiting for sku.sold_out", 2 * time.Second})
	}
	if group == "lean" || group == "" {
		for round := range leanPairs {
			for _, way := range []string{"classic", "lean"} {
				s = append(s, step{fmt.Sprintf("lean group: %s node #%d setup", way, round+1), time.Second})
				for _, ph := range []string{"seckill, selling", "orders, 2-line cart"} {
					s = append(s, step{fmt.Sprintf("lean group: %s, %s #%d", ph, way, round+1), d + time.Second})
				}
			}
		}
	}
	if group == "dbcost" || group == "" {
		for round := range *costRounds {
			for _, v := range costVariants() {
				s = append(s, step{fmt.Sprintf("dbcost %s #%d", v.name, round+1), max(d*3/5, time.Second)})
			}
		}
	}
	return append(s, step{"report", 3 * time.Second})
}
