package main

// What a group commit's time is made of (issue 33), measured: the seckill
// selling phase twice back to back, first at the server's own
// innodb_flush_log_at_trx_commit (1: the redo log written and flushed at
// every commit) and then at 2 (written at commit, flushed once a second),
// set for that phase only by SET GLOBAL and restored right after; for each,
// the group commits' count and mean time as the service timed them, and the
// server's own counters over the phase: data-file and log fsyncs, and the
// waits for a row lock (the hot SKU's row, which each batch's conditional
// UPDATE holds until its COMMIT, so the other writer's batch waits for it).
// Beside them, what one fdatasync of 4 KiB costs on the filesystem of the
// server's datadir when it is on this machine. The binary log's sync_binlog
// is reported and matters only with log_bin on; the writers' count is the
// group commit's constant (internal/groupcommit), not varied here.

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/acme/inventory/internal/app"
)

// serverStatus reads the named global status counters.
func serverStatus(ctx context.Context, db *sql.DB, names ...string) map[string]int64 {
	q := "SHOW GLOBAL STATUS WHERE Variable_name IN ('" + strings.Join(names, "','") + "')"
	rows, err := db.QueryContext(ctx, q)
	must(err)
	defer rows.Close()
	m := map[string]int64{}
	for rows.Next() {
		var name string
		var v int64
		must(rows.Scan(&name, &v))
		m[name] = v
	}
	must(rows.Err())
	return m
}

var commitCounters = []string{"Innodb_data_fsyncs", "Innodb_row_lock_waits", "Innodb_row_lock_time", "Innodb_log_writes", "Com_commit"}

// commitSide is one phase of the breakdown.
type commitSide struct {
	setting         string
	r               httpResult
	commits, orders int64
	nanos           int64
	status          map[string]int64 // counter deltas over the phase
}

func (s commitSide) row() string {
	if s.commits == 0 {
		return fmt.Sprintf("| %s | %.0f | %s | %s | 0 | – | – | – | – | – |\n", s.setting, s.r.rate, dur(s.r.p50), dur(s.r.p99))
	}
	per := func(k string) float64 { return float64(s.status[k]) / float64(s.commits) }
	waitMs := "–"
	if w := s.status["Innodb_row_lock_waits"]; w > 0 {
		waitMs = fmt.Sprintf("%.1f", float64(s.status["Innodb_row_lock_time"])/float64(w))
	}
	return fmt.Sprintf("| %s | %.0f | %s | %s | %d | %.1f | %s | %.2f | %.2f | %s |\n", s.setting, s.r.rate, dur(s.r.p50), dur(s.r.p99),
		s.commits, float64(s.orders)/float64(s.commits), dur(time.Duration(s.nanos/s.commits)),
		per("Innodb_data_fsyncs"), per("Innodb_row_lock_waits"), waitMs)
}

// commitBreakdown runs the breakdown (see above) and records its table in
// ar.breakdown; it returns the phases it ran.
func (ar *arrivalRun) commitBreakdown(ctx context.Context, a *app.App, dsnBase, url string, header func(w int) http.Header) []httpResult {
	if !*flushCheck {
		ar.breakdown = "\nThe commit-latency breakdown was not run (-flush-check=false).\n"
		return nil
	}
	db := openDatabase(ctx, dsnBase, *dbPrefix+"_http")
	defer db.Close()
	db.SetMaxOpenConns(2)
	var flush, syncBinlog, logBin int
	var flushMethod, datadir string
	must(db.QueryRowContext(ctx, `SELECT @@GLOBAL.innodb_flush_log_at_trx_commit, @@GLOBAL.sync_binlog, @@GLOBAL.log_bin,
		@@GLOBAL.innodb_flush_method, @@GLOBAL.datadir`).Scan(&flush, &syncBinlog, &logBin, &flushMethod, &datadir))
	empty := func(int, int64) string { return `{}` }
	measure := func(setting string) commitSide {
		name := "seckill, selling, " + setting
		before := serverStatus(ctx, db, commitCounters...)
		cs := a.Commits.Stats()
		n0, o0, ns0 := cs.Commits.Load(), cs.Requests.Load(), cs.Nanos.Load()
		var batch int
		r := withGroupCommits(a, &batch, func() httpResult { return load(name, url, *workers, *duration, header, empty) })
		side := commitSide{setting: setting, r: r, commits: cs.Commits.Load() - n0, orders: cs.Requests.Load() - o0, nanos: cs.Nanos.Load() - ns0,
			status: serverStatus(ctx, db, commitCounters...)}
		for k, v := range side.status {
			side.status[k] = v - before[k]
		}
		return side
	}
	sides := []commitSide{measure(fmt.Sprintf("innodb_flush_log_at_trx_commit=%d (the server's)", flush))}
	var b strings.Builder
	if flush != 2 {
		fmt.Fprintf(os.Stderr, "benchtable: SET GLOBAL innodb_flush_log_at_trx_commit = 2 for one phase; if this run dies before it is restored: SET GLOBAL innodb_flush_log_at_trx_commit = %d\n", flush)
		if _, err := db.ExecContext(ctx, "SET GLOBAL innodb_flush_log_at_trx_commit = 2"); err != nil {
			fmt.Fprintf(&b, "\ninnodb_flush_log_at_trx_commit=2 could not be set (%v): the breakdown has the server's setting only.\n", err)
		} else {
			func() {
				defer func() {
					if _, err := db.ExecContext(context.Background(), fmt.Sprintf("SET GLOBAL innodb_flush_log_at_trx_commit = %d", flush)); err != nil {
						fmt.Fprintf(os.Stderr, "benchtable: could not restore innodb_flush_log_at_trx_commit = %d: %v\n", flush, err)
					}
				}()
				sides = append(sides, measure("innodb_flush_log_at_trx_commit=2, this phase only"))
			}()
		}
	}
	fmt.Fprintf(&b, "\n| commit-latency breakdown, seckill selling closed loop, %d clients, back to back | requests/s | p50 | p99 | group commits | orders per commit | time per commit | data fsyncs per commit | row-lock waits per commit | ms per row-lock wait |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n", *workers)
	var rs []httpResult
	for _, s := range sides {
		b.WriteString(s.row())
		rs = append(rs, s.r)
	}
	if len(sides) == 2 && sides[0].commits > 0 && sides[1].commits > 0 {
		t1, t2 := sides[0].nanos/sides[0].commits, sides[1].nanos/sides[1].commits
		fmt.Fprintf(&b, "\nA group commit took %s with the redo log flushed at each commit and %s without: the flush is %s of it (%.0f%%), the rest the batch's statements, "+
			"the wait for the hot row's lock (counted above; the server's counters are global, so another client's waits on this server land there too) and the round trips. ",
			dur(time.Duration(t1)), dur(time.Duration(t2)), dur(time.Duration(t1-t2)), 100*float64(t1-t2)/float64(t1))
	}
	fmt.Fprintf(&b, "Server settings: innodb_flush_method %s, log_bin %d, sync_binlog %d (no binary log: nothing to sync for it); the group commit has 2 writers (a constant of internal/groupcommit).\n",
		flushMethod, logBin, syncBinlog)
	b.WriteString(fsyncProbe(datadir))
	ar.breakdown = b.String()
	return rs
}

// fsyncProbe times 200 fdatasyncs of a 4 KiB write in a file on the
// filesystem of datadir (in the temporary directory, when it is on the
// same device; nothing is written into the server's own directory).
func fsyncProbe(datadir string) string {
	var dd, tmp syscall.Stat_t
	if syscall.Stat(datadir, &dd) != nil {
		return fmt.Sprintf("The datadir %s is not on this machine: no fsync probe.\n", datadir)
	}
	if syscall.Stat(os.TempDir(), &tmp) != nil || tmp.Dev != dd.Dev {
		return fmt.Sprintf("The temporary directory is not on the datadir's (%s) filesystem: no fsync probe.\n", datadir)
	}
	f, err := os.CreateTemp("", "benchtable-fsync")
	if err != nil {
		return fmt.Sprintf("fsync probe: %v\n", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 4096)
	var lat []time.Duration
	for i := range 200 {
		t0 := time.Now()
		if _, err := f.WriteAt(buf, int64(i%16)*4096); err != nil {
			return fmt.Sprintf("fsync probe: %v\n", err)
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			return fmt.Sprintf("fsync probe: %v\n", err)
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	d := distribution(lat)
	return fmt.Sprintf("One 4 KiB write and fdatasync on the datadir's filesystem (%d, this process, outside the server): p50 %s, p99 %s, max %s.\n", d.n, dur(d.p50), dur(d.p99), dur(d.max))
}
