package main

import (
	"sync"

	"github.com/acme/inventory/testkit/wirecount"
)

// The database round trips a phase costs, counted on the wire
// (testkit/wirecount): a service started with a DSN whose network is
// wireNet dials MariaDB through connections whose commands are counted.
// Every statement, BEGIN, COMMIT and ping the process sends is one; GORM's
// callbacks see only the statements.

// wireNet is the DSN network (user:pass@benchwire(host:port)/db) whose
// connections are counted.
const wireNet = "benchwire"

// wire is wireNet's counter, registered once.
var wire = sync.OnceValue(func() *wirecount.Counter { return wirecount.Network(wireNet) })

// wireDSN is dsn with its network turned into wireNet; false when dsn
// names no tcp(...) address (nothing is counted).
func wireDSN(dsn string) (string, bool) { return wire().DSN(dsn) }

// readWire is a snapshot of the commands counted on wireNet.
func readWire() wirecount.Count { return wire().Read() }
