package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// floorPhase is the name of the floor's phase (its CPU is measured under it).
const floorPhase = "floor: group-committed INSERT, one row per sale"

// floorRun measures the floor of a durable sale on this database: the
// cheapest durable, group-committed write of one row per sale. n clients
// each queue one row (a sale's id, a UUIDv7 as an order's, and its
// quantity) and wait until it is committed, as the seckill phase's buyers
// wait for their 201; up to writers transactions are in flight at once, as
// the service's group commit allows, each one multi-row INSERT of up to
// batch rows (the seckill phase's mean batch) into a table with only its
// primary key, then COMMIT. What the database spends per row here is what
// any design that makes each sale durable must spend at least; the sale's
// cost beside it says how far the design is from that.
func floorRun(ctx context.Context, dsnBase string, n, writers, batch int, d time.Duration) httpResult {
	db := openDatabase(ctx, dsnBase, *dbPrefix+"_floor")
	defer db.Close()
	must(exec1(db, `DROP TABLE IF EXISTS floor_sales`))
	must(exec1(db, `CREATE TABLE floor_sales (id VARCHAR(40) NOT NULL PRIMARY KEY, qty INT NOT NULL)
		ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`))
	batch = max(batch, 1)

	type req struct {
		id   string
		done chan error
	}
	queue := make(chan req, n)
	var commits, rows atomic.Int64
	var writersDone sync.WaitGroup
	for range writers {
		writersDone.Add(1)
		go func() {
			defer writersDone.Done()
			reqs := make([]req, 0, batch)
			args := make([]any, 0, 2*batch)
			for first := range queue {
				reqs = append(reqs[:0], first)
			fill:
				for len(reqs) < batch {
					select {
					case r, ok := <-queue:
						if !ok {
							break fill
						}
						reqs = append(reqs, r)
					default:
						break fill
					}
				}
				args = args[:0]
				for _, r := range reqs {
					args = append(args, r.id, 1)
				}
				q := "INSERT INTO floor_sales (id, qty) VALUES " + strings.Repeat("(?, ?), ", len(reqs)-1) + "(?, ?)"
				err := func() error {
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					if _, err := tx.ExecContext(ctx, q, args...); err != nil {
						_ = tx.Rollback()
						return err
					}
					return tx.Commit()
				}()
				if err == nil {
					commits.Add(1)
					rows.Add(int64(len(reqs)))
				}
				for _, r := range reqs {
					r.done <- err
				}
			}
		}()
	}

	prog.phase(floorPhase)
	stopCPU := measureCPU(floorPhase)
	lat := make([][]time.Duration, n)
	var failed atomic.Int64
	stop := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			done := make(chan error, 1)
			for time.Now().Before(stop) {
				t0 := time.Now()
				queue <- req{id: uuid.Must(uuid.NewV7()).String(), done: done}
				if err := <-done; err != nil {
					failed.Add(1)
					continue
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	stopCPU()
	close(queue)
	writersDone.Wait()

	r := httpResult{name: floorPhase, rate: float64(rows.Load()) / elapsed.Seconds(), rows: rows.Load()}
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) > 0 {
		r.p50, r.p99 = all[len(all)/2], all[len(all)*99/100]
	}
	if c := commits.Load(); c > 0 {
		r.note = fmt.Sprintf("no HTTP; %d commits of %.1f rows (at most %d, the selling phase's mean batch), %d writers",
			c, float64(rows.Load())/float64(c), batch, writers)
	}
	if f := failed.Load(); f > 0 {
		r.note += fmt.Sprintf("; %d failed", f)
	}
	return r
}

// meanBatch is the seckill phase's mean group commit, rounded, for the
// floor to write alike (1 when it committed nothing).
func meanBatch(requests, commits int64) int {
	if commits == 0 {
		return 1
	}
	return max(int(math.Round(float64(requests)/float64(commits))), 1)
}
