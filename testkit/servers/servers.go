// Package servers starts private servers for the tests and the fault driver
// (cmd/faults): Redis (a single node, a replica, a three-node Redis
// Cluster), MariaDB, and an Apache RocketMQ name server and broker. It is
// the one way Go code starts a server; scripts/up.sh starts the shared ones
// that `make up` and `make test` use, and testkit/testenv connects to those.
//
// The contract of every server started here:
//
//   - It is private: it listens on its own ports (FreePort picks free ones)
//     and keeps its files in its own directory, so it can be killed,
//     restarted and rolled back without touching anything else. It never
//     uses the ports of the shared servers of scripts/up.sh (6379,
//     7101-7103 and their cluster buses 17101-17103, 3306, 9876,
//     10909-10912): every start refuses them, and any port that is not free.
//   - It runs in its own process group (Setpgid), with Pdeathsig=SIGKILL,
//     and is killed with its whole group (Kill, StopBroker, Close), so
//     nothing outlives a Close or the process that started it.
//   - It logs its stdout and stderr to a file in its directory; an error
//     about a start quotes the end of that log.
//
// Close leaves the directories alone: they belong to the caller (a test's
// t.TempDir, the fault run's directory).
//
// RocketMQ is started as scripts/up.sh starts the shared one: from the same
// jars, with the same JVM options, logback configuration and
// scripts/rocketmq/broker.conf (see StartRocketMQ).
package servers

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
)

// ---------------------------------------------------------------------------
// Processes and ports

// sharedPorts are the ports of the servers scripts/up.sh starts (and the
// cluster bus ports of its Redis Cluster). Nothing here listens on them.
var sharedPorts = map[int]bool{
	6379: true, 7101: true, 7102: true, 7103: true, 17101: true, 17102: true, 17103: true,
	3306: true, 9876: true, 10909: true, 10910: true, 10911: true, 10912: true,
}

// checkPorts reports an error when one of ports is a shared server's port or
// is not free on loopback.
func checkPorts(ports ...int) error {
	for _, p := range ports {
		if p <= 0 || p > 65535 {
			return fmt.Errorf("port %d out of range", p)
		}
		if sharedPorts[p] {
			return fmt.Errorf("port %d belongs to the shared servers of scripts/up.sh", p)
		}
		for _, addr := range []string{"127.0.0.1:" + strconv.Itoa(p), ":" + strconv.Itoa(p)} {
			l, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("port %d is not free: %w", p, err)
			}
			_ = l.Close()
		}
	}
	return nil
}

// FreePort returns a port P in [20000, 32000) such that P and P+off for every
// off are free now: FreePort() for Redis, MariaDB, a name server or a proxy,
// FreePort(10000) for a Redis Cluster node (its bus is on P+10000),
// FreePort(-2, 1) for a RocketMQ broker (it also listens on P-2 and P+1).
// It stays below the kernel's ephemeral range, so outgoing connections are
// unlikely to take the port before the server binds it.
func FreePort(offsets ...int) int {
	for range 2000 {
		p := 20000 + rand.IntN(12000)
		ports := []int{p}
		for _, off := range offsets {
			ports = append(ports, p+off)
		}
		if checkPorts(ports...) == nil {
			return p
		}
	}
	panic("servers.FreePort: no free port found")
}

// srvProc is one server process, the leader of its own process group.
type srvProc struct {
	cmd  *exec.Cmd
	pid  int
	log  string        // file that receives its stdout and stderr
	done chan struct{} // closed once it has exited and been reaped
}

// startProc starts name with args in a new process group, appending its
// output to logPath.
func startProc(logPath, name string, args ...string) (*srvProc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "=== %s start: %s %s\n", time.Now().Format(time.RFC3339Nano), name, strings.Join(args, " "))
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &srvProc{cmd: cmd, pid: cmd.Process.Pid, log: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has exited.
func (p *srvProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL to the whole process group and waits until the leader has
// been reaped and, briefly, until no member of the group is left (a Redis
// BGSAVE child, for instance).
func (p *srvProc) kill() error {
	if err := syscall.Kill(-p.pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill process group %d: %w", p.pid, err)
	}
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		return fmt.Errorf("process %d did not exit 30s after SIGKILL", p.pid)
	}
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err := syscall.Kill(-p.pid, 0); errors.Is(err, syscall.ESRCH) {
			break
		}
	}
	return nil
}

// waitReady polls ready every interval until it succeeds. It fails early when
// the process exits, and after timeout; either way it kills the process and
// quotes the end of its log.
func waitReady(p *srvProc, what string, timeout, interval time.Duration, ready func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if p.exited() {
			_ = p.kill() // whatever is left of its group
			return fmt.Errorf("%s exited before it was ready (%v); end of %s:\n%s", what, p.cmd.ProcessState, p.log, logTail(p.log))
		}
		if time.Now().After(deadline) {
			_ = p.kill()
			return fmt.Errorf("%s not ready after %s: %v; end of %s:\n%s", what, timeout, err, p.log, logTail(p.log))
		}
		time.Sleep(interval)
	}
}

// logTail returns the last lines of a log file, for error messages.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return strings.Join(lines, "\n")
}

// copyFile copies src to dst through a temporary file and a rename, so dst is
// replaced whole or not at all.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := dst + ".tmp"
	out, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// ---------------------------------------------------------------------------
// Redis

// Redis is a private redis-server without persistence (--save "" --appendonly
// no). It loads dir/dump.rdb when it starts, but only Snapshot and
// RestartFrom ever put a dump.rdb there, and both remove it again, so a
// Kill and Start always comes back empty. Replication is diskless on both ends.
type Redis struct {
	dir     string
	port    int
	cluster bool     // cluster-enabled: its bus port (port+10000) must be free too
	extra   []string // extra redis-server arguments

	mu        sync.Mutex
	replicaOf string // "host:port" while it is a replica that has not been promoted
	proc      *srvProc
	client    *redis.Client
}

// StartRedis starts a redis-server on 127.0.0.1:port with its files in dir,
// and waits until it answers PING.
func StartRedis(dir string, port int) (*Redis, error) { return startRedis(dir, port, "") }

// StartReplica starts a redis-server on port with its files in dir as a
// replica of of (REPLICAOF), and waits until master_link_status:up.
func StartReplica(dir string, port int, of *Redis) (*Redis, error) {
	return startRedis(dir, port, of.Addr())
}

func startRedis(dir string, port int, replicaOf string) (*Redis, error) {
	r, err := newRedis(dir, port, false, replicaOf)
	if err != nil {
		return nil, err
	}
	if err := r.Start(); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func newRedis(dir string, port int, cluster bool, replicaOf string, extra ...string) (*Redis, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	r := &Redis{dir: dir, port: port, cluster: cluster, extra: extra, replicaOf: replicaOf}
	r.client = redis.NewClient(&redis.Options{Addr: r.Addr()})
	return r, nil
}

// Addr is "127.0.0.1:port".
func (r *Redis) Addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

// Client is a client on this server, the same one every call; it reconnects
// by itself after a restart. Close closes it.
func (r *Redis) Client() *redis.Client { return r.client }

func (r *Redis) args() []string {
	a := []string{
		"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--daemonize", "no", "--logfile", "",
		"--dir", r.dir, "--dbfilename", "dump.rdb", "--save", "", "--appendonly", "no",
		"--databases", "32", // as scripts/up.sh
		"--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0", "--repl-diskless-load", "swapdb",
	}
	if r.replicaOf != "" {
		host, port, _ := net.SplitHostPort(r.replicaOf)
		a = append(a, "--replicaof", host, port)
	}
	return append(a, r.extra...)
}

// Start starts the server again on the same port and dir (loading
// dir/dump.rdb if present) and waits until it answers PING; a replica that
// was not promoted comes back as a replica and is waited for until its link
// is up.
func (r *Redis) Start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.startLocked()
}

func (r *Redis) startLocked() error {
	if r.proc != nil && !r.proc.exited() {
		return fmt.Errorf("redis %s: already running", r.Addr())
	}
	r.proc = nil
	ports := []int{r.port}
	if r.cluster {
		ports = append(ports, r.port+10000)
	}
	if err := checkPorts(ports...); err != nil {
		return fmt.Errorf("redis %s: %w", r.Addr(), err)
	}
	p, err := startProc(filepath.Join(r.dir, "redis.log"), "redis-server", r.args()...)
	if err != nil {
		return err
	}
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 2 * time.Second})
	defer c.Close()
	ctx := context.Background()
	err = waitReady(p, "redis-server "+r.Addr(), 20*time.Second, 50*time.Millisecond, func() error {
		if err := c.Ping(ctx).Err(); err != nil {
			return err
		}
		// The port was free, but make sure the answer comes from our process.
		info, err := c.Info(ctx, "server").Result()
		if err != nil {
			return err
		}
		if pid := infoField(info, "process_id"); pid != strconv.Itoa(p.pid) {
			return fmt.Errorf("answered by process %s, not %d", pid, p.pid)
		}
		return nil
	})
	if err != nil {
		return err
	}
	r.proc = p
	if r.replicaOf != "" {
		err = waitReady(p, "replica "+r.Addr()+" of "+r.replicaOf, 30*time.Second, 50*time.Millisecond, func() error {
			info, err := c.Info(ctx, "replication").Result()
			if err != nil {
				return err
			}
			if s := infoField(info, "master_link_status"); s != "up" {
				return fmt.Errorf("master_link_status:%s", s)
			}
			return nil
		})
		if err != nil {
			r.proc = nil
			return err
		}
	}
	return nil
}

// infoField returns the value of field in the text of an INFO reply.
func infoField(info, field string) string {
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), field+":"); ok {
			return v
		}
	}
	return ""
}

// Kill sends SIGKILL and waits for the exit. Without persistence, the data is
// gone. Killing a server that is not running does nothing.
func (r *Redis) Kill() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.killLocked()
}

func (r *Redis) killLocked() error {
	if r.proc == nil {
		return nil
	}
	err := r.proc.kill()
	r.proc = nil
	return err
}

// Snapshot SAVEs the dataset, moves dir/dump.rdb to dir/<name>.rdb and
// returns that path, for RestartFrom.
func (r *Redis) Snapshot(name string) (string, error) {
	if name == "" || strings.ContainsAny(name, `/\`) || name == "dump" {
		return "", fmt.Errorf("redis snapshot: bad name %q", name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.client.Save(ctx).Err(); err != nil {
		return "", fmt.Errorf("redis %s: SAVE: %w", r.Addr(), err)
	}
	dump := filepath.Join(r.dir, "dump.rdb")
	path := filepath.Join(r.dir, name+".rdb")
	if err := copyFile(dump, path); err != nil {
		return "", err
	}
	if err := os.Remove(dump); err != nil {
		return "", err
	}
	return path, nil
}

// RestartFrom kills the server, puts a copy of rdbPath in place of
// dir/dump.rdb (replacing any stale one) and starts it again, so it comes back
// with exactly the data of that snapshot. The copy is removed once loaded.
func (r *Redis) RestartFrom(rdbPath string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := os.Stat(rdbPath); err != nil {
		return err
	}
	if err := r.killLocked(); err != nil {
		return err
	}
	// Leftovers of a SAVE or BGSAVE cut short by the kill.
	tmps, _ := filepath.Glob(filepath.Join(r.dir, "temp-*.rdb"))
	for _, t := range tmps {
		_ = os.Remove(t)
	}
	dump := filepath.Join(r.dir, "dump.rdb")
	if err := copyFile(rdbPath, dump); err != nil {
		return err
	}
	if err := r.startLocked(); err != nil {
		return err
	}
	return os.Remove(dump)
}

// Promote turns a replica into a primary (REPLICAOF NO ONE). From then on it
// no longer follows its former primary, also after a restart.
func (r *Redis) Promote() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.client.ReplicaOf(ctx, "NO", "ONE").Err(); err != nil {
		return fmt.Errorf("redis %s: REPLICAOF NO ONE: %w", r.Addr(), err)
	}
	r.replicaOf = ""
	return nil
}

// Close kills the server and closes Client. The dir is left alone.
func (r *Redis) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = r.killLocked()
	_ = r.client.Close()
}

// ---------------------------------------------------------------------------
// Redis Cluster

// RedisCluster is a private three-master Redis Cluster (no replicas), one
// node per dir/<port>, each with its own nodes.conf.
type RedisCluster struct {
	Nodes []*Redis
}

// StartRedisCluster starts three cluster-enabled nodes on ports (their buses
// on port+10000), joins them with `redis-cli --cluster create`, and waits
// until every node reports cluster_state:ok.
func StartRedisCluster(dir string, ports [3]int) (*RedisCluster, error) {
	c := &RedisCluster{}
	for _, p := range ports {
		nd, err := filepath.Abs(filepath.Join(dir, strconv.Itoa(p)))
		if err != nil {
			return nil, err
		}
		n, err := newRedis(nd, p, true, "",
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(nd, "nodes.conf"))
		if err != nil {
			c.Close()
			return nil, err
		}
		c.Nodes = append(c.Nodes, n)
		if err := n.Start(); err != nil {
			c.Close()
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		c.Close()
		return nil, fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	if err := c.waitOK(30 * time.Second); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Addrs are the nodes' addresses.
func (c *RedisCluster) Addrs() []string {
	a := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		a[i] = n.Addr()
	}
	return a
}

// RestartNode kills node i and starts it again on the same port, dir and
// nodes.conf: it comes back empty but with its slots, and the call waits until
// every node reports cluster_state:ok and all links are connected again.
func (c *RedisCluster) RestartNode(i int) error {
	if i < 0 || i >= len(c.Nodes) {
		return fmt.Errorf("redis cluster: no node %d", i)
	}
	n := c.Nodes[i]
	if err := n.Kill(); err != nil {
		return err
	}
	if err := n.Start(); err != nil {
		return err
	}
	return c.waitOK(60 * time.Second)
}

// waitOK waits until every node reports cluster_state:ok and sees every other
// node connected and not failing.
func (c *RedisCluster) waitOK(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := c.check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis cluster %v not ok after %s: %w", c.Addrs(), timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *RedisCluster) check() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, n := range c.Nodes {
		info, err := n.Client().ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("%s: %w", n.Addr(), err)
		}
		if s := infoField(info, "cluster_state"); s != "ok" {
			return fmt.Errorf("%s: cluster_state:%s", n.Addr(), s)
		}
		nodes, err := n.Client().ClusterNodes(ctx).Result()
		if err != nil {
			return fmt.Errorf("%s: %w", n.Addr(), err)
		}
		lines := strings.Split(strings.TrimSpace(nodes), "\n")
		if len(lines) != len(c.Nodes) {
			return fmt.Errorf("%s knows %d nodes", n.Addr(), len(lines))
		}
		for _, l := range lines {
			f := strings.Fields(l)
			if len(f) < 8 || strings.Contains(f[2], "fail") || f[7] != "connected" {
				return fmt.Errorf("%s: %s", n.Addr(), l)
			}
		}
	}
	return nil
}

// FlushAll runs FLUSHALL on every node (all are masters).
func (c *RedisCluster) FlushAll(ctx context.Context) error {
	for _, n := range c.Nodes {
		if err := n.Client().FlushAll(ctx).Err(); err != nil {
			return fmt.Errorf("%s: FLUSHALL: %w", n.Addr(), err)
		}
	}
	return nil
}

// Close kills every node.
func (c *RedisCluster) Close() {
	for _, n := range c.Nodes {
		n.Close()
	}
}

// ---------------------------------------------------------------------------
// MariaDB

// The account StartMariaDB creates for the service: it authenticates over TCP
// like the shared server's (scripts/up.sh); root authenticates only through
// the unix socket.
const (
	mariadbUser     = "inventory"
	mariadbPassword = "inventory-faults"
)

// MariaDB is a private mariadbd with its own datadir (dir/data), port, unix
// socket and pid file, run as root and ignoring every option file.
type MariaDB struct {
	dir, datadir, socket string
	port                 int

	mu   sync.Mutex
	proc *srvProc
}

// StartMariaDB starts a mariadbd on 127.0.0.1:port with its files in dir,
// installing dir/data (mariadb-install-db) on the first call, waits until it
// answers, and makes sure the user 'inventory'@'127.0.0.1' (see DSN) exists
// with all privileges.
func StartMariaDB(dir string, port int) (*MariaDB, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	m := &MariaDB{dir: dir, datadir: filepath.Join(dir, "data"), port: port}
	m.socket = filepath.Join(dir, "mariadbd.sock")
	if len(m.socket) > 100 { // sun_path holds 108 bytes
		m.socket = filepath.Join(os.TempDir(), fmt.Sprintf("faults-mariadbd-%d.sock", port))
	}
	if _, err := os.Stat(filepath.Join(m.datadir, "mysql")); errors.Is(err, os.ErrNotExist) {
		if err := m.install(); err != nil {
			return nil, err
		}
	}
	if err := m.Start(); err != nil {
		return nil, err
	}
	grant := ""
	for _, host := range []string{"127.0.0.1", "localhost"} {
		u := fmt.Sprintf("'%s'@'%s'", mariadbUser, host)
		grant += fmt.Sprintf("CREATE USER IF NOT EXISTS %s IDENTIFIED BY '%s'; ALTER USER %s IDENTIFIED BY '%s'; GRANT ALL PRIVILEGES ON *.* TO %s; ",
			u, mariadbPassword, u, mariadbPassword, u)
	}
	if _, err := m.rootSQL(grant); err != nil {
		m.Close()
		return nil, fmt.Errorf("mariadb: create user: %w", err)
	}
	db, err := sql.Open("mysql", m.DSN(""))
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = db.PingContext(ctx)
		cancel()
		_ = db.Close()
	}
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("mariadb: %s cannot log in over TCP: %w", mariadbUser, err)
	}
	return m, nil
}

func (m *MariaDB) install() error {
	out, err := exec.Command("mariadb-install-db", "--no-defaults", "--user=root", "--datadir="+m.datadir,
		"--auth-root-authentication-method=socket", "--skip-test-db").CombinedOutput()
	_ = os.WriteFile(filepath.Join(m.dir, "install.log"), out, 0o644)
	if err != nil {
		_ = os.RemoveAll(m.datadir) // so the next call installs again
		return fmt.Errorf("mariadb-install-db: %w\n%s", err, out)
	}
	return nil
}

// rootSQL runs statements as root through the unix socket with the mariadb
// client and returns its output.
func (m *MariaDB) rootSQL(statements string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "mariadb", "--no-defaults", "--socket="+m.socket, "--connect-timeout=5", "-uroot", "-N", "-B", "-e", statements)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// DSN is a go-sql-driver DSN for database (empty: none) over TCP as
// 'inventory'@'127.0.0.1', with the parameters the project's tests use
// (testkit/testenv): parseTime=true, multiStatements=false.
func (m *MariaDB) DSN(database string) string { return m.DSNVia(m.Addr(), database) }

// Addr is the server's address, "127.0.0.1:port".
func (m *MariaDB) Addr() string { return "127.0.0.1:" + strconv.Itoa(m.port) }

// DSNVia is DSN through addr (a link in front of the server).
func (m *MariaDB) DSNVia(addr, database string) string {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Passwd = mariadbUser, mariadbPassword
	cfg.Net, cfg.Addr = "tcp", addr
	cfg.DBName = database
	cfg.ParseTime = true
	cfg.MultiStatements = false
	return cfg.FormatDSN()
}

// CreateDatabase drops database name if it exists and creates it empty.
func (m *MariaDB) CreateDatabase(ctx context.Context, name string) error {
	db, err := sql.Open("mysql", m.DSN(""))
	if err != nil {
		return err
	}
	defer db.Close()
	q := "`" + strings.ReplaceAll(name, "`", "``") + "`"
	if _, err := db.ExecContext(ctx, "DROP DATABASE IF EXISTS "+q); err != nil {
		return err
	}
	_, err = db.ExecContext(ctx, "CREATE DATABASE "+q)
	return err
}

// Start starts mariadbd again on the same datadir and port (InnoDB recovers
// after a Kill) and waits until it answers through its socket.
func (m *MariaDB) Start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc != nil && !m.proc.exited() {
		return fmt.Errorf("mariadb :%d: already running", m.port)
	}
	m.proc = nil
	if err := checkPorts(m.port); err != nil {
		return fmt.Errorf("mariadb: %w", err)
	}
	p, err := startProc(filepath.Join(m.dir, "mariadbd.log"), "/usr/sbin/mariadbd",
		"--no-defaults", "--user=root", "--datadir="+m.datadir, "--port="+strconv.Itoa(m.port),
		"--socket="+m.socket, "--pid-file="+filepath.Join(m.dir, "mariadbd.pid"), "--bind-address=127.0.0.1",
		"--skip-name-resolve", "--innodb-buffer-pool-size=128M", "--max-connections=500",
		"--default-time-zone=+00:00") // the checker compares DEFAULT CURRENT_TIMESTAMP columns with UTC
	if err != nil {
		return err
	}
	want := strconv.Itoa(m.port)
	err = waitReady(p, fmt.Sprintf("mariadbd :%d", m.port), 90*time.Second, 200*time.Millisecond, func() error {
		if _, err := os.Stat(m.socket); err != nil {
			return err
		}
		port, err := m.rootSQL("SELECT @@port")
		if err == nil && port != want {
			err = fmt.Errorf("socket %s answered by a server on port %s", m.socket, port)
		}
		return err
	})
	if err != nil {
		return err
	}
	m.proc = p
	return nil
}

// Kill sends SIGKILL (a crash) and waits for the exit. Killing a server that
// is not running does nothing.
func (m *MariaDB) Kill() error { return killUnder(&m.mu, &m.proc) }

// killUnder kills *p (if running) holding mu, and forgets it.
func killUnder(mu *sync.Mutex, p **srvProc) error {
	mu.Lock()
	defer mu.Unlock()
	if *p == nil {
		return nil
	}
	err := (*p).kill()
	*p = nil
	return err
}

// Close kills the server. The datadir is left alone.
func (m *MariaDB) Close() { _ = m.Kill() }

// ---------------------------------------------------------------------------
// RocketMQ

// RocketMQ is a private Apache RocketMQ name server and one broker, started
// as scripts/up.sh starts the shared ones (same JVM options, logback
// configuration and scripts/rocketmq/broker.conf), but with their home
// (-Duser.home, -Drocketmq.home.dir, hence the rocketmqlogs) in dir/home,
// their store in dir/store and their own ports.
type RocketMQ struct {
	dir, home, classpath string
	namesrvPort          int
	brokerPort           int
	advertise            string // the host the broker gives the name server, when not 127.0.0.1 (see StartRocketMQ)

	mu           sync.Mutex
	namesrv      *srvProc
	broker       *srvProc
	brokerStarts int
	brokerLog    string
}

// defaultRocketMQVersion is the Apache RocketMQ version scripts/lib.sh
// installs unless $ROCKETMQ_VERSION says otherwise.
const defaultRocketMQVersion = "5.3.3"

// rocketmqVersion is the version of the jars scripts/up.sh fetched, as
// scripts/lib.sh reads it: $ROCKETMQ_VERSION, or defaultRocketMQVersion.
func rocketmqVersion() string {
	if v := os.Getenv("ROCKETMQ_VERSION"); v != "" {
		return v
	}
	return defaultRocketMQVersion
}

// sharedCache is the per-user directory where scripts/up.sh downloads what
// every clone shares (the RocketMQ jars), as scripts/lib.sh names it:
// $INVENTORY_SHARED_CACHE, or acme-inventory under $XDG_CACHE_HOME or
// $HOME/.cache. It is "" when none of these is set.
func sharedCache() string {
	if d := os.Getenv("INVENTORY_SHARED_CACHE"); d != "" {
		return d
	}
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home := os.Getenv("HOME")
		if home == "" {
			return ""
		}
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "acme-inventory")
}

// rocketmqLib finds the RocketMQ jars scripts/up.sh fetched:
// $INVENTORY_ROCKETMQ_LIB when set; else root's .cache/rocketmq-VERSION/lib,
// which scripts/up.sh makes a link into the per-user cache; else that
// cache's rocketmq-VERSION/lib once its download is complete, so a clone or
// worktree whose servers another clone started finds them too.
func rocketmqLib(root string) (string, error) {
	hasJars := func(lib string) bool {
		jars, _ := filepath.Glob(filepath.Join(lib, "rocketmq-broker-*.jar"))
		return len(jars) > 0
	}
	if lib := os.Getenv("INVENTORY_ROCKETMQ_LIB"); lib != "" {
		if !hasJars(lib) {
			return "", fmt.Errorf("no RocketMQ jars in $INVENTORY_ROCKETMQ_LIB (%s)", lib)
		}
		return lib, nil
	}
	name := "rocketmq-" + rocketmqVersion()
	tried := []string{filepath.Join(root, ".cache", name, "lib")}
	if hasJars(tried[0]) {
		return tried[0], nil
	}
	if shared := sharedCache(); shared != "" {
		dir := filepath.Join(shared, name)
		lib := filepath.Join(dir, "lib")
		tried = append(tried, lib)
		if _, err := os.Stat(filepath.Join(dir, ".complete")); err == nil && hasJars(lib) {
			return lib, nil
		}
	}
	return "", fmt.Errorf("no RocketMQ jars in %s (scripts/up.sh install fetches them)", strings.Join(tried, " or "))
}

// rocketmqBoot is how long a JVM may take to print "boot success".
const rocketmqBoot = 180 * time.Second

// ModuleRoot finds the repository: the nearest directory, from the working
// directory up, with this module's go.mod.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(b, []byte("module github.com/acme/inventory\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the github.com/acme/inventory repository")
		}
		dir = parent
	}
}

// StartRocketMQ starts a name server on namesrvPort and a broker listening
// on brokerPort (and brokerPort-2, brokerPort+1; see FreePort) with its store
// in dir/store, and waits for each to print "boot success". The RocketMQ jars
// are those scripts/up.sh fetched (see rocketmqLib: the per-user cache, by
// way of the clone's .cache/rocketmq-VERSION), or those in
// $INVENTORY_ROCKETMQ_LIB.
//
// With advertise empty the broker listens on 127.0.0.1 and tells the name
// server so. Otherwise (another loopback address, such as 127.0.0.2) it
// binds its ports on 127.0.0.1 only (bindAddress) and gives the name server
// advertise:brokerPort as its address (brokerIP1), which clients then dial:
// a proxy listening there sits in every client's path to the broker.
func StartRocketMQ(dir string, namesrvPort, brokerPort int, advertise string) (*RocketMQ, error) {
	root, err := ModuleRoot()
	if err != nil {
		return nil, fmt.Errorf("rocketmq: %w", err)
	}
	lib, err := rocketmqLib(root)
	if err != nil {
		return nil, fmt.Errorf("rocketmq: %w", err)
	}
	tmpl, err := os.ReadFile(filepath.Join(root, "scripts", "rocketmq", "broker.conf"))
	if err != nil {
		return nil, fmt.Errorf("rocketmq: %w", err)
	}
	if err := checkPorts(namesrvPort, brokerPort-2, brokerPort, brokerPort+1); err != nil {
		return nil, fmt.Errorf("rocketmq: %w", err)
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	q := &RocketMQ{dir: dir, home: filepath.Join(dir, "home"), classpath: filepath.Join(lib, "*"),
		namesrvPort: namesrvPort, brokerPort: brokerPort, advertise: advertise}
	if err := os.MkdirAll(q.home, 0o755); err != nil {
		return nil, err
	}
	nsConf := filepath.Join(dir, "namesrv.conf")
	if err := os.WriteFile(nsConf, fmt.Appendf(nil, "listenPort=%d\n", namesrvPort), 0o644); err != nil {
		return nil, err
	}
	conf := strings.NewReplacer("@STORE@", filepath.Join(dir, "store"), "@NAMESRV@", q.NameServer(),
		"@PORT@", strconv.Itoa(brokerPort)).Replace(string(tmpl))
	if advertise != "" {
		if !strings.Contains(conf, "\nbrokerIP1=127.0.0.1\n") {
			return nil, errors.New("rocketmq: scripts/rocketmq/broker.conf has no brokerIP1=127.0.0.1 line to replace")
		}
		conf = strings.Replace(conf, "\nbrokerIP1=127.0.0.1\n", "\nbrokerIP1="+advertise+"\n", 1) + "bindAddress=127.0.0.1\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "broker.conf"), []byte(conf), 0o644); err != nil {
		return nil, err
	}

	p, err := startProc(filepath.Join(dir, "namesrv.out"), "java",
		q.javaArgs("rmq.namesrv.logback.xml", "org.apache.rocketmq.namesrv.NamesrvStartup", nsConf)...)
	if err != nil {
		return nil, err
	}
	if err := waitBoot(p, "rocketmq name server :"+strconv.Itoa(namesrvPort)); err != nil {
		return nil, err
	}
	q.namesrv = p
	if err := q.StartBroker(); err != nil {
		q.Close()
		return nil, err
	}
	return q, nil
}

// javaOpts are scripts/up.sh's java_opts with home as the RocketMQ home
// (where the JVM's rocketmqlogs go). The broker's queue locks live
// mq.BrokerLockLifetime (1 s) instead of 60 s, so a consumer that died loses
// its queues within seconds.
func javaOpts(home string) []string {
	return []string{
		"-Xms128m", "-Xmx512m", "-XX:MaxDirectMemorySize=256m",
		"--add-opens", "java.base/java.nio=ALL-UNNAMED", "--add-opens", "java.base/jdk.internal.ref=ALL-UNNAMED",
		"--add-opens", "java.base/java.util=ALL-UNNAMED", "--add-exports", "java.base/sun.nio.ch=ALL-UNNAMED",
		"-Drocketmq.broker.rebalance.lockMaxLiveTime=1000",
		"-Drocketmq.home.dir=" + home, "-Duser.home=" + home,
	}
}

// javaArgs are the arguments of java for one of this instance's JVMs, as
// scripts/up.sh starts it, with this instance's home.
func (q *RocketMQ) javaArgs(logback, class, conf string) []string {
	return append(javaOpts(q.home),
		"-Drmq.logback.configurationFile="+logback, "-cp", q.classpath, class, "-c", conf)
}

// waitBoot waits until the process's log file says "boot success".
func waitBoot(p *srvProc, what string) error {
	return waitReady(p, what, rocketmqBoot, 250*time.Millisecond, func() error {
		b, err := os.ReadFile(p.log)
		if err != nil {
			return err
		}
		if !bytes.Contains(b, []byte("boot success")) {
			return errors.New(`no "boot success" yet`)
		}
		return nil
	})
}

// NameServer is the name server's address, "127.0.0.1:namesrvPort".
func (q *RocketMQ) NameServer() string { return "127.0.0.1:" + strconv.Itoa(q.namesrvPort) }

// Broker is the address the broker listens on, "127.0.0.1:brokerPort"
// (clients dial the address it advertises: see StartRocketMQ).
func (q *RocketMQ) Broker() string { return "127.0.0.1:" + strconv.Itoa(q.brokerPort) }

// BrokerLog is the output file of the broker's latest start: each start
// writes a new dir/broker-<n>.out.
func (q *RocketMQ) BrokerLog() string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.brokerLog
}

// StopBroker SIGKILLs the broker JVM and waits for its exit. Stopping a
// broker that is not running does nothing.
func (q *RocketMQ) StopBroker() error { return killUnder(&q.mu, &q.broker) }

// StartBroker starts the broker on the same ports and store (its messages,
// topics and offsets are kept) and waits for "boot success" in the output of
// this start, a new dir/broker-<n>.out.
func (q *RocketMQ) StartBroker() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.broker != nil && !q.broker.exited() {
		return errors.New("rocketmq broker: already running")
	}
	q.broker = nil
	ports := []int{q.brokerPort - 2, q.brokerPort, q.brokerPort + 1}
	if q.advertise != "" {
		// The proxy holds advertise:brokerPort, so the wildcard address of
		// that port is taken; the broker binds 127.0.0.1 only.
		ports = []int{q.brokerPort - 2, q.brokerPort + 1}
		if l, err := net.Listen("tcp", q.Broker()); err != nil {
			return fmt.Errorf("rocketmq broker: port %d is not free on 127.0.0.1: %w", q.brokerPort, err)
		} else {
			_ = l.Close()
		}
	}
	if err := checkPorts(ports...); err != nil {
		return fmt.Errorf("rocketmq broker: %w", err)
	}
	q.brokerStarts++
	q.brokerLog = filepath.Join(q.dir, fmt.Sprintf("broker-%d.out", q.brokerStarts))
	p, err := startProc(q.brokerLog, "java",
		q.javaArgs("rmq.broker.logback.xml", "org.apache.rocketmq.broker.BrokerStartup", filepath.Join(q.dir, "broker.conf"))...)
	if err != nil {
		return err
	}
	if err := waitBoot(p, "rocketmq broker :"+strconv.Itoa(q.brokerPort)); err != nil {
		return err
	}
	q.broker = p
	return nil
}

// Close kills the broker and the name server. The dir is left alone.
func (q *RocketMQ) Close() {
	_ = q.StopBroker()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.namesrv != nil {
		_ = q.namesrv.kill()
		q.namesrv = nil
	}
}
