package main

import (
	"context"
	"fmt"
	"time"

	"github.com/acme/inventory/internal/lock"
)

// projectorKill is issue 43's projector-kill scenario: the fleet sells as
// the lean sale does (the sale's commit records each hold as one row of
// holds; the orders, reservations and RESERVE movements are projected
// after it by one node at a time). At a third of the run the node that
// leads the projector is SIGKILLed mid-sale and its lock is held for
// projectorOutage more (a leader stalled, as a paused process holds its
// lease), so no node projects while buyers buy, pay, cancel and let
// holds expire (orders hold 3 s here). Every scenario's checks then say
// whether a hold outlived its deadline (stuck), a sale or a payment got
// lost, or a read missed a write (the history); the settle waits for the
// projection to catch up, and the checks read it.
var projectorKill = Scenario{Name: "projector-kill", Instances: 2, Stale: redisStale, Quick: true, Env: []string{leanEnv},
	Fault: func(ctx context.Context, r *Run) error {
		r.at(ctx, 0.33)
		var leader *Instance
		for deadline := time.Now().Add(20 * time.Second); leader == nil; sleep(ctx, 50*time.Millisecond) {
			var err error
			if leader, err = r.leaderOf(ctx, "inventory_projector_leader"); err != nil {
				return err
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("no node led the projector")
			}
		}
		leader.Kill()
		rdb := r.redis.Client()
		if err := rdb.Set(ctx, lock.ProjectorKey, "stalled-leader", projectorOutage).Err(); err != nil {
			return err
		}
		r.note("projector leader %s SIGKILLed; its lock held %s more, no node projecting", leader.Name, projectorOutage)
		sleep(ctx, time.Second)
		if err := leader.Start(ctx); err != nil {
			return err
		}
		sleep(ctx, projectorOutage)
		r.note("the projector's lock free again")
		return nil
	}}

// projectorOutage is how long no node projects in projector-kill: more
// than an order's hold and a sweep, so holds expire with the projector
// down.
const projectorOutage = orderTTL + sweepInterval + 2*time.Second

// leaderOf is the one instance whose metric gauge is 1 (nil when none or
// more than one is).
func (r *Run) leaderOf(ctx context.Context, gauge string) (*Instance, error) {
	var leaders []*Instance
	for _, in := range r.fleet {
		m, err := scrape(ctx, in.URL())
		if err != nil {
			return nil, err
		}
		if m[gauge] == 1 {
			leaders = append(leaders, in)
		}
	}
	if len(leaders) != 1 {
		return nil, nil
	}
	return leaders[0], nil
}
