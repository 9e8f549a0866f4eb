//go:build unix

// Package servers starts private, throwaway Redis and PostgreSQL servers on
// free loopback ports, with their files in a temporary directory of their
// own, and stops, kills and restarts them on the same port: the servers of
// `make test` (internal/testkit/cmd/testservers) and of the chaos soak (soak/).
//
// It never touches the system's own servers, their configuration or their
// services. initdb and postgres refuse to run as root: under root they run
// as the postgres system user (nobody when there is none), see
// ServerAccount.
package servers

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ownerFile, in a Set's directory, holds the pid of the process that made
// it, so that a later run can tell a directory whose owner was killed.
const ownerFile = "owner.pid"

// Set is a temporary directory and the servers started in it. Close stops
// them and removes the directory.
type Set struct {
	// Dir is the temporary directory; each server keeps its files in a
	// subdirectory.
	Dir string

	logf    func(format string, args ...any)
	mu      sync.Mutex
	servers []interface{ Stop() error } // in start order
}

// NewSet removes the directories of earlier sets with the same prefix
// whose owner was killed before it could clean up, then makes a new one
// under os.TempDir. logf receives progress lines (nil: none).
func NewSet(prefix string, logf func(format string, args ...any)) (*Set, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	sweep(prefix, logf)
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &Set{Dir: dir, logf: logf}, nil
}

func (s *Set) add(srv interface{ Stop() error }) {
	s.mu.Lock()
	s.servers = append(s.servers, srv)
	s.mu.Unlock()
}

// subdir makes the directory name in the set's directory, owned by as
// (nil: the current user), and makes sure as can reach it.
func (s *Set) subdir(name string, as *Account) (string, error) {
	if as != nil && as.cred != nil {
		// The parent must be searchable by the server's user; only the
		// subdirectory is theirs.
		if err := os.Chmod(s.Dir, 0o711); err != nil {
			return "", err
		}
		if err := reachable(s.Dir, as.Name); err != nil {
			return "", err
		}
	}
	dir := filepath.Join(s.Dir, name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", err
	}
	if as != nil && as.cred != nil {
		if err := os.Chown(dir, as.uid, as.gid); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// Close stops the servers (newest first), makes sure nothing runs in the
// directory any more, and removes it. It is what makes a run leave nothing
// behind.
func (s *Set) Close() error {
	s.mu.Lock()
	servers := s.servers
	s.servers = nil
	s.mu.Unlock()
	var errs []error
	for i := len(servers) - 1; i >= 0; i-- {
		if err := servers[i].Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := noneRunningIn(s.Dir); err != nil {
		return errors.Join(append(errs, err)...)
	}
	if err := os.RemoveAll(s.Dir); err != nil {
		errs = append(errs, err)
	} else if _, err := os.Lstat(s.Dir); !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("%s is still there after removing it", s.Dir))
	}
	return errors.Join(errs...)
}

// reachable checks that every directory above dir lets others through,
// as an unprivileged server user needs.
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

// sweep removes the directories of earlier sets that were killed before
// they could clean up (SIGKILL; their servers were stopped by the kernel,
// see launch): those whose owner is gone and in which nothing runs.
func sweep(prefix string, logf func(string, ...any)) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // not made by a Set, or just being made
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

// restartWithin bounds how long a restart on the same port keeps trying
// (the port may linger for a moment after a kill).
const restartWithin = 60 * time.Second

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

// logFile opens path for appending; each start of a server adds to it.
func logFile(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
}
