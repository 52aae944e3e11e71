package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

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
		sweep := watchSweepLock(ctx, rdb)
		sleep(ctx, time.Second)
		if err := leader.Start(ctx); err != nil {
			return err
		}
		// Just before the lock frees: the holds due by then, and those
		// still held a sweep and a margin past their deadline, or past
		// the sweep lock's lease when the kill left it orphaned (a node
		// killed mid-sweep is replaced when its lease runs out: the
		// expiry's documented bound, whatever the projector does).
		sleep(ctx, projectorOutage-2*time.Second)
		cutoff := time.Now().Add(-sweepInterval - 2*time.Second)
		freed, orphaned := sweep()
		if orphaned {
			r.note("the kill left the sweep lock held with no node renewing it: the sweep resumed only after %s (holds due before then judged from then)", freed.Sub(r.start).Round(100*time.Millisecond))
		}
		o, err := r.dueHolds(ctx, cutoff, freed)
		if err != nil {
			return err
		}
		r.mu.Lock()
		r.outage = o
		r.mu.Unlock()
		r.note("with no node projecting: %d holds never projected by the projector, %d of them past their deadline, %d of those still held a sweep and 2 s after it%s",
			o.Unprojected, o.Due, o.Late, o.lateNote())
		sleep(ctx, 2*time.Second)
		r.note("the projector's lock free again")
		return nil
	},
	After: func(ctx context.Context, r *Run, v *Verdict) error {
		r.mu.Lock()
		o := r.outage
		r.mu.Unlock()
		switch {
		case o == nil:
			v.problem("projector-kill: the outage was not measured")
		case o.Due == 0:
			v.problem("projector-kill: no hold fell due while no node projected: the scenario proved nothing")
		case o.Late > 0:
			v.Stuck += o.Late
			v.problem("projector-kill: %d holds still held a sweep and 2 s past their deadline while no node projected%s; the nodes' warnings of the expiry and the projection: %s",
				o.Late, o.lateNote(), r.warnings("timeout", "sweep", "project"))
		}
		return nil
	}}

// Outage is what projector-kill found of the holds the projector had not
// reached: how many, how many were past their deadline, and how many of
// those still held their units past the cutoff (stuck), the first few
// of those described.
type Outage struct {
	Unprojected, Due, Late int64
	late                   []string
}

// lateNote describes the late holds found, for the run's notes.
func (o *Outage) lateNote() string {
	if len(o.late) == 0 {
		return ""
	}
	return ": " + strings.Join(o.late, "; ")
}

// watchSweepLock follows the sweep's lock from now (a kill) and, when
// called, says whether the lock was left orphaned: held now by a round
// with no node renewing it (its lease never grows back, and it runs out,
// not released with time left, before any node takes it again), and when
// it was freed (the time of the call if it still is not).
func watchSweepLock(ctx context.Context, rdb *redis.Client) func() (freed time.Time, orphaned bool) {
	first, err := rdb.PTTL(ctx, lock.SweepKey).Result()
	if err != nil || first <= sweepInterval { // no round's lease (after its round a node keeps it at most an interval)
		return func() (time.Time, bool) { return time.Time{}, false }
	}
	var freed time.Time
	orphaned := true
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}) // closed when the watch ends: freed and orphaned are then final
	go func() {
		defer close(done)
		for last := first; wctx.Err() == nil; {
			sleep(wctx, 50*time.Millisecond)
			ttl, err := rdb.PTTL(wctx, lock.SweepKey).Result()
			switch {
			case err != nil:
				continue
			case ttl < 0 && last > 200*time.Millisecond: // released with its lease left: a live node's round held it
				orphaned = false
			case ttl < 0: // its lease ran out: freed (a node may take it from now)
				freed = time.Now()
			case ttl > last+100*time.Millisecond: // renewed: a live node's round held it
				orphaned = false
			default:
				last = ttl
				continue
			}
			return
		}
	}()
	return func() (time.Time, bool) {
		cancel()
		<-done
		if !orphaned {
			return time.Time{}, false
		}
		if freed.IsZero() {
			return time.Now(), true
		}
		return freed, true
	}
}

// dueHolds reads the holds past their SKU's projector cursor, and which of
// them (by their projection, if the sweep or a transition wrote it) still
// hold their units though their deadline, and the sweep's resumption
// (sweepFreed, zero if it never stopped), are before cutoff.
func (r *Run) dueHolds(ctx context.Context, cutoff, sweepFreed time.Time) (*Outage, error) {
	o := &Outage{}
	rows, err := r.db.QueryContext(ctx, `SELECT h.id, h.name, h.sku, h.deadline FROM holds h JOIN skus s ON s.sku = h.sku
		WHERE h.qty > 0 AND h.seq > s.projected_seq`)
	if err != nil {
		return nil, err
	}
	type hold struct {
		token, sku string
		deadline   time.Time
	}
	var due []hold
	for rows.Next() {
		var id []byte
		var name sql.NullString
		var h hold
		if err := rows.Scan(&id, &name, &h.sku, &h.deadline); err != nil {
			_ = rows.Close()
			return nil, err
		}
		o.Unprojected++
		if h.token = name.String; !name.Valid {
			u, err := uuid.FromBytes(id)
			if err != nil {
				_ = rows.Close()
				return nil, err
			}
			h.token = u.String()
		}
		if h.deadline.Before(cutoff) {
			due = append(due, h)
		}
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, err
	}
	o.Due = int64(len(due))
	if !sweepFreed.Before(cutoff) { // no sweep could run since: each hold waits for one
		return o, nil
	}
	for _, h := range due {
		var state string
		err := r.db.QueryRowContext(ctx, `SELECT state FROM stock_reservations WHERE token = ? AND sku = ?`, h.token, h.sku).Scan(&state)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			o.Late++ // not even projected: nothing released it
			state = "not projected"
		case err != nil:
			return nil, err
		case state == "HELD":
			o.Late++
		default:
			continue
		}
		if len(o.late) < 5 {
			o.late = append(o.late, fmt.Sprintf("%s of %s due at %s (%s before the check), %s",
				h.token, h.sku, h.deadline.Format("15:04:05.000"), time.Since(h.deadline).Round(100*time.Millisecond), state))
		}
	}
	return o, nil
}

// projectorOutage is how long no node projects in projector-kill: long
// enough that holds made after the kill fall due, and a sweep and 2 s
// more pass, before it ends (an order's hold and twice that).
const projectorOutage = orderTTL + 2*(sweepInterval+2*time.Second)

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

// warnings are the last few warning and error lines of the fleet's logs
// that mention any of words (what a failed check's message carries, so a
// run whose logs are gone still says what the service knew).
func (r *Run) warnings(words ...string) string {
	var found []string
	for _, in := range r.fleet {
		b, err := os.ReadFile(in.log)
		if err != nil {
			found = append(found, fmt.Sprintf("%s: %v", in.Name, err))
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.Contains(line, "WARN") && !strings.Contains(line, "ERROR") {
				continue
			}
			if slices.ContainsFunc(words, func(w string) bool { return strings.Contains(line, w) }) {
				found = append(found, in.Name+": "+line)
			}
		}
	}
	if len(found) == 0 {
		return "none"
	}
	return strings.Join(found[max(0, len(found)-8):], " | ")
}
