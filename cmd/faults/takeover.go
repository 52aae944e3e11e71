package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/acme/inventory/mq"
)

// Takeover is the node killed and kept down, while it led the outbox relay
// and consumed its share of the queues, until the other node applied the
// queues it held (kill-inventoryd): the sync's resumption after a change of
// consumer nodes (docs/SPEC.md section 7, within syncLimit).
type Takeover struct {
	Victim string   // the instance killed
	SKUs   []string // the workload's SKUs on the queues it held (all of them if none was)
	Queues int      // how many queues it held
	// RelayOnly: none of the workload's SKUs was on its queues, so what is
	// measured is the relay's move alone (the other node's queues wait for
	// nothing else).
	RelayOnly bool
	// Resumed is the time from the SIGKILL to the first message of those
	// SKUs applied by the node that stayed (-1: not within MeasuredUntil).
	Resumed       time.Duration
	MeasuredUntil time.Duration
	Pending       int64 // their outbox rows not yet applied when the wait ended (0 with Resumed < 0: nothing to measure)
}

// takeoverBaseline is how long after the SIGKILL the ledger's count is
// taken as the baseline: a transaction the dead node committed as it died
// lands by then, and no other node can apply its queues before their locks
// lapse (mq.BrokerLockLifetime, less the 200 ms between renewals) and the
// client's 3 s wait before the first pull of a queue it just locked.
const takeoverBaseline = 200 * time.Millisecond

// killForTakeover waits until every instance is in the consumer group and
// one leads the outbox relay, kills that one (the worst case: its queues and
// the relay both have to move, and nothing of any SKU is published until the
// relay has), and keeps it down until the other applied a message of one of
// its queues' SKUs (or of any workload SKU, if none of them is on its
// queues), or syncWait passed; then starts it again.
func (r *Run) killForTakeover(ctx context.Context) error {
	ns, topic := []string{r.lab.mq.NameServer()}, r.resourceName()
	group := topic + "_apply" // internal/app's consumer group
	skus := append([]string{hotSKU, tokenSKU}, cartSKUs...)
	var owners map[int]string
	var victim *Instance
	for deadline := time.Now().Add(60 * time.Second); ; {
		var err error
		owners, err = mq.QueueOwners(ctx, ns, topic, group)
		cids := map[string]bool{}
		for _, cid := range owners {
			cids[cid] = true
		}
		victim = nil
		if err == nil && len(cids) == len(r.fleet) {
			victim, err = r.relayLeader(ctx)
		}
		if victim != nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("takeover: the consumer group never had all %d instances with one leading the relay (owners %v, %v)", len(r.fleet), owners, err)
		}
		sleep(ctx, 100*time.Millisecond)
	}
	victimCID := ""
	for _, cid := range owners {
		if strings.HasSuffix(cid, "@"+victim.Name+"_consumer") { // internal/app's instance name
			victimCID = cid
		}
	}
	tk := &Takeover{Victim: victim.Name, Resumed: -1}
	for _, cid := range owners {
		if cid == victimCID {
			tk.Queues++
		}
	}
	for _, sku := range skus {
		if owners[mq.QueueOf(sku, len(owners))] == victimCID {
			tk.SKUs = append(tk.SKUs, sku)
		}
	}
	if len(tk.SKUs) == 0 {
		tk.SKUs, tk.RelayOnly = skus, true // the relay's move alone holds every SKU back
	}
	slices.Sort(tk.SKUs)

	killed := time.Now()
	victim.Kill()
	sleep(ctx, time.Until(killed.Add(takeoverBaseline)))
	base, err := r.appliedOf(ctx, tk.SKUs)
	if err != nil {
		return err
	}
	for time.Since(killed) < syncWait && ctx.Err() == nil {
		n, err := r.appliedOf(ctx, tk.SKUs)
		if err != nil {
			return err
		}
		if n > base {
			tk.Resumed = time.Since(killed)
			break
		}
		sleep(ctx, syncPoll)
	}
	tk.MeasuredUntil = time.Since(killed)
	if err := r.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM stock_outbox WHERE applied_at IS NULL AND sku IN (?`+
		strings.Repeat(",?", len(tk.SKUs)-1)+`)`, anys(tk.SKUs)...).Scan(&tk.Pending); err != nil {
		return err
	}
	r.note("%s (relay leader, %d of %d queues) SIGKILLed and kept down: the other node applied %s %s after the kill",
		victim.Name, tk.Queues, len(owners), tk.what(), tk.resumed())
	r.mu.Lock()
	r.takeover = tk
	r.mu.Unlock()
	return victim.Start(ctx)
}

// relayLeader is the one instance whose /metrics says it leads the outbox
// relay (nil while none or more than one does: a handover under way).
func (r *Run) relayLeader(ctx context.Context) (*Instance, error) {
	return r.leaderOf(ctx, "inventory_relay_leader")
}

// appliedOf counts the ledger's rows of skus: messages applied.
func (r *Run) appliedOf(ctx context.Context, skus []string) (n int64, err error) {
	err = r.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM stock_ledger WHERE sku IN (?`+strings.Repeat(",?", len(skus)-1)+`)`,
		anys(skus)...).Scan(&n)
	return n, err
}

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

func (tk *Takeover) resumed() string {
	if tk.Resumed < 0 {
		return fmt.Sprintf("not within %s (%d of their outbox rows unapplied then)", round(tk.MeasuredUntil), tk.Pending)
	}
	return round(tk.Resumed).String()
}

// judgeTakeover makes the takeover's time a verdict, in whatever scenario
// measured one.
func (v *Verdict) judgeTakeover() {
	tk := v.Timing.Takeover
	switch {
	case tk == nil:
	case tk.Resumed < 0 && tk.Pending == 0:
		v.timingProblem("nothing was applied of %s's queues within %s of its kill, and nothing waited: nothing to measure", tk.Victim, round(tk.MeasuredUntil))
	case tk.Resumed < 0:
		v.timingProblem("the sync of %s's queues did not resume within %s of its kill", tk.Victim, round(tk.MeasuredUntil))
	case tk.Resumed > syncLimit:
		v.timingProblem("the sync of %s's queues resumed %s after its kill > %s", tk.Victim, round(tk.Resumed), syncLimit)
	}
}

// takeoverLine is the timing line of the takeover.
func (tk *Takeover) line() string {
	mark := "FAIL"
	if tk.Resumed >= 0 && tk.Resumed <= syncLimit {
		mark = "PASS"
	}
	return fmt.Sprintf("relay leader and consumer %s SIGKILLed (%d queues): the other node applied %s %s after the kill (≤ %s: %s)",
		tk.Victim, tk.Queues, tk.what(), tk.resumed(), syncLimit, mark)
}

// what says whose messages the takeover waited for.
func (tk *Takeover) what() string {
	if tk.RelayOnly {
		return "the messages of " + strings.Join(tk.SKUs, ", ") + " (none on its queues: the relay's move alone)"
	}
	return "its queues' messages of " + strings.Join(tk.SKUs, ", ")
}
