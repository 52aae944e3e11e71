package main

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/go-sql-driver/mysql"
)

// The database round trips a phase costs, counted on the wire: a service
// started with a DSN whose network is wireNet dials MariaDB through
// wireConn, which reads the MySQL protocol's packets the client writes and
// counts each command (a packet with sequence number 0 after the
// handshake) by its type. Every statement, BEGIN, COMMIT and ping the
// process sends is one; GORM's callbacks see only the statements.

// wireNet is the DSN network (user:pass@benchwire(host:port)/db) whose
// connections are counted.
const wireNet = "benchwire"

// MySQL protocol commands that the server does not answer: they cost no
// round trip.
const (
	comQuit         = 0x01
	comQuery        = 0x03
	comPing         = 0x0e
	comStmtPrepare  = 0x16
	comStmtExecute  = 0x17
	comStmtLongData = 0x18
	comStmtClose    = 0x19
)

// wireCommands counts the commands sent on wireNet's connections, by type.
var wireCommands [256]atomic.Int64

var registerWire sync.Once

// wireDSN is dsn with its network turned into wireNet (registered once);
// false when dsn names no tcp(...) address (nothing is counted).
func wireDSN(dsn string) (string, bool) {
	registerWire.Do(func() {
		mysql.RegisterDialContext(wireNet, func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			return &wireConn{Conn: c}, nil
		})
	})
	return strings.Replace(dsn, "@tcp(", "@"+wireNet+"(", 1), strings.Contains(dsn, "@tcp(")
}

// wireConn is a connection whose writes are parsed for commands.
type wireConn struct {
	net.Conn
	p wireParser
}

func (c *wireConn) Write(b []byte) (int, error) {
	c.p.consume(b, func(cmd byte) { wireCommands[cmd].Add(1) })
	return c.Conn.Write(b)
}

// wireParser follows the packets of one direction of a MySQL connection
// (4-byte header: 3-byte little-endian length, sequence number; then the
// payload), across writes that may split or join them, and reports the
// first payload byte of every packet with sequence number 0: a command.
type wireParser struct {
	hdr     [4]byte
	hn      int  // header bytes read
	left    int  // payload bytes still to skip
	command bool // the next payload byte is a command's type
}

func (p *wireParser) consume(b []byte, count func(cmd byte)) {
	for len(b) > 0 {
		if p.left == 0 {
			n := copy(p.hdr[p.hn:], b)
			p.hn += n
			b = b[n:]
			if p.hn < 4 {
				return
			}
			p.hn = 0
			p.left = int(p.hdr[0]) | int(p.hdr[1])<<8 | int(p.hdr[2])<<16
			p.command = p.hdr[3] == 0 && p.left > 0
			continue
		}
		if p.command {
			count(b[0])
			p.command = false
		}
		n := min(p.left, len(b))
		p.left -= n
		b = b[n:]
	}
}

// wireCount is a snapshot of wireCommands.
type wireCount [256]int64

func readWire() wireCount {
	var w wireCount
	for i := range wireCommands {
		w[i] = wireCommands[i].Load()
	}
	return w
}

// since is what was counted after before.
func (w wireCount) since(before wireCount) wireCount {
	for i := range w {
		w[i] -= before[i]
	}
	return w
}

// roundTrips is the commands the server answers.
func (w wireCount) roundTrips() int64 {
	var n int64
	for cmd, k := range w {
		switch cmd {
		case comQuit, comStmtClose, comStmtLongData:
		default:
			n += k
		}
	}
	return n
}
