//go:build !race

package mq_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// privateRocketMQ is a name server and one broker of this test's own, on
// their own ports and directories, started as scripts/up.sh starts the
// shared ones (same jars, JVM options and scripts/rocketmq/broker.conf), so
// a test may kill and restart the broker without touching the shared
// servers other tests use (9876, 10909-10912).
type privateRocketMQ struct {
	t                    *testing.T
	dir, classpath, root string
	namesrvPort          int
	brokerPort           int
	namesrv, broker      *javaProc
	brokerStarts         int
}

type javaProc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// rocketmqBoot bounds how long a JVM may take to print "boot success" on a
// busy machine.
const rocketmqBoot = 180 * time.Second

func startPrivateRocketMQ(t *testing.T) *privateRocketMQ {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	lib := os.Getenv("INVENTORY_ROCKETMQ_LIB")
	if lib == "" {
		lib = filepath.Join(root, ".cache", "rocketmq-5.3.3", "lib")
	}
	if jars, _ := filepath.Glob(filepath.Join(lib, "rocketmq-broker-*.jar")); len(jars) == 0 {
		t.Fatalf("no RocketMQ jars in %s (run scripts/up.sh)", lib)
	}
	q := &privateRocketMQ{t: t, dir: t.TempDir(), classpath: filepath.Join(lib, "*"), root: root}
	q.namesrvPort = freePort(t)
	q.brokerPort = freePort(t, -2, 1) // the broker also listens on P-2 and P+1
	nsConf := filepath.Join(q.dir, "namesrv.conf")
	if err := os.WriteFile(nsConf, fmt.Appendf(nil, "listenPort=%d\n", q.namesrvPort), 0o644); err != nil {
		t.Fatal(err)
	}
	tmpl, err := os.ReadFile(filepath.Join(root, "scripts", "rocketmq", "broker.conf"))
	if err != nil {
		t.Fatal(err)
	}
	conf := strings.NewReplacer("@STORE@", filepath.Join(q.dir, "store"), "@NAMESRV@", q.NameServer(),
		"@PORT@", strconv.Itoa(q.brokerPort)).Replace(string(tmpl))
	if err := os.WriteFile(filepath.Join(q.dir, "broker.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	q.namesrv = q.start("namesrv.out", "rmq.namesrv.logback.xml", "org.apache.rocketmq.namesrv.NamesrvStartup", nsConf)
	t.Cleanup(func() { q.namesrv.kill(t) })
	q.StartBroker()
	t.Cleanup(func() { q.StopBroker() })
	return q
}

func (q *privateRocketMQ) NameServer() string { return "127.0.0.1:" + strconv.Itoa(q.namesrvPort) }
func (q *privateRocketMQ) Broker() string     { return "127.0.0.1:" + strconv.Itoa(q.brokerPort) }

// StartBroker starts the broker on its ports and store (messages, topics and
// offsets are kept) and returns once it printed "boot success".
func (q *privateRocketMQ) StartBroker() {
	q.t.Helper()
	q.brokerStarts++
	q.broker = q.start(fmt.Sprintf("broker-%d.out", q.brokerStarts), "rmq.broker.logback.xml",
		"org.apache.rocketmq.broker.BrokerStartup", filepath.Join(q.dir, "broker.conf"))
}

// StopBroker SIGKILLs the broker, as a crash or an operator's kill -9 would.
func (q *privateRocketMQ) StopBroker() {
	if q.broker != nil {
		q.broker.kill(q.t)
		q.broker = nil
	}
}

func (q *privateRocketMQ) start(logName, logback, class, conf string) *javaProc {
	q.t.Helper()
	args := []string{"-Xms128m", "-Xmx512m", "-XX:MaxDirectMemorySize=256m",
		"--add-opens", "java.base/java.nio=ALL-UNNAMED", "--add-opens", "java.base/jdk.internal.ref=ALL-UNNAMED",
		"--add-opens", "java.base/java.util=ALL-UNNAMED", "--add-exports", "java.base/sun.nio.ch=ALL-UNNAMED",
		"-Drocketmq.home.dir=" + filepath.Join(q.dir, "home"), "-Duser.home=" + filepath.Join(q.dir, "home")}
	args = append(args, "-Drmq.logback.configurationFile="+logback, "-cp", q.classpath, class, "-c", conf)
	logPath := filepath.Join(q.dir, logName)
	f, err := os.Create(logPath)
	if err != nil {
		q.t.Fatal(err)
	}
	cmd := exec.Command("java", args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		q.t.Fatalf("start %s: %v", class, err)
	}
	p := &javaProc{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	deadline := time.Now().Add(rocketmqBoot)
	for {
		b, _ := os.ReadFile(logPath)
		if bytes.Contains(b, []byte("boot success")) {
			return p
		}
		select {
		case <-p.done:
			q.t.Fatalf("%s exited before boot success:\n%s", class, tail(b))
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.kill(q.t)
			q.t.Fatalf("%s: no boot success after %s:\n%s", class, rocketmqBoot, tail(b))
		}
	}
}

func tail(b []byte) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-15):], "\n")
}

// kill SIGKILLs the process group and waits for the JVM to be reaped.
func (p *javaProc) kill(t *testing.T) {
	if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		t.Errorf("kill %d: %v", p.cmd.Process.Pid, err)
	}
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Errorf("process %d still running 30s after SIGKILL", p.cmd.Process.Pid)
	}
}

// sharedPorts are the ports of the servers scripts/up.sh starts.
var sharedPorts = map[int]bool{9876: true, 10909: true, 10910: true, 10911: true, 10912: true}

// freePort returns a port P in [20000, 32000) such that P+off is free on
// loopback for every off (and P itself).
func freePort(t *testing.T, offsets ...int) int {
	t.Helper()
	for range 2000 {
		p := 20000 + rand.IntN(12000)
		ok := true
		for _, off := range append([]int{0}, offsets...) {
			if sharedPorts[p+off] {
				ok = false
				break
			}
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+off))
			if err != nil {
				ok = false
				break
			}
			_ = l.Close()
		}
		if ok {
			return p
		}
	}
	t.Fatal("no free port")
	return 0
}
