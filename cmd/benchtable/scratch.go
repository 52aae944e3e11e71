package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A run leaves nothing on the servers but what it reports: every database
// openDatabase creates is the run's scratch, dropped when the run ends,
// however it ends short of being killed outright: at main's return, on a
// failure (must) and on an interrupt (SIGINT, SIGTERM). main registers the
// rest of its ending the same way (the Redis database flushed, then its
// lease released). A run killed by SIGKILL leaves them; the next run with
// the same -db-prefix resets and then drops them.

// scratch is the databases this run made, in order, each with the server
// DSN it was made through.
var scratch struct {
	sync.Mutex
	databases []scratchDatabase
}

type scratchDatabase struct{ dsnBase, name string }

// noteScratch records database name, made through dsnBase, as this run's.
func noteScratch(dsnBase, name string) {
	scratch.Lock()
	defer scratch.Unlock()
	d := scratchDatabase{dsnBase, name}
	if !slices.Contains(scratch.databases, d) {
		scratch.databases = append(scratch.databases, d)
	}
}

// dropLockWait bounds how long a DROP DATABASE waits for a table's
// metadata lock: on an interrupt the service may still hold a transaction
// on one.
const dropLockWait = 10 * time.Second

// dropScratch drops every database this run made and forgets them; it
// returns the names it dropped. It never exits: it runs while exiting.
func dropScratch() (dropped []string, err error) {
	scratch.Lock()
	ds := scratch.databases
	scratch.databases = nil
	scratch.Unlock()
	var errs []string
	for _, d := range ds {
		if e := dropDatabase(d.dsnBase, d.name); e != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", d.name, e))
			continue
		}
		dropped = append(dropped, d.name)
	}
	if len(errs) > 0 {
		err = fmt.Errorf("dropping the run's databases: %s", strings.Join(errs, "; "))
	}
	return dropped, err
}

func dropDatabase(dsnBase, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), dropLockWait+5*time.Second)
	defer cancel()
	admin, err := sql.Open("mysql", dsnBase)
	if err != nil {
		return err
	}
	defer admin.Close()
	conn, err := admin.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, fmt.Sprintf("SET SESSION lock_wait_timeout = %d", int(dropLockWait.Seconds()))); err != nil {
		return err
	}
	_, err = conn.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+strings.ReplaceAll(name, "`", "``")+"`")
	return err
}

// ending is what runs when the run ends, last registered first, once.
var ending struct {
	sync.Mutex
	steps []func()
	once  sync.Once
}

// atEnd registers f to run when the run ends (main returns, must fails or
// the run is interrupted); f must not call must.
func atEnd(f func()) {
	ending.Lock()
	defer ending.Unlock()
	ending.steps = append(ending.steps, f)
}

// end runs the registered steps, last first; later calls (another
// goroutine's failure, an interrupt meanwhile) wait for the first's.
func end() {
	ending.once.Do(func() {
		ending.Lock()
		steps := slices.Clone(ending.steps)
		ending.Unlock()
		for i := len(steps) - 1; i >= 0; i-- {
			steps[i]()
		}
	})
}

// exit ends the run and the process with code.
func exit(code int) {
	end()
	os.Exit(code)
}

// endOnInterrupt ends the run on SIGINT or SIGTERM (exit status 130), so an
// interrupted run drops its databases too.
func endOnInterrupt() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-ch
		fmt.Fprintf(os.Stderr, "\nbenchtable: %v: dropping the run's databases\n", s)
		exit(130)
	}()
}

// dropScratchAtEnd registers dropScratch as a step of the run's end,
// saying on stderr what it dropped.
func dropScratchAtEnd() {
	atEnd(func() {
		dropped, err := dropScratch()
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchtable:", err)
		}
		if len(dropped) > 0 {
			fmt.Fprintf(os.Stderr, "benchtable: dropped the run's databases: %s\n", strings.Join(dropped, ", "))
		}
	})
}
