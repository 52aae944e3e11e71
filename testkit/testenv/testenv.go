// Package testenv connects tests to the real servers that `make test` starts
// (scripts/up.sh). A server that does not answer fails the test: nothing here
// skips. Addresses come from INVENTORY_TEST_* variables, with the loopback
// defaults scripts/up.sh uses.
package testenv

import (
	"context"
	"crypto/sha1"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/glebarez/sqlite"
	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/acme/inventory/internal/mysqlconn"
	"github.com/acme/inventory/migrations"
	"github.com/acme/inventory/testkit/faultnet"
	"github.com/acme/inventory/testkit/redislease"
)

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// RedisURL is the single-node Redis the tests use.
func RedisURL() string { return env("INVENTORY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0") }

// RedisClusterAddrs are the nodes of the three-node test cluster.
func RedisClusterAddrs() []string {
	return strings.Split(env("INVENTORY_TEST_REDIS_CLUSTER", "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"), ",")
}

// MySQLDSN is the server-level DSN (no database) of the test MariaDB.
func MySQLDSN() string {
	return env("INVENTORY_TEST_MYSQL_DSN", "inventory:inventory@tcp(127.0.0.1:3306)/")
}

// RocketMQNamesrv is the test name server address.
func RocketMQNamesrv() string { return env("INVENTORY_TEST_ROCKETMQ_NAMESRV", "127.0.0.1:9876") }

// RocketMQBroker is the test broker address (topics are created on it).
func RocketMQBroker() string { return env("INVENTORY_TEST_ROCKETMQ_BROKER", "127.0.0.1:10911") }

// Redis returns a client on this test process's own database of the
// single-node test Redis, flushed. The database is leased (see RedisDB), so
// test binaries running at once (the packages of one `make test`, a second
// clone's run, a helper's run) never flush each other's keys.
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(RedisURL())
	if err != nil {
		t.Fatalf("testenv: INVENTORY_TEST_REDIS_URL: %v", err)
	}
	opt.DB = RedisDB(t)
	opt.PoolSize = 128
	c := redis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.FlushDB(ctx).Err(); err != nil {
		t.Fatalf("testenv: real Redis at %s is required (run `make up`): %v", opt.Addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

var cluster struct {
	sync.Mutex
	holders int
	file    *os.File
}

// holdCluster takes the cluster's lock file (an flock the kernel releases
// if the process dies) until t ends.
func holdCluster(t testing.TB) {
	t.Helper()
	cluster.Lock()
	defer cluster.Unlock()
	if cluster.holders == 0 {
		name := filepath.Join(lockDir(t), "redis-cluster-"+strings.NewReplacer(":", "_", ",", "+").Replace(strings.Join(RedisClusterAddrs(), ","))+".lock")
		f, err := os.OpenFile(name, os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil { // waits for the other holder
			_ = f.Close()
			t.Fatalf("testenv: locking the test cluster: %v", err)
		}
		cluster.file = f
	}
	cluster.holders++
	t.Cleanup(func() {
		cluster.Lock()
		defer cluster.Unlock()
		if cluster.holders--; cluster.holders == 0 {
			_ = cluster.file.Close() // releases the flock
			cluster.file = nil
		}
	})
}

// lockDir is where the test processes of this machine keep their lock files.
func lockDir(t testing.TB) string {
	t.Helper()
	dir := redislease.Dir()
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return dir
}

var lease struct {
	sync.Mutex
	*redislease.Lease // held until the process exits
}

// RedisDB is the number of the database this test process holds on the test
// Redis: the first of redislease.FirstTestDB..LastTestDB no other process
// holds (0 is make run's, redislease.BenchDB make bench's).
func RedisDB(t testing.TB) int {
	t.Helper()
	lease.Lock()
	defer lease.Unlock()
	if lease.Lease != nil {
		return lease.DB
	}
	opt, err := redis.ParseURL(RedisURL())
	if err != nil {
		t.Fatalf("testenv: INVENTORY_TEST_REDIS_URL: %v", err)
	}
	for db := redislease.FirstTestDB; db <= redislease.LastTestDB; db++ {
		l, ok, err := redislease.TryHold(opt.Addr, db)
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		if ok {
			lease.Lease = l
			return db
		}
	}
	t.Fatalf("testenv: all %d databases of the test Redis are held by other test processes", redislease.LastTestDB-redislease.FirstTestDB+1)
	return 0
}

// RedisCluster returns a client on the three-node test cluster, flushed,
// and holds the cluster for the test: a test process that wants it while
// another holds it (the stock and order packages of one run, a second
// clone's run) waits until that test ends. Nested calls in one process
// share the hold.
func RedisCluster(t testing.TB) *redis.ClusterClient {
	t.Helper()
	holdCluster(t)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: RedisClusterAddrs(), PoolSize: 128})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		return n.FlushAll(ctx).Err()
	})
	if err != nil {
		t.Fatalf("testenv: real Redis Cluster at %v is required (run `make up`): %v", RedisClusterAddrs(), err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// DatabasePrefix begins the name of every database MySQLDatabase creates
// (make bench's begin otherwise: cmd/benchtable's test says so).
const DatabasePrefix = "inv_test_"

// MySQLDatabase creates an empty database for this test on the real MariaDB
// and returns its DSN; the database is dropped when the test ends.
func MySQLDatabase(t testing.TB) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(MySQLDSN())
	if err != nil {
		t.Fatalf("testenv: INVENTORY_TEST_MYSQL_DSN: %v", err)
	}
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	defer admin.Close()
	sum := sha1.Sum([]byte(t.Name() + time.Now().String()))
	name := DatabasePrefix + hex.EncodeToString(sum[:6])
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE `"+name+"`"); err != nil {
		t.Fatalf("testenv: real MariaDB/MySQL at %s is required (run `make up`): %v", cfg.Addr, err)
	}
	t.Cleanup(func() {
		a, err := sql.Open("mysql", cfg.FormatDSN())
		if err == nil {
			_, _ = a.Exec("DROP DATABASE IF EXISTS `" + name + "`")
			_ = a.Close()
		}
	})
	cfg.DBName = name
	cfg.MultiStatements = false
	if err := mysqlconn.Prepare(ctx, cfg); err != nil { // the sessions the service runs
		t.Fatalf("testenv: %v", err)
	}
	return cfg.FormatDSN()
}

// MySQL returns a GORM handle on a fresh, fully migrated test database.
func MySQL(t testing.TB) *gorm.DB {
	t.Helper()
	return MySQLAt(t, MySQLDatabase(t))
}

// MySQLAt is MySQL on the database of dsn (MySQLDatabase's, perhaps
// dialed through another network): migrated, and closed when the test ends.
func MySQLAt(t testing.TB, dsn string) *gorm.DB {
	t.Helper()
	raw, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() { _ = raw.Close() })
	if err := migrations.Up(context.Background(), raw, migrations.MySQL); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	db, err := gorm.Open(gormmysql.New(gormmysql.Config{Conn: raw}), &gorm.Config{Logger: logger.Discard, TranslateError: true})
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return db
}

// Unique returns a name unique to this test run, for topics and groups.
func Unique(prefix string) string {
	return fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano())
}

// CountCommands counts the commands rdb sends from now on (each command of a
// pipeline counts): a test's measure of Redis round trips.
func CountCommands(rdb redis.UniversalClient) *atomic.Int64 {
	n := new(atomic.Int64)
	rdb.AddHook(countHook{n})
	return n
}

type countHook struct{ n *atomic.Int64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// Clock is an injectable clock a test moves by hand; it starts at the wall
// clock's now.
type Clock struct{ now atomic.Int64 }

func NewClock() *Clock {
	c := &Clock{}
	c.now.Store(time.Now().UnixNano())
	return c
}

func (c *Clock) Now() time.Time          { return time.Unix(0, c.now.Load()) }
func (c *Clock) Advance(d time.Duration) { c.now.Add(int64(d)) }

// Embedded opens what `make run` uses: SQLite behind one connection,
// migrated with the sqlite migrations, and miniredis with wall-clock TTLs.
func Embedded(t testing.TB) (*gorm.DB, *redis.Client) {
	t.Helper()
	db, err := gorm.Open(sqlite.Open("file:"+t.TempDir()+"/inventory.db?_pragma=busy_timeout(5000)"),
		&gorm.Config{Logger: logger.Discard, TranslateError: true})
	require.NoError(t, err)
	raw, err := db.DB()
	require.NoError(t, err)
	raw.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = raw.Close() })
	require.NoError(t, migrations.Up(context.Background(), raw, migrations.SQLite))
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)
	require.NoError(t, m.StartAddr("127.0.0.1:0"))
	t.Cleanup(m.Close)
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), PoolSize: 128})
	t.Cleanup(func() { _ = c.Close() })
	return db, c
}

// NewLink starts a link to upstream (host:port) that the test can cut off
// (Blackhole: connections stay open, no byte flows, as behind a dead
// switch), slow down and heal; the test's end closes it.
func NewLink(t testing.TB, upstream string) *faultnet.Link {
	t.Helper()
	l, err := faultnet.New().Link("link-"+Unique(""), "127.0.0.1:0", upstream)
	if err != nil {
		t.Fatalf("link to %s: %v", upstream, err)
	}
	t.Cleanup(l.Close)
	return l
}

// RedisBackend is one Redis deployment a contract suite runs on.
type RedisBackend struct {
	Name  string
	Open  func(t testing.TB) redis.UniversalClient
	Flush func(ctx context.Context, rdb redis.UniversalClient) error // "Redis loses every key"
}

// RedisBackends are the real single node, the real three-node cluster and
// the embedded default's in-process stand-in (miniredis), which passes the
// same suites.
var RedisBackends = []RedisBackend{
	{
		Name: "redis",
		Open: func(t testing.TB) redis.UniversalClient { return Redis(t) },
		Flush: func(ctx context.Context, rdb redis.UniversalClient) error {
			return rdb.FlushDB(ctx).Err()
		},
	},
	{
		Name: "miniredis",
		Open: func(t testing.TB) redis.UniversalClient {
			m := miniredis.NewMiniRedis()
			m.ClockTTL(true)
			if err := m.StartAddr("127.0.0.1:0"); err != nil {
				t.Fatalf("testenv: miniredis: %v", err)
			}
			t.Cleanup(m.Close)
			c := redis.NewClient(&redis.Options{Addr: m.Addr(), PoolSize: 128})
			t.Cleanup(func() { _ = c.Close() })
			return c
		},
		Flush: func(ctx context.Context, rdb redis.UniversalClient) error {
			return rdb.FlushAll(ctx).Err()
		},
	},
	{
		Name: "cluster",
		Open: func(t testing.TB) redis.UniversalClient { return RedisCluster(t) },
		Flush: func(ctx context.Context, rdb redis.UniversalClient) error {
			return rdb.(*redis.ClusterClient).ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
				return n.FlushAll(ctx).Err()
			})
		},
	},
}

// ForEachRedis runs fn once per RedisBackend, as a subtest.
func ForEachRedis(t *testing.T, fn func(t *testing.T, b RedisBackend, rdb redis.UniversalClient)) {
	for _, b := range RedisBackends {
		t.Run(b.Name, func(t *testing.T) { fn(t, b, b.Open(t)) })
	}
}

// Rows reads every row of rows (an EXPLAIN's or ANALYZE's plan, say) as
// column → value, NULL as "", and closes it.
func Rows(t testing.TB, rows *sql.Rows) []map[string]string {
	t.Helper()
	defer rows.Close()
	cols, err := rows.Columns()
	require.NoError(t, err)
	var out []map[string]string
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		require.NoError(t, rows.Scan(ptrs...))
		row := make(map[string]string, len(cols))
		for i, c := range cols {
			row[c] = vals[i].String
		}
		out = append(out, row)
	}
	require.NoError(t, rows.Err())
	return out
}
