//go:build unix

package servers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Postgres is a private PostgreSQL cluster, made by initdb for this set
// alone, listening on loopback (and on a Unix socket in its directory)
// with trust authentication inside that cluster only, superuser postgres,
// database test.
type Postgres struct {
	// Addr is the server's host:port; it stays the same across restarts.
	Addr string
	// DSN names the database test as the superuser.
	DSN string
	// Version is the server's version.
	Version string

	bins         Binaries
	as           *Account
	dir, data    string
	log, sockets string
	mu           sync.Mutex
	proc         *process
}

// StartPostgres makes a cluster with initdb (run as as), starts postgres
// on a free loopback port, and creates the database test.
func (s *Set) StartPostgres(bins Binaries, as *Account) (*Postgres, error) {
	dir, err := s.subdir("postgres", as)
	if err != nil {
		return nil, err
	}
	p := &Postgres{bins: bins, as: as, dir: dir, data: filepath.Join(dir, "data"), log: filepath.Join(dir, "postgres.log")}
	// Trust authentication is written into this cluster's own pg_hba.conf;
	// the cluster listens on loopback only and lives as long as the set.
	initdb := exec.Command(bins.Initdb, "-D", p.data, "-U", "postgres", "--auth=trust",
		"--encoding=UTF8", "--no-locale", "--no-sync")
	initdb.Dir = dir
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: as.cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb (as user %s): %v\n%s", as.Name, err, out)
	}
	// The Unix socket goes into the directory too (never the system's
	// /var/run/postgresql), unless its path would be too long for a
	// socket (108 bytes on Linux, 104 on macOS): then there is none, and
	// clients use TCP.
	p.sockets = dir
	if len(filepath.Join(dir, ".s.PGSQL.65535")) >= 104 {
		p.sockets = ""
		s.logf("no Unix socket for PostgreSQL: %s is too long a path for one", dir)
	}
	var lastErr error
	for range startAttempts {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		p.Addr = fmt.Sprintf("127.0.0.1:%d", port)
		if lastErr = p.start(true); lastErr == nil {
			s.add(p)
			return p, nil
		}
	}
	return nil, fmt.Errorf("postgres did not start: %v\n%s", lastErr, tail(p.log, 20))
}

// start runs postgres on p.Addr and waits until it takes connections;
// first creates the database test.
func (p *Postgres) start(first bool) error {
	log, err := logFile(p.log)
	if err != nil {
		return err
	}
	_, port, _ := net.SplitHostPort(p.Addr)
	cmd := exec.Command(p.bins.Postgres, "-D", p.data, "-p", port,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories="+p.sockets,
		"-c", "logging_collector=off")
	cmd.Dir = p.dir
	cmd.Stdout, cmd.Stderr = log, log
	// SIGINT is PostgreSQL's fast shutdown: clients are disconnected, not
	// waited for.
	proc, err := launch("postgres", cmd, p.as.cred, syscall.SIGINT)
	log.Close() // the child has its own copy
	if err != nil {
		return err
	}
	if err := p.wait(proc, first); err != nil {
		proc.kill()
		return err
	}
	p.mu.Lock()
	p.proc = proc
	p.mu.Unlock()
	return nil
}

// wait waits until the server takes connections (after crash recovery,
// when it was killed); first creates the database test.
func (p *Postgres) wait(proc *process, first bool) error {
	admin := fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", p.Addr)
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err := pgx.Connect(ctx, admin)
		if err == nil {
			if first {
				_, err = conn.Exec(ctx, "CREATE DATABASE test")
			}
			if err == nil {
				err = conn.QueryRow(ctx, "SHOW server_version").Scan(&p.Version)
			}
			conn.Close(ctx)
			cancel()
			if err != nil {
				return err
			}
			p.DSN = fmt.Sprintf("postgres://postgres@%s/test?sslmode=disable", p.Addr)
			return nil
		}
		cancel()
		if proc.exited() {
			return fmt.Errorf("postgres on %s exited", p.Addr)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres on %s: no connection within 60s: %v", p.Addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *Postgres) current() *process {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.proc
}

// Stop shuts the server down (fast shutdown: clients are disconnected)
// and waits for it.
func (p *Postgres) Stop() error {
	if proc := p.current(); proc != nil {
		return proc.stop()
	}
	return nil
}

// Kill ends the server and its backends at once (SIGKILL), as a crash of
// its machine would; the next start recovers from the write-ahead log.
func (p *Postgres) Kill() {
	if proc := p.current(); proc != nil {
		proc.kill()
	}
}

// Restart starts the server again on the same port after Stop or Kill and
// waits until it takes connections. The port can linger for a moment
// after a kill: it keeps trying for up to a minute.
func (p *Postgres) Restart() error {
	if proc := p.current(); proc != nil && !proc.exited() {
		return errors.New("postgres is still running")
	}
	var err error
	for deadline := time.Now().Add(restartWithin); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if err = p.start(false); err == nil {
			return nil
		}
	}
	return fmt.Errorf("postgres did not restart on %s: %v\n%s", p.Addr, err, tail(p.log, 20))
}
