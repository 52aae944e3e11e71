package main

import (
	"context"
	"database/sql"
	"os"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// packet is a MySQL protocol packet: header and payload.
func packet(seq byte, payload ...byte) []byte {
	n := len(payload)
	return append([]byte{byte(n), byte(n >> 8), byte(n >> 16), seq}, payload...)
}

func TestWireParserCountsCommandsAcrossWrites(t *testing.T) {
	var stream []byte
	stream = append(stream, packet(1, 0xaa, 0xbb, 0xcc)...)                       // the handshake response: no command
	stream = append(stream, packet(0, comQuery, 'S', 'E', 'L', 'E', 'C', 'T')...) // a query
	stream = append(stream, packet(0, comStmtExecute, 1, 0, 0, 0)...)             // an execution
	stream = append(stream, packet(0, comStmtClose, 1, 0, 0, 0)...)               // a close: no answer
	stream = append(stream, packet(0, comQuery, comQuery, comQuery)...)           // command bytes in a payload are not commands
	stream = append(stream, packet(2)...)                                         // an empty packet
	stream = append(stream, packet(0, comQuit)...)
	want := map[byte]int{comQuery: 2, comStmtExecute: 1, comStmtClose: 1, comQuit: 1}
	// Whole, and split at every byte boundary into two writes, and one byte
	// per write.
	for split := 0; split <= len(stream); split++ {
		got := map[byte]int{}
		var p wireParser
		p.consume(stream[:split], func(c byte) { got[c]++ })
		p.consume(stream[split:], func(c byte) { got[c]++ })
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
	var p wireParser
	for i := range stream {
		p.consume(stream[i:i+1], func(c byte) { got[c]++ })
	}
	if got[comQuery] != 2 || got[comQuit] != 1 {
		t.Fatalf("byte by byte: %v", got)
	}
}

func TestWireCountRoundTrips(t *testing.T) {
	var w wireCount
	w[comQuery], w[comStmtExecute], w[comStmtClose], w[comQuit], w[comPing] = 5, 2, 2, 1, 1
	if got := w.roundTrips(); got != 8 {
		t.Fatalf("round trips %d, want 8 (queries, executions, ping; not close or quit)", got)
	}
	var before wireCount
	before[comQuery] = 3
	if got := w.since(before)[comQuery]; got != 2 {
		t.Fatalf("since: %d", got)
	}
}

// On the real server (INVENTORY_TEST_MYSQL_DSN or make up's): a
// transaction of one statement through the counted network is BEGIN, the
// statement and COMMIT.
func TestWireCountsARealTransaction(t *testing.T) {
	dsn := os.Getenv("INVENTORY_TEST_MYSQL_DSN")
	if dsn == "" {
		dsn = "inventory:inventory@tcp(127.0.0.1:3306)/"
	}
	counted, ok := wireDSN(dsn)
	if !ok {
		t.Fatalf("%s names no tcp(...) address", dsn)
	}
	cfg, err := mysql.ParseDSN(counted)
	if err != nil {
		t.Fatal(err)
	}
	cfg.InterpolateParams = true
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("MariaDB of make up: %v", err)
	}
	before := readWire()
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
	got := readWire().since(before)
	if got.roundTrips() != 3 || got[comQuery] != 3 {
		t.Fatalf("BEGIN, SELECT, COMMIT: %d round trips, %d queries", got.roundTrips(), got[comQuery])
	}
}
