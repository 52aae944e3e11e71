// Package redislease says which process uses which database of the
// machine's test Redis, so the test processes and make bench, which flush
// theirs, never flush another's: a database is held by an flock on a file
// of its own, which the kernel releases when the process ends, however it
// ends (the processes and the Redis are on one machine).
package redislease

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// How the databases of the machine's test Redis are shared out. scripts/up.sh
// starts it with Databases (a server's count is fixed when it starts): 0 is
// left to `make run` and to people; the test processes lease the first free
// one of FirstTestDB..LastTestDB (testenv); BenchDB is make bench's
// (cmd/benchtable), which no test process is ever handed, so a bench run and
// the tests never flush each other's keys. The bench holds its database
// like a test process all the same: two runs of it, or a test process built
// before BenchDB left the tests' range, wait for each other.
const (
	Databases   = 32
	FirstTestDB = 1
	LastTestDB  = Databases - 2
	BenchDB     = Databases - 1
)

// ForTests reports whether db is one the test processes lease.
func ForTests(db int) bool { return db >= FirstTestDB && db <= LastTestDB }

// Lease is a database held until Release or the process's end.
type Lease struct {
	DB   int
	file *os.File
}

// Release lets another process have the database.
func (l *Lease) Release() { _ = l.file.Close() }

// Dir is where the processes of this machine keep their lock files on the
// test servers.
func Dir() string { return filepath.Join(os.TempDir(), "inventory-testenv") }

func path(addr string, db int) (string, error) {
	dir := Dir()
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return "", err
	}
	return filepath.Join(dir, fmt.Sprintf("redis-%s-%d.lock", strings.ReplaceAll(addr, ":", "_"), db)), nil
}

// TryHold holds database db of the Redis at addr if no other process
// does: ok false when one does.
func TryHold(addr string, db int) (l *Lease, ok bool, err error) {
	return hold(addr, db, syscall.LOCK_EX|syscall.LOCK_NB)
}

// Hold holds database db of the Redis at addr, waiting for the process
// that holds it to end.
func Hold(addr string, db int) (*Lease, error) {
	l, _, err := hold(addr, db, syscall.LOCK_EX)
	return l, err
}

func hold(addr string, db, how int) (*Lease, bool, error) {
	name, err := path(addr, db)
	if err != nil {
		return nil, false, err
	}
	f, err := os.OpenFile(name, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, false, err
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		_ = f.Close()
		if err == syscall.EWOULDBLOCK {
			return nil, false, nil
		}
		return nil, false, err
	}
	return &Lease{DB: db, file: f}, true, nil
}
