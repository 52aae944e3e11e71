package wirecount_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/acme/inventory/testkit/testenv"
	"github.com/acme/inventory/testkit/wirecount"
)

// packet is a MySQL protocol packet: header and payload.
func packet(seq byte, payload ...byte) []byte {
	n := len(payload)
	return append([]byte{byte(n), byte(n >> 8), byte(n >> 16), seq}, payload...)
}

func TestParserCountsCommandsAcrossWrites(t *testing.T) {
	const (
		query, execute, closeStmt, quit = wirecount.ComQuery, wirecount.ComStmtExecute, wirecount.ComStmtClose, wirecount.ComQuit
	)
	var stream []byte
	stream = append(stream, packet(1, 0xaa, 0xbb, 0xcc)...)                    // the handshake response: no command
	stream = append(stream, packet(0, query, 'S', 'E', 'L', 'E', 'C', 'T')...) // a query
	stream = append(stream, packet(0, execute, 1, 0, 0, 0)...)                 // an execution
	stream = append(stream, packet(0, closeStmt, 1, 0, 0, 0)...)               // a close: no answer
	stream = append(stream, packet(0, query, query, query)...)                 // command bytes in a payload are not commands
	stream = append(stream, packet(2)...)                                      // an empty packet
	stream = append(stream, packet(0, quit)...)
	want := map[byte]int{query: 2, execute: 1, closeStmt: 1, quit: 1}
	// Whole, and split at every byte boundary into two writes, and one byte
	// per write.
	for split := 0; split <= len(stream); split++ {
		got := map[byte]int{}
		var p wirecount.Parser
		p.Consume(stream[:split], func(c byte) { got[c]++ })
		p.Consume(stream[split:], func(c byte) { got[c]++ })
		if len(got) != len(want) {
			t.Fatalf("split at %d: %v, want %v", split, got, want)
		}
		for c, n := range want {
			if got[c] != n {
				t.Fatalf("split at %d: %v, want %v", split, got, want)
			}
		}
	}
	got := map[byte]int{}
	var p wirecount.Parser
	for i := range stream {
		p.Consume(stream[i:i+1], func(c byte) { got[c]++ })
	}
	if got[query] != 2 || got[quit] != 1 {
		t.Fatalf("byte by byte: %v", got)
	}
}

func TestCountRoundTrips(t *testing.T) {
	var w wirecount.Count
	w[wirecount.ComQuery], w[wirecount.ComStmtExecute], w[wirecount.ComStmtClose], w[wirecount.ComQuit], w[wirecount.ComPing] = 5, 2, 2, 1, 1
	if got := w.RoundTrips(); got != 8 {
		t.Fatalf("round trips %d, want 8 (queries, executions, ping; not close or quit)", got)
	}
	var before wirecount.Count
	before[wirecount.ComQuery] = 3
	if got := w.Since(before)[wirecount.ComQuery]; got != 2 {
		t.Fatalf("since: %d", got)
	}
}

// On the real server: a transaction of one statement through the counted
// network is BEGIN, the statement and COMMIT; two statements sent as one
// query (multiStatements) are one round trip.
func TestCountsOnTheWire(t *testing.T) {
	c := wirecount.Network("wirecount-test")
	counted, ok := c.DSN(testenv.MySQLDSN())
	if !ok {
		t.Fatalf("%s names no tcp(...) address", testenv.MySQLDSN())
	}
	cfg, err := mysql.ParseDSN(counted)
	if err != nil {
		t.Fatal(err)
	}
	cfg.InterpolateParams = true
	cfg.MultiStatements = true
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("MariaDB of make up: %v", err)
	}
	before := c.Read()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var one int
	if err := tx.QueryRowContext(ctx, "SELECT ?", 1).Scan(&one); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	got := c.Read().Since(before)
	if got.RoundTrips() != 3 || got[wirecount.ComQuery] != 3 {
		t.Fatalf("BEGIN, SELECT, COMMIT: %d round trips, %d queries", got.RoundTrips(), got[wirecount.ComQuery])
	}

	before = c.Read()
	rows, err := db.QueryContext(ctx, "DO 1; SELECT ?", 2)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	if got := c.Read().Since(before).RoundTrips(); got != 1 {
		t.Fatalf("two statements in one query: %d round trips", got)
	}
}
