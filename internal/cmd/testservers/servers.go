//go:build unix

package main

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The variables that name the servers, as internal/redistest and
// internal/pgtest read them.
const (
	envRedisURL    = "IDEMPOTENCY_REDIS_URL"
	envRedisAddr   = "IDEMPOTENCY_REDIS_ADDR" // older spelling: host:port
	envPostgresDSN = "IDEMPOTENCY_POSTGRES_DSN"
)

// dirPrefix starts the name of the temporary directory of a run.
const dirPrefix = "idempotency-testservers-"

// ownerFile, in the temporary directory, holds the pid of the run that
// made it.
const ownerFile = "owner.pid"

// servers are the private servers of one run.
type servers struct {
	dir   string    // the temporary directory; "" until made
	procs []*server // running servers, in start order
	env   []string  // NAME=value for the command
	names []string  // what was started, for the last log line
}

// server is one running server process.
type server struct {
	name    string
	cmd     *exec.Cmd
	done    chan struct{}  // closed when the process has exited
	stopSig syscall.Signal // asks it to shut down cleanly
}

// wanted reports which servers the environment leaves to testservers.
func wanted(getenv func(string) string) (redis, postgres bool) {
	return getenv(envRedisURL) == "" && getenv(envRedisAddr) == "", getenv(envPostgresDSN) == ""
}

func (s *servers) start() error {
	needRedis, needPostgres := wanted(os.Getenv)
	if !needRedis {
		logf("Redis: using the server named by %s", firstSet(envRedisURL, envRedisAddr))
	}
	if !needPostgres {
		logf("PostgreSQL: using the server named by %s", envPostgresDSN)
	}
	if !needRedis && !needPostgres {
		return nil
	}
	bins, err := findBinaries(needRedis, needPostgres)
	if err != nil {
		return err
	}
	// Under root, postgres runs as another user, who must reach its
	// directory: the parent is searchable, only the postgres subdirectory
	// is theirs.
	var pgUser *account
	if needPostgres {
		if pgUser, err = serverAccount(); err != nil {
			return err
		}
	}
	sweep()
	if s.dir, err = os.MkdirTemp("", dirPrefix); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(s.dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return err
	}
	if pgUser != nil && pgUser.cred != nil {
		if err := os.Chmod(s.dir, 0o711); err != nil {
			return err
		}
		if err := reachable(s.dir, pgUser.name); err != nil {
			return err
		}
	}
	logf("files in %s", s.dir)
	if needRedis {
		if err := s.startRedis(bins.redis); err != nil {
			return err
		}
	}
	if needPostgres {
		if err := s.startPostgres(bins, pgUser); err != nil {
			return err
		}
	}
	return nil
}

func firstSet(names ...string) string {
	for _, n := range names {
		if os.Getenv(n) != "" {
			return n
		}
	}
	return ""
}

// reachable checks that every directory above dir lets others through,
// as the unprivileged server user needs.
func reachable(dir, user string) error {
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("PostgreSQL runs as user %s, who cannot reach %s: %s is not searchable by others; set TMPDIR to a directory that is (e.g. TMPDIR=/tmp)", user, dir, p)
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// launch starts a server process in a process group of its own, so that a
// ^C on the terminal reaches the command but not the servers: they are
// stopped after the command has ended. Should this process die without
// stopping them, the kernel sends them stopSig.
func (s *servers) launch(name string, cmd *exec.Cmd, cred *syscall.Credential, stopSig syscall.Signal) (*server, error) {
	cmd.SysProcAttr = serverAttr(cred, stopSig)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &server{name: name, cmd: cmd, done: make(chan struct{}), stopSig: stopSig}
	go func() { _ = cmd.Wait(); close(p.done) }()
	s.procs = append(s.procs, p)
	return p, nil
}

// exited reports whether the process has ended.
func (p *server) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stopTimeout is how long a server gets to shut down cleanly.
const stopTimeout = 30 * time.Second

// stop asks the server to shut down and waits; it kills a server that
// takes longer than stopTimeout.
func (p *server) stop() error {
	if p.exited() {
		return nil
	}
	_ = p.cmd.Process.Signal(p.stopSig)
	select {
	case <-p.done:
		return nil
	case <-time.After(stopTimeout):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return fmt.Errorf("%s (pid %d) did not stop within %v; killed it", p.name, p.cmd.Process.Pid, stopTimeout)
}

// stop stops the servers, makes sure nothing runs in the directory any
// more, and removes it. It is what makes a run leave nothing behind.
func (s *servers) stop() error {
	var errs []error
	for i := len(s.procs) - 1; i >= 0; i-- {
		if err := s.procs[i].stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if s.dir == "" {
		return errors.Join(errs...)
	}
	if err := noneRunningIn(s.dir); err != nil {
		errs = append(errs, err)
	} else if err := os.RemoveAll(s.dir); err != nil {
		errs = append(errs, err)
	} else if _, err := os.Lstat(s.dir); !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("%s is still there after removing it", s.dir))
	}
	if len(errs) == 0 && len(s.names) > 0 {
		logf("stopped %s; removed %s", strings.Join(s.names, " and "), s.dir)
	}
	return errors.Join(errs...)
}

// sweep removes the directories of earlier runs that were killed before
// they could clean up (SIGKILL; their servers were stopped by the kernel,
// see launch): those whose owner is gone and in which nothing runs.
func sweep() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // not made by testservers, or just being made
		}
		pid, err := strconv.Atoi(string(b))
		if err != nil || syscall.Kill(pid, 0) != syscall.ESRCH || len(processesIn(dir)) > 0 {
			continue
		}
		if os.RemoveAll(dir) == nil {
			logf("removed %s, left by an earlier run (pid %d) that was killed", dir, pid)
		}
	}
}

// noneRunningIn fails when a process still has its working directory in
// dir (a server chdirs into its data directory, and so do its children),
// after giving stragglers a few seconds.
func noneRunningIn(dir string) error {
	var left []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		left = processesIn(dir)
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes still running in %s (left in place): %s", dir, strings.Join(left, ", "))
		}
	}
}

// processesIn lists "pid (name)" of the processes whose working directory
// is in dir, from /proc (nothing where there is no /proc).
func processesIn(dir string) []string {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var found []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cwd, err := os.Readlink("/proc/" + e.Name() + "/cwd")
		if err != nil || (cwd != dir && !strings.HasPrefix(cwd, dir+"/")) {
			continue
		}
		comm, _ := os.ReadFile("/proc/" + e.Name() + "/comm")
		found = append(found, fmt.Sprintf("%s (%s)", e.Name(), strings.TrimSpace(string(comm))))
	}
	return found
}

// freePort returns a loopback TCP port that was free a moment ago. A
// server that finds it taken after all exits, and is started again on
// another one.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startAttempts is how often a server is started on a new free port
// before giving up.
const startAttempts = 3

// tail returns the last n lines of the file at path, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
