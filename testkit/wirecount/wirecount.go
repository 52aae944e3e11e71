// Package wirecount counts the database round trips a process costs, on
// the wire: a DSN whose network is a Counter's (user:pass@name(host:port)/db)
// dials MariaDB through a connection that reads the MySQL protocol's
// packets the client writes and counts each command (a packet with
// sequence number 0 after the handshake) by its type. Every statement,
// BEGIN, COMMIT and ping the process sends is one, and so is a text of
// several statements sent as one query; GORM's callbacks see only the
// statements it runs itself. The benchmarks (cmd/benchtable) and the tests
// that hold a path to a number of round trips read it.
package wirecount

import (
	"context"
	"net"
	"strings"
	"sync/atomic"

	"github.com/go-sql-driver/mysql"
)

// MySQL protocol commands.
const (
	ComQuit         = 0x01
	ComQuery        = 0x03
	ComPing         = 0x0e
	ComStmtPrepare  = 0x16
	ComStmtExecute  = 0x17
	ComStmtLongData = 0x18
	ComStmtClose    = 0x19
)

// Counter counts the commands sent on the connections of its network.
type Counter struct {
	name string
	cmds [256]atomic.Int64
}

// Network registers name as a MySQL DSN network with the driver (once per
// name, for the process's life) and returns its counter: its connections
// are TCP connections whose commands the counter counts.
func Network(name string) *Counter {
	c := &Counter{name: name}
	mysql.RegisterDialContext(name, func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return &countedConn{Conn: conn, c: c}, nil
	})
	return c
}

// DSN is dsn with its tcp network turned into the counter's; false when
// dsn names no tcp(...) address (nothing would be counted).
func (c *Counter) DSN(dsn string) (string, bool) {
	return strings.Replace(dsn, "@tcp(", "@"+c.name+"(", 1), strings.Contains(dsn, "@tcp(")
}

// Read is a snapshot of what was counted so far.
func (c *Counter) Read() Count {
	var w Count
	for i := range c.cmds {
		w[i] = c.cmds[i].Load()
	}
	return w
}

// Count is the commands counted, by type.
type Count [256]int64

// Since is what was counted after before.
func (w Count) Since(before Count) Count {
	for i := range w {
		w[i] -= before[i]
	}
	return w
}

// RoundTrips is the commands the server answers (not COM_QUIT,
// COM_STMT_CLOSE, COM_STMT_SEND_LONG_DATA).
func (w Count) RoundTrips() int64 {
	var n int64
	for cmd, k := range w {
		switch cmd {
		case ComQuit, ComStmtClose, ComStmtLongData:
		default:
			n += k
		}
	}
	return n
}

// countedConn is a connection whose writes are parsed for commands.
type countedConn struct {
	net.Conn
	c *Counter
	p Parser
}

func (c *countedConn) Write(b []byte) (int, error) {
	c.p.Consume(b, func(cmd byte) { c.c.cmds[cmd].Add(1) })
	return c.Conn.Write(b)
}

// Parser follows the packets of one direction of a MySQL connection
// (4-byte header: 3-byte little-endian length, sequence number; then the
// payload), across writes that may split or join them, and reports the
// first payload byte of every packet with sequence number 0: a command.
type Parser struct {
	hdr     [4]byte
	hn      int  // header bytes read
	left    int  // payload bytes still to skip
	command bool // the next payload byte is a command's type
}

// Consume reads b, the next bytes written, and calls count with the type
// of each command that begins in them.
func (p *Parser) Consume(b []byte, count func(cmd byte)) {
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
