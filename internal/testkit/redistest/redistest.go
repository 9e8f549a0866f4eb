// Package redistest helps tests run against a real Redis: the shared
// server named by IDEMPOTENCY_REDIS_URL (or, older spelling,
// IDEMPOTENCY_REDIS_ADDR), or a private redis-server started for one
// test, and a command counter based on MONITOR.
//
// Tests never skip silently in CI: with CI=true, a Redis that cannot be
// reached, or a missing redis-server binary, fails the test.
package redistest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// URLEnv names the environment variable holding the shared Redis's URL,
// redis://host[:port][/0]. It wins over AddrEnv.
const URLEnv = "IDEMPOTENCY_REDIS_URL"

// AddrEnv names the environment variable holding the shared Redis's
// host:port: the older spelling of URLEnv.
const AddrEnv = "IDEMPOTENCY_REDIS_ADDR"

// DefaultAddr is the shared Redis when neither URLEnv nor AddrEnv is set.
const DefaultAddr = "127.0.0.1:6379"

// Addr returns the shared Redis's host:port, or "" when URLEnv holds a URL
// the tests cannot use (Require then says why).
func Addr() string {
	addr, _ := lookupAddr()
	return addr
}

func lookupAddr() (string, error) {
	if u := os.Getenv(URLEnv); u != "" {
		return addrOf(u)
	}
	if a := os.Getenv(AddrEnv); a != "" {
		return a, nil
	}
	return DefaultAddr, nil
}

// addrOf is the host:port of a redis:// URL. The tests reach the shared
// server by address alone, so a URL must not ask for more: no
// credentials, no TLS, database 0, no options.
func addrOf(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// The parser's message would repeat the URL, password and all.
		return "", fmt.Errorf("%s is not a URL", URLEnv)
	}
	db := strings.TrimPrefix(u.Path, "/")
	switch {
	case u.Scheme != "redis":
		return "", fmt.Errorf("%s: the tests take redis://host:port/0 URLs, not %s://", URLEnv, u.Scheme)
	case u.User != nil || u.RawQuery != "" || u.Fragment != "":
		return "", fmt.Errorf("%s: the tests take redis://host:port/0 URLs, without credentials or options", URLEnv)
	case db != "" && db != "0":
		return "", fmt.Errorf("%s: the tests use database 0, not %q", URLEnv, db)
	case u.Hostname() == "":
		return "", fmt.Errorf("%s: no host", URLEnv)
	}
	port := u.Port()
	if port == "" {
		port = "6379"
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}

// Require skips the test (fails it with CI=true) unless a Redis answers
// PING at addr within a second, reporting the exact error. An addr of ""
// (Addr with an unusable URLEnv) fails the test.
func Require(t testing.TB, addr string) {
	t.Helper()
	if addr == "" {
		if _, err := lookupAddr(); err != nil {
			t.Fatalf("the shared Redis: %v", err)
		}
		t.Fatal("redistest.Require: no address")
	}
	c, err := dial(addr, time.Second)
	if err == nil {
		_, err = c.Do("PING")
		c.Close()
	}
	if err != nil {
		testutil.Unavailable(t, "Redis at %s (set %s to change): %v", addr, URLEnv, err)
	}
}

// RandomHex returns the hex of n random bytes, for key prefixes of
// their own.
func RandomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// StartServer starts a private redis-server on a free loopback port,
// without persistence, and returns its host:port. It is killed when the
// test ends. Use it when the test must be alone on the server (counting
// commands, killing the server); it skips (fails with CI=true) when the
// redis-server binary is missing.
func StartServer(t testing.TB) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testutil.Unavailable(t, "redis-server binary: %v", err)
	}
	return start(t, "redis-server", func() (*Server, error) { return startServer(t, bin, "") })
}

// StartPersistentServer is StartServer with persistence: an append-only
// file in a directory of its own, fsynced after every write
// (appendonly yes, appendfsync always), so that Restart, even after a
// crash (Kill), brings back every record the server acknowledged. It
// takes extra redis-server arguments like StartServerArgs.
func StartPersistentServer(t testing.TB, args ...string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testutil.Unavailable(t, "redis-server binary: %v", err)
	}
	return start(t, "a persistent redis-server", func() (*Server, error) {
		return startServer(t, bin, "", append([]string{"--appendonly", "yes", "--appendfsync", "always"}, args...)...)
	})
}

// StartServerArgs is StartServer with extra redis-server arguments (kept
// for Restart), e.g. "--enable-debug-command", "local" for a test that
// needs DEBUG SLEEP.
func StartServerArgs(t testing.TB, args ...string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testutil.Unavailable(t, "redis-server binary: %v", err)
	}
	return start(t, "redis-server", func() (*Server, error) { return startServer(t, bin, "", args...) })
}

// Server is a private redis-server process.
type Server struct {
	// Addr is the server's host:port.
	Addr string

	bin, dir string
	conf     string   // a configuration file to start with, if any
	args     []string // extra arguments, kept for Restart

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// StartCluster starts a Redis Cluster of n private primaries (no
// replicas), the 16384 slots split evenly between them, and returns their
// addresses once every node reports the cluster healthy. Like
// StartServer, it skips (fails with CI=true) without the redis-server
// binary.
func StartCluster(t testing.TB, n int) []string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testutil.Unavailable(t, "redis-server binary: %v", err)
	}
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = start(t, "a cluster node", func() (*Server, error) {
			return startServer(t, bin, "", "--cluster-enabled", "yes", "--cluster-node-timeout", "5000")
		}).Addr
	}
	for i, addr := range addrs {
		c, err := dial(addr, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		args := []string{"CLUSTER", "ADDSLOTS"}
		for slot := i * 16384 / n; slot < (i+1)*16384/n; slot++ {
			args = append(args, strconv.Itoa(slot))
		}
		if _, err := c.Do(args...); err != nil {
			t.Fatalf("CLUSTER ADDSLOTS on %s: %v", addr, err)
		}
		if i > 0 {
			host, port, _ := net.SplitHostPort(addrs[0])
			if _, err := c.Do("CLUSTER", "MEET", host, port); err != nil {
				t.Fatalf("CLUSTER MEET: %v", err)
			}
		}
		c.Close()
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		healthy := 0
		for _, addr := range addrs {
			if c, err := dial(addr, time.Second); err == nil {
				info, err := c.Do("CLUSTER", "INFO")
				c.Close()
				if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(n)+"\r") {
					healthy++
				}
			}
		}
		if healthy == n {
			return addrs
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster of %d nodes not healthy within 20s", n)
		}
	}
}

// start calls startServer until it succeeds, at most three times: a free
// port may be taken between finding and using it.
func start(t testing.TB, what string, startServer func() (*Server, error)) *Server {
	t.Helper()
	for attempt := 0; ; attempt++ {
		s, err := startServer()
		if err == nil {
			return s
		}
		if attempt == 2 {
			t.Fatalf("starting %s: %v", what, err)
		}
	}
}

// startServer starts redis-server on a free port, with the configuration
// file conf (none when "") and extra arguments.
func startServer(t testing.TB, bin, conf string, extra ...string) (*Server, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s := &Server{
		Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		bin:  bin,
		dir:  t.TempDir(),
		conf: conf,
		args: extra,
	}
	if err := s.launch(); err != nil {
		return nil, err
	}
	t.Cleanup(s.Kill)
	return s, nil
}

// launch runs redis-server on s.Addr and waits until it answers PING.
func (s *Server) launch() error {
	_, port, _ := net.SplitHostPort(s.Addr)
	var args []string
	if s.conf != "" {
		args = append(args, s.conf) // a configuration file comes first
	}
	// No persistence unless s.args asks for it: later arguments win.
	args = append(args, "--port", port, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--logfile", s.dir+"/redis.log")
	cmd := exec.Command(s.bin, append(args, s.args...)...)
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	for deadline := time.Now().Add(5 * time.Second); ; {
		c, err := dial(s.Addr, 200*time.Millisecond)
		if err == nil {
			_, err = c.Do("PING")
			c.Close()
			// A server that requires a password is up when it says so.
			if err == nil || strings.HasPrefix(err.Error(), "NOAUTH") {
				return nil
			}
		}
		select {
		case <-done:
			log, _ := os.ReadFile(s.dir + "/redis.log")
			return fmt.Errorf("redis-server on port %s exited: %s", port, log)
		default:
		}
		if time.Now().After(deadline) {
			s.Kill()
			return fmt.Errorf("redis-server on port %s: %v", port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill stops the server at once (SIGKILL), as a crash would, and waits
// for the process to exit. It is idempotent.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	_ = cmd.Process.Kill()
	<-done
}

// Restart kills the server if it runs and starts it again on the same
// port. Without persistence it comes back empty, as a Redis without
// persistence does after a crash: every record it held is gone.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Kill()
	var err error
	// The port may linger briefly after the old process died.
	for attempt := 0; attempt < 10; attempt++ {
		if err = s.launch(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("restarting redis-server: %v", err)
}

// Monitor counts the commands that clients send to a server, by reading
// its MONITOR feed: commands run inside Lua scripts are told apart (INFO
// commandstats counts them as calls too, so it cannot count round trips),
// and so are the Monitor's own commands.
type Monitor struct {
	t       testing.TB
	feed    *conn  // in MONITOR mode
	control *conn  // sends markers and INFO; its commands are not counted
	self    string // control's address, as MONITOR names clients
	lastArg string // the last argument of the line next read
}

// NewMonitor starts monitoring the server at addr until the test ends.
// Only use it on a private server: MONITOR slows a server down.
func NewMonitor(t testing.TB, addr string) *Monitor {
	t.Helper()
	feed, err := dial(addr, time.Second)
	if err != nil {
		t.Fatalf("monitor: %v", err)
	}
	t.Cleanup(func() { feed.Close() })
	if _, err := feed.Do("MONITOR"); err != nil {
		t.Fatalf("MONITOR: %v", err)
	}
	control, err := dial(addr, time.Second)
	if err != nil {
		t.Fatalf("monitor: %v", err)
	}
	t.Cleanup(func() { control.Close() })
	return &Monitor{t: t, feed: feed, control: control, self: control.nc.LocalAddr().String()}
}

// Command is one command a client sent, as MONITOR shows it, with the
// commands that the script it ran (if any) called.
type Command struct {
	Name   string   // lower case, e.g. "evalsha"
	Script []string // commands called from Lua while it ran, upper case
}

// Commands runs fn and returns the commands clients other than the
// Monitor sent meanwhile, in order.
func (m *Monitor) Commands(fn func()) []Command {
	m.t.Helper()
	begin, end := "begin-"+RandomHex(8), "end-"+RandomHex(8)
	m.mark(begin)
	m.skipTo(begin)
	fn()
	m.mark(end)
	var cmds []Command
	for {
		client, name := m.next()
		switch {
		case client == m.self && name == "echo":
			if m.lastArg == end {
				return cmds
			}
		case client == m.self:
		case client == "lua":
			if len(cmds) == 0 {
				m.t.Fatalf("monitor: script command %s before any client command", name)
			}
			last := &cmds[len(cmds)-1]
			last.Script = append(last.Script, strings.ToUpper(name))
		default:
			cmds = append(cmds, Command{Name: name})
		}
	}
}

// CommandStats returns the calls per command from INFO commandstats
// (cmdstat_evalsha and so on; script-internal calls included).
func (m *Monitor) CommandStats() map[string]int {
	m.t.Helper()
	v, err := m.control.Do("INFO", "commandstats")
	if err != nil {
		m.t.Fatalf("INFO commandstats: %v", err)
	}
	stats := make(map[string]int)
	for _, line := range strings.Split(v, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		n, _ := strconv.Atoi(calls)
		stats[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return stats
}

func (m *Monitor) mark(marker string) {
	m.t.Helper()
	if _, err := m.control.Do("ECHO", marker); err != nil {
		m.t.Fatalf("monitor marker: %v", err)
	}
}

// skipTo reads the feed up to the Monitor's ECHO of marker.
func (m *Monitor) skipTo(marker string) {
	m.t.Helper()
	for {
		if client, name := m.next(); client == m.self && name == "echo" && m.lastArg == marker {
			return
		}
	}
}

// next reads one MONITOR line: `<time> [<db> <client>] "<cmd>" "<arg>"...`.
// It keeps the last argument in m.lastArg (for markers).
func (m *Monitor) next() (client, name string) {
	m.t.Helper()
	m.feed.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := m.feed.r.ReadString('\n')
	if err != nil {
		m.t.Fatalf("monitor feed: %v", err)
	}
	line = strings.TrimSuffix(strings.TrimPrefix(line, "+"), "\r\n")
	open, close := strings.IndexByte(line, '['), strings.IndexByte(line, ']')
	if open < 0 || close < open {
		m.t.Fatalf("monitor feed: unexpected line %q", line)
	}
	_, client, _ = strings.Cut(line[open+1:close], " ")
	args := strings.Fields(line[close+1:])
	if len(args) == 0 {
		m.t.Fatalf("monitor feed: no command in %q", line)
	}
	name = strings.ToLower(strings.Trim(args[0], `"`))
	m.lastArg = strings.Trim(args[len(args)-1], `"`)
	return client, name
}

// conn is a bare RESP2 connection, enough for PING, ECHO, INFO and
// MONITOR without involving the client under test.
type conn struct {
	nc net.Conn
	r  *bufio.Reader
}

func dial(addr string, timeout time.Duration) (*conn, error) {
	var d net.Dialer
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &conn{nc: nc, r: bufio.NewReader(nc)}, nil
}

func (c *conn) Close() error { return c.nc.Close() }

// Do sends a command and returns its reply as a string (status, integer
// or bulk string replies only).
func (c *conn) Do(args ...string) (string, error) {
	c.nc.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.nc.Write([]byte(b.String())); err != nil {
		return "", err
	}
	line, err := c.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", errors.New(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", fmt.Errorf("bulk reply %q", line)
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(c.r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return "", fmt.Errorf("unsupported reply %q", line)
}

// AddClusterReplicas gives each primary of the cluster StartCluster
// started (at primaries) a replica of its own, and returns the replicas,
// in the order of their primaries, once each is in sync.
func AddClusterReplicas(t testing.TB, primaries []string) []*Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testutil.Unavailable(t, "redis-server binary: %v", err)
	}
	host, port, _ := net.SplitHostPort(primaries[0])
	replicas := make([]*Server, len(primaries))
	for i, p := range primaries {
		c, err := dial(p, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		id, err := c.Do("CLUSTER", "MYID")
		c.Close()
		if err != nil {
			t.Fatalf("CLUSTER MYID on %s: %v", p, err)
		}
		replicas[i] = start(t, "a cluster replica", func() (*Server, error) {
			return startServer(t, bin, "", "--cluster-enabled", "yes", "--cluster-node-timeout", "5000")
		})
		r, err := dial(replicas[i].Addr, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Do("CLUSTER", "MEET", host, port); err != nil {
			t.Fatalf("CLUSTER MEET: %v", err)
		}
		// The replica must know its primary before it can follow it.
		testutil.Eventually(t, 20*time.Second, "the replica knowing its primary", func() bool {
			_, err := r.Do("CLUSTER", "REPLICATE", id)
			return err == nil
		})
		r.Close()
	}
	for _, r := range replicas {
		testutil.Eventually(t, 30*time.Second, "the cluster replica in sync", func() bool {
			return linkUp(context.Background(), r.Addr)
		})
	}
	return replicas
}
