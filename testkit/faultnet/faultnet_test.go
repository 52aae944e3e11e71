package faultnet_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/testkit/faultnet"
	"github.com/acme/inventory/testkit/servers"
)

// startTestRedis starts a redis-server of the test's own (testkit/servers)
// on a free port, stopped when the test ends: a link's tests count and
// close its connections, which a shared server would not allow.
func startTestRedis(t *testing.T) *servers.Redis {
	t.Helper()
	r, err := servers.StartRedis(t.TempDir(), servers.FreePort())
	require.NoError(t, err, "redis start")
	t.Cleanup(r.Close)
	return r
}

// TestLinkSwitch: a switched link closes every connection to the old
// upstream and sends new ones to the new upstream; after Close nothing
// listens.
func TestLinkSwitch(t *testing.T) {
	ctx := context.Background()
	a, b := startTestRedis(t), startTestRedis(t)
	require.NoError(t, a.Client().Set(ctx, "who", "a", 0).Err())
	require.NoError(t, b.Client().Set(ctx, "who", "b", 0).Err())

	p, err := faultnet.New().Link("switch", "127.0.0.1:"+strconv.Itoa(servers.FreePort()), a.Addr())
	require.NoError(t, err)
	t.Cleanup(p.Close)

	c := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	require.Equal(t, "a", c.Get(ctx, "who").Val())

	raw, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer raw.Close()
	rd := bufio.NewReader(raw)
	_, err = raw.Write([]byte("PING\r\n"))
	require.NoError(t, err)
	line, err := rd.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "+PONG\r\n", line)
	require.EqualValues(t, 2, infoClients(t, a), "the raw connection and go-redis's go to a")

	require.NoError(t, p.Switch(b.Addr()))
	require.NoError(t, raw.SetReadDeadline(time.Now().Add(2*time.Second)))
	_, err = rd.ReadString('\n')
	var ne net.Error
	require.Error(t, err)
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the old connection is closed, not idle: %v", err)
	require.Eventually(t, func() bool { return infoClients(t, a) == 0 }, 2*time.Second, 20*time.Millisecond,
		"the connections to a are closed")

	require.Equal(t, "b", c.Get(ctx, "who").Val(), "a new command reaches the new target")

	p.Close()
	require.Error(t, c.Ping(ctx).Err(), "nothing listens after Close")
}

// TestLinkBlackhole: a blackholed link keeps its connections open and
// passes no byte either way, for open connections and new ones; healed, it
// delivers what was held, on the same connections. Latency and bandwidth
// slow it down and heal as well.
func TestLinkBlackhole(t *testing.T) {
	a := startTestRedis(t)
	p, err := faultnet.New().Link("blackhole", "127.0.0.1:"+strconv.Itoa(servers.FreePort()), a.Addr())
	require.NoError(t, err)
	t.Cleanup(p.Close)

	open, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer open.Close()
	rd := bufio.NewReader(open)
	ping := func(c net.Conn, rd *bufio.Reader, wait time.Duration) (string, error) {
		if _, err := c.Write([]byte("PING\r\n")); err != nil {
			return "", err
		}
		require.NoError(t, c.SetReadDeadline(time.Now().Add(wait)))
		return rd.ReadString('\n')
	}
	line, err := ping(open, rd, 2*time.Second)
	require.NoError(t, err)
	require.Equal(t, "+PONG\r\n", line)

	require.NoError(t, p.Blackhole())
	_, err = ping(open, rd, 300*time.Millisecond)
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "no answer, and no close either: %v", err)
	fresh, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err, "a new connection is accepted")
	defer fresh.Close()
	frd := bufio.NewReader(fresh)
	_, err = ping(fresh, frd, 300*time.Millisecond)
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "and gets nothing: %v", err)

	require.NoError(t, p.Heal())
	for _, c := range []struct {
		conn net.Conn
		rd   *bufio.Reader
	}{{open, rd}, {fresh, frd}} {
		require.NoError(t, c.conn.SetReadDeadline(time.Now().Add(2*time.Second)))
		line, err := c.rd.ReadString('\n')
		require.NoError(t, err, "the held PING is delivered after the heal")
		require.Equal(t, "+PONG\r\n", line)
		line, err = ping(c.conn, c.rd, 2*time.Second)
		require.NoError(t, err, "and the connection works on")
		require.Equal(t, "+PONG\r\n", line)
	}

	require.NoError(t, p.Latency(200, 0))
	t0 := time.Now()
	_, err = ping(open, rd, 2*time.Second)
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(t0), 180*time.Millisecond, "latency")
	require.NoError(t, p.Heal())
	require.NoError(t, p.Bandwidth(1))
	t0 = time.Now()
	_, err = open.Write([]byte("SET k " + strings.Repeat("x", 2000) + "\r\n"))
	require.NoError(t, err)
	require.NoError(t, open.SetReadDeadline(time.Now().Add(5*time.Second)))
	line, err = rd.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "+OK\r\n", line)
	require.GreaterOrEqual(t, time.Since(t0), time.Second, "2 KB at 1 KB/s")
	require.NoError(t, p.Heal())
}

// infoClients is the number of client connections r has, not counting the
// one asking.
func infoClients(t *testing.T, r *servers.Redis) int {
	t.Helper()
	list, err := r.Client().ClientList(context.Background()).Result()
	require.NoError(t, err)
	return len(strings.Split(strings.TrimSpace(list), "\n")) - 1
}
