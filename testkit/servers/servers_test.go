package servers

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// requireGone fails unless the process group led by pid has no process left.
func requireGone(t *testing.T, pid int) {
	t.Helper()
	require.Eventually(t, func() bool {
		return errors.Is(syscall.Kill(-pid, 0), syscall.ESRCH)
	}, 5*time.Second, 20*time.Millisecond, "process group %d still has processes", pid)
}

func timed(t *testing.T, what string, f func() error) {
	t.Helper()
	start := time.Now()
	require.NoError(t, f(), what)
	t.Logf("%s: %s", what, time.Since(start).Round(time.Millisecond))
}

func startTestRedis(t *testing.T) *Redis {
	t.Helper()
	var r *Redis
	timed(t, "redis start", func() (err error) {
		r, err = StartRedis(t.TempDir(), FreePort())
		return err
	})
	t.Cleanup(r.Close)
	return r
}

func TestServersRedisKillStart(t *testing.T) {
	ctx := context.Background()
	r := startTestRedis(t)
	c := r.Client()
	require.NoError(t, c.Set(ctx, "k", "v", 0).Err())
	pid := r.proc.pid

	require.NoError(t, r.Kill())
	requireGone(t, pid)
	require.Error(t, c.Ping(ctx).Err())
	require.NoError(t, r.Kill(), "killing a dead server does nothing")

	timed(t, "redis restart", r.Start)
	require.Error(t, r.Start(), "already running")
	require.ErrorIs(t, c.Get(ctx, "k").Err(), redis.Nil, "no persistence: the key is gone")
	require.NoError(t, c.Set(ctx, "k2", "v", 0).Err())

	pid = r.proc.pid
	r.Close()
	requireGone(t, pid)
}

func TestServersRedisSnapshotRestartFrom(t *testing.T) {
	ctx := context.Background()
	r := startTestRedis(t)
	c := r.Client()
	require.NoError(t, c.Set(ctx, "a", "1", 0).Err())
	snap, err := r.Snapshot("s1")
	require.NoError(t, err)
	require.Equal(t, filepath.Join(r.dir, "s1.rdb"), snap)
	require.NoFileExists(t, filepath.Join(r.dir, "dump.rdb"))

	require.NoError(t, c.Set(ctx, "a", "2", 0).Err())
	require.NoError(t, c.Set(ctx, "b", "2", 0).Err())
	// A plain SAVE leaves a newer dump.rdb behind: it must not be what loads.
	require.NoError(t, c.Save(ctx).Err())
	require.FileExists(t, filepath.Join(r.dir, "dump.rdb"))

	timed(t, "redis restart from snapshot", func() error { return r.RestartFrom(snap) })
	require.Equal(t, "1", c.Get(ctx, "a").Val(), "back to the snapshot")
	require.ErrorIs(t, c.Get(ctx, "b").Err(), redis.Nil, "later writes are lost")
	require.NoFileExists(t, filepath.Join(r.dir, "dump.rdb"), "the copy is consumed")
	require.FileExists(t, snap, "the snapshot stays for another RestartFrom")

	require.NoError(t, r.Kill())
	require.NoError(t, r.Start())
	require.ErrorIs(t, c.Get(ctx, "a").Err(), redis.Nil, "a later Kill and Start comes back empty")

	require.NoError(t, c.Set(ctx, "c", "3", 0).Err())
	require.NoError(t, r.RestartFrom(snap))
	require.Equal(t, "1", c.Get(ctx, "a").Val())
	require.ErrorIs(t, c.Get(ctx, "c").Err(), redis.Nil)
}

func TestServersRedisReplicaPromote(t *testing.T) {
	ctx := context.Background()
	primary := startTestRedis(t)
	require.NoError(t, primary.Client().Set(ctx, "before", "1", 0).Err())

	var replica *Redis
	timed(t, "redis replica start (link up)", func() (err error) {
		replica, err = StartReplica(t.TempDir(), FreePort(), primary)
		return err
	})
	t.Cleanup(replica.Close)
	rc := replica.Client()
	require.Eventually(t, func() bool { return rc.Get(ctx, "before").Val() == "1" }, 5*time.Second, 20*time.Millisecond)
	require.NoError(t, primary.Client().Set(ctx, "during", "1", 0).Err())
	require.Eventually(t, func() bool { return rc.Get(ctx, "during").Val() == "1" }, 5*time.Second, 20*time.Millisecond)
	require.Error(t, rc.Set(ctx, "x", "1", 0).Err(), "a replica is read-only")

	require.NoError(t, replica.Promote())
	require.Equal(t, "master", infoField(rc.Info(ctx, "replication").Val(), "role"))
	require.NoError(t, primary.Client().Set(ctx, "after", "1", 0).Err())
	require.NoError(t, rc.Set(ctx, "x", "1", 0).Err(), "a promoted replica takes writes")
	time.Sleep(300 * time.Millisecond)
	require.ErrorIs(t, rc.Get(ctx, "after").Err(), redis.Nil, "the promoted replica no longer follows")
	require.Equal(t, "1", rc.Get(ctx, "during").Val())
	require.NoFileExists(t, filepath.Join(replica.dir, "dump.rdb"), "diskless replication")
}

func TestServersRedisCluster(t *testing.T) {
	ctx := context.Background()
	var cl *RedisCluster
	timed(t, "redis cluster start", func() (err error) {
		cl, err = StartRedisCluster(t.TempDir(), [3]int{FreePort(10000), FreePort(10000), FreePort(10000)})
		return err
	})
	t.Cleanup(cl.Close)
	require.Len(t, cl.Addrs(), 3)

	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	for i := range 100 {
		require.NoError(t, cc.Set(ctx, fmt.Sprintf("k%d", i), "v", 0).Err())
	}
	sizes := make([]int64, 3)
	for i, n := range cl.Nodes {
		sizes[i] = n.Client().DBSize(ctx).Val()
		require.Positive(t, sizes[i], "node %d holds keys", i)
	}

	pid := cl.Nodes[1].proc.pid
	timed(t, "redis cluster restart node", func() error { return cl.RestartNode(1) })
	requireGone(t, pid)
	require.FileExists(t, filepath.Join(cl.Nodes[1].dir, "nodes.conf"))
	require.Zero(t, cl.Nodes[1].Client().DBSize(ctx).Val(), "the restarted node comes back empty")
	require.Equal(t, sizes[0], cl.Nodes[0].Client().DBSize(ctx).Val())
	require.Equal(t, sizes[2], cl.Nodes[2].Client().DBSize(ctx).Val())
	for _, n := range cl.Nodes {
		require.Contains(t, n.Client().ClusterInfo(ctx).Val(), "cluster_state:ok")
	}
	missing := 0
	for i := range 100 {
		err := cc.Get(ctx, fmt.Sprintf("k%d", i)).Err()
		if errors.Is(err, redis.Nil) {
			missing++
		} else {
			require.NoError(t, err)
		}
	}
	require.EqualValues(t, sizes[1], missing, "exactly the restarted node's keys are gone")
	for i := range 100 {
		require.NoError(t, cc.Set(ctx, fmt.Sprintf("k%d", i), "w", 0).Err(), "every slot takes writes")
	}

	require.NoError(t, cl.FlushAll(ctx))
	for _, n := range cl.Nodes {
		require.Zero(t, n.Client().DBSize(ctx).Val())
	}
}

func TestServersMariaDB(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	port := FreePort()
	var m *MariaDB
	timed(t, "mariadb install and start", func() (err error) {
		m, err = StartMariaDB(dir, port)
		return err
	})
	t.Cleanup(func() { m.Close() })
	require.Contains(t, m.DSN("x"), "parseTime=true")
	require.Contains(t, m.DSN("x"), "@tcp(127.0.0.1:")

	require.NoError(t, m.CreateDatabase(ctx, "faults"))
	db, err := sql.Open("mysql", m.DSN("faults"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	_, err = db.ExecContext(ctx, "CREATE TABLE t (id INT PRIMARY KEY, at DATETIME NOT NULL) ENGINE=InnoDB")
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, "INSERT INTO t VALUES (1, NOW())")
	require.NoError(t, err)

	// The server authenticates: a wrong password is refused.
	bad, err := sql.Open("mysql", strings.Replace(m.DSN("faults"), mariadbPassword, "wrong", 1))
	require.NoError(t, err)
	require.ErrorContains(t, bad.PingContext(ctx), "Access denied")
	_ = bad.Close()

	pid := m.proc.pid
	require.NoError(t, m.Kill())
	requireGone(t, pid)
	require.Error(t, db.PingContext(ctx))
	timed(t, "mariadb restart after kill", m.Start)

	var at time.Time
	require.NoError(t, db.QueryRowContext(ctx, "SELECT at FROM t WHERE id = 1").Scan(&at), "the committed row survives the crash")
	require.WithinDuration(t, time.Now(), at, time.Hour)

	// A second StartMariaDB on the same dir reuses the datadir.
	m.Close()
	timed(t, "mariadb start on an installed datadir", func() (err error) {
		m, err = StartMariaDB(dir, port)
		return err
	})
	var n int
	require.NoError(t, db.QueryRowContext(ctx, "SELECT COUNT(*) FROM t").Scan(&n))
	require.Equal(t, 1, n)
	require.NoError(t, m.CreateDatabase(ctx, "faults"))
	require.Error(t, db.QueryRowContext(ctx, "SELECT COUNT(*) FROM t").Scan(&n), "CreateDatabase starts empty")
	pid = m.proc.pid
	m.Close()
	requireGone(t, pid)
}

// TestServersMessageBroker is this package's only test that starts JVMs. Its
// name leaves out "RocketMQ" so that make test's second pass (-run RocketMQ,
// scripts/test.sh) does not run it again.
func TestServersMessageBroker(t *testing.T) {
	dir := t.TempDir()
	var q *RocketMQ
	timed(t, "rocketmq name server and broker boot", func() (err error) {
		q, err = StartRocketMQ(dir, FreePort(), FreePort(-2, 1), "")
		return err
	})
	t.Cleanup(q.Close)
	t.Logf("broker: %s", firstLine(t, q.BrokerLog(), "boot success"))
	dial := func(addr string) error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err
	}
	require.NoError(t, dial(q.NameServer()))
	require.NoError(t, dial(q.Broker()))
	firstLog := q.BrokerLog()
	// The store must survive a restart: a file the broker made and one of ours.
	wheel := filepath.Join(dir, "store", "timerwheel")
	before, err := os.Stat(wheel)
	require.NoError(t, err)
	marker := filepath.Join(dir, "store", "faults-marker")
	require.NoError(t, os.WriteFile(marker, []byte("x"), 0o644))

	pid := q.broker.pid
	require.NoError(t, q.StopBroker())
	requireGone(t, pid)
	require.Error(t, dial(q.Broker()), "the broker is down")
	require.NoError(t, dial(q.NameServer()), "the name server stays up")

	timed(t, "rocketmq broker restart", q.StartBroker)
	require.NotEqual(t, firstLog, q.BrokerLog())
	require.Contains(t, firstLine(t, q.BrokerLog(), "boot success"), "boot success")
	require.NoError(t, dial(q.Broker()), "the broker answers again")
	after, err := os.Stat(wheel)
	require.NoError(t, err)
	require.True(t, os.SameFile(before, after), "the store is kept across restarts")
	require.FileExists(t, marker, "the store is kept across restarts")

	pids := []int{q.broker.pid, q.namesrv.pid}
	q.Close()
	for _, pid := range pids {
		requireGone(t, pid)
	}
}

// firstLine returns the first line of file that contains s, or "".
func firstLine(t *testing.T, file, s string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	for l := range strings.SplitSeq(string(b), "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}
