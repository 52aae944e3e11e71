package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// What used the machine's CPU during a phase, from /proc: the servers this
// benchmark drives, this process (the service and the load generator, and the
// redis-benchmark child), and the rest of the machine (other test runs, the
// kernel), so a reader sees why a phase fell short of a target.

// userHZ is the unit of /proc's CPU times (USER_HZ, 100 on Linux).
const userHZ = 100

// cpuGroups are the columns of the table, in order.
var cpuGroups = []string{"benchtable", "redis-server", "mariadbd", "RocketMQ (java)"}

// cpuSample is the CPU time, in ticks, each group had used at one instant,
// and the machine's busy, idle and stolen ticks (all cores).
type cpuSample struct {
	at                time.Time
	group             map[string]int64
	busy, idle, steal int64
}

// cpuPhase is what a phase used: CPU seconds per group, the rest of the
// machine, idle and stolen time, over wall seconds.
type cpuPhase struct {
	name                     string
	wall                     float64
	group                    map[string]float64
	other, idle, steal, busy float64
}

var cpuPhases []cpuPhase

// measureCPU samples /proc now and returns the function that samples again
// and records the phase: `defer measureCPU(name)()`.
func measureCPU(name string) func() {
	before, ok := sampleCPU()
	return func() {
		after, ok2 := sampleCPU()
		if !ok || !ok2 {
			return
		}
		ph := cpuPhase{name: name, wall: after.at.Sub(before.at).Seconds(), group: map[string]float64{}}
		named := 0.0
		for _, g := range cpuGroups {
			ph.group[g] = float64(after.group[g]-before.group[g]) / userHZ
			named += ph.group[g]
		}
		ph.busy = float64(after.busy-before.busy) / userHZ
		ph.idle = float64(after.idle-before.idle) / userHZ
		ph.steal = float64(after.steal-before.steal) / userHZ
		ph.other = max(ph.busy-named, 0)
		cpuPhases = append(cpuPhases, ph)
	}
}

// sampleCPU reads the CPU times of the processes of each group. A process
// that starts or ends within a phase counts only from or until then (the
// groups here are long-lived servers).
func sampleCPU() (cpuSample, bool) {
	s := cpuSample{at: time.Now(), group: map[string]int64{}}
	line, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s, false
	}
	first, _, _ := bytes.Cut(line, []byte("\n"))
	f := strings.Fields(string(first)) // cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 9 {
		return s, false
	}
	n := func(i int) int64 { v, _ := strconv.ParseInt(f[i], 10, 64); return v }
	s.busy = n(1) + n(2) + n(3) + n(6) + n(7)
	s.idle = n(4) + n(5)
	s.steal = n(8)
	self := os.Getpid()
	redisPort := ":" + strings.Split(*redisAddr, ":")[1]
	mysqlPort := dsnPort(*mysqlDSN)
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range dirs {
		pid, _ := strconv.Atoi(filepath.Base(dir))
		ticks, comm, ok := procTicks(dir, pid == self)
		if !ok {
			continue
		}
		var g string
		switch {
		case pid == self:
			g = "benchtable"
		case comm == "redis-server":
			// Only the server the benchmark uses: the cluster nodes of the
			// tests are "the rest of the machine".
			if cmd, _ := os.ReadFile(dir + "/cmdline"); bytes.Contains(cmd, []byte(redisPort)) {
				g = "redis-server"
			}
		case comm == "mariadbd" || comm == "mysqld":
			// Only the server the benchmark uses, as for Redis: another
			// MariaDB on the machine (a test's, a private one) is the rest.
			if cmd, _ := os.ReadFile(dir + "/cmdline"); servesPort(cmd, mysqlPort) {
				g = "mariadbd"
			}
		case comm == "java":
			// Only the name server and broker the service talks to: the
			// private brokers tests and make faults start (another
			// session's, on a shared machine) are the rest.
			if cmd, _ := os.ReadFile(dir + "/cmdline"); bytes.Contains(bytes.ToLower(cmd), []byte("rocketmq")) && rocketMQServes(pid) {
				g = "RocketMQ (java)"
			}
		}
		if g != "" {
			s.group[g] += ticks
		}
	}
	return s, true
}

// rocketMQPorts are the ports of the name server and the broker the
// service uses (startService).
var rocketMQPorts = []int{9876, 10911}

// rocketMQPids remembers, per pid, whether that process listens on one of
// rocketMQPorts (a process's listening sockets do not change here; a
// restarted server is a new pid).
var rocketMQPids = map[int]bool{}

// rocketMQServes reports whether process pid listens on one of
// rocketMQPorts: one of its file descriptors is a listening TCP socket
// (/proc/net/tcp, tcp6) bound to one of them.
func rocketMQServes(pid int) bool {
	if v, ok := rocketMQPids[pid]; ok {
		return v
	}
	inodes := listeningInodes(rocketMQPorts)
	fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	serves := false
	for _, fd := range fds {
		if link, err := os.Readlink(fd); err == nil && inodes[link] {
			serves = true
			break
		}
	}
	rocketMQPids[pid] = serves
	return serves
}

// listeningInodes are the "socket:[inode]" names of the TCP sockets
// listening on ports.
func listeningInodes(ports []int) map[string]bool {
	out := map[string]bool{}
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" { // 0A: LISTEN
				continue
			}
			_, portHex, ok := strings.Cut(f[1], ":")
			port, err := strconv.ParseInt(portHex, 16, 32)
			if ok && err == nil && slices.Contains(ports, int(port)) {
				out["socket:["+f[9]+"]"] = true
			}
		}
	}
	return out
}

// dsnPort is the TCP port a MySQL DSN names (3306 when it names none).
func dsnPort(dsn string) string {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "3306"
	}
	if _, port, err := net.SplitHostPort(cfg.Addr); err == nil && port != "" {
		return port
	}
	return "3306"
}

// servesPort reports whether a mariadbd's command line (NUL-separated
// arguments) says it listens on port: its --port=N, or no --port at all
// for the default 3306.
func servesPort(cmdline []byte, port string) bool {
	for _, arg := range bytes.Split(cmdline, []byte{0}) {
		if v, ok := bytes.CutPrefix(arg, []byte("--port=")); ok {
			return string(v) == port
		}
	}
	return port == "3306"
}

// procTicks is a process's utime+stime (with children's, for this process:
// redis-benchmark runs as its child) and its command name.
func procTicks(dir string, children bool) (int64, string, bool) {
	b, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return 0, "", false
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return 0, "", false
	}
	f := strings.Fields(string(b[end+1:])) // f[0] is field 3 (state)
	if len(f) < 15 {
		return 0, "", false
	}
	n := func(field int) int64 { v, _ := strconv.ParseInt(f[field-3], 10, 64); return v }
	t := n(14) + n(15) // utime, stime
	if children {
		t += n(16) + n(17) // cutime, cstime
	}
	return t, string(b[open+1 : end]), true
}

// cpuTable is the CPU seconds per group per phase, as markdown.
func cpuTable() string {
	if len(cpuPhases) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n| CPU seconds by process (%d cores) | wall s | %s | everything else | idle | stolen |\n|---|---:|",
		runtime.NumCPU(), strings.Join(cpuGroups, " | "))
	b.WriteString(strings.Repeat("---:|", len(cpuGroups)+3) + "\n")
	for _, ph := range cpuPhases {
		fmt.Fprintf(&b, "| %s | %.1f |", ph.name, ph.wall)
		for _, g := range cpuGroups {
			fmt.Fprintf(&b, " %.1f |", ph.group[g])
		}
		fmt.Fprintf(&b, " %.1f | %.1f | %.1f |\n", ph.other, ph.idle, ph.steal)
	}
	b.WriteString("\nbenchtable is this process: the service and the load generator of the HTTP phases (with the redis-benchmark child);" +
		" everything else is the machine's busy time less the named processes (other test runs, the kernel).\n")
	return b.String()
}

// processCPUPerAnswer is the CPU µs per answer phase r cost this process
// (the service and its load generator): what an answer costs when it
// sends nothing to the servers, as a sold-out answer and one before a
// campaign's opening do not. The servers are left out: the machine's
// other runs (the tests of other clones) share them, and their CPU in a
// window is those runs' and the background jobs', not the answers'.
// Unlike a rate, it depends neither on how many clients a phase has nor
// on what else the machine runs meanwhile. False when /proc gave no
// sample of the phase or it answered nothing.
func processCPUPerAnswer(r httpResult) (float64, bool) {
	answers := r.answers()
	if answers == 0 {
		return 0, false
	}
	for i := len(cpuPhases) - 1; i >= 0; i-- {
		if ph := cpuPhases[i]; ph.name == r.name {
			return ph.group["benchtable"] * 1e6 / float64(answers), true
		}
	}
	return 0, false
}

// costPerAnswer is the CPU each HTTP phase spent per answer, by process,
// and the rate the machine's cores could serve at that cost: the ceiling a
// phase meets when the CPU, not waiting, bounds it. Against the bare
// handler's measured rate, it says whether a missed ratio can be met on this
// machine at all with the work each answer does now.
func costPerAnswer(web webRun) string {
	byName := map[string]cpuPhase{}
	for _, ph := range cpuPhases {
		byName[ph.name] = ph
	}
	bare := median(web.bare) // 0 (the last column "–") when the HTTP group did not run
	phases := web.phases
	if web.camp != nil {
		phases = append(slices.Clone(phases), web.camp.phases...)
	}
	var b strings.Builder
	cores := float64(runtime.NumCPU())
	fmt.Fprintf(&b, "\n| CPU µs per answer | %s | everything else | all busy | ceiling on %d cores | of bare's median rate |\n|---|",
		strings.Join(cpuGroups, " | "), runtime.NumCPU())
	b.WriteString(strings.Repeat("---:|", len(cpuGroups)+4) + "\n")
	for _, r := range phases {
		ph, ok := byName[r.name]
		answers := r.answers()
		if !ok || answers == 0 || ph.busy <= 0 {
			continue
		}
		us := func(s float64) float64 { return s * 1e6 / float64(answers) }
		fmt.Fprintf(&b, "| %s |", r.name)
		for _, g := range cpuGroups {
			fmt.Fprintf(&b, " %.0f |", us(ph.group[g]))
		}
		ceiling := cores * 1e6 / us(ph.busy)
		share := "–"
		if bare > 0 {
			share = fmt.Sprintf("%.0f%%", 100*ceiling/bare)
		}
		fmt.Fprintf(&b, " %.0f | %.0f | %.0f/s | %s |\n", us(ph.other), us(ph.busy), ceiling, share)
	}
	b.WriteString("\nThe ceiling is the rate at which this phase's answers would use every core of the machine " +
		"(load generator included, as in the measurement); a phase far below its ceiling is waiting, not computing.\n")
	return b.String()
}
