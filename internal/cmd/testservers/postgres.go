//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// account is the user initdb and postgres run as.
type account struct {
	name string
	uid  int
	gid  int
	cred *syscall.Credential // nil: the current user
}

// serverAccount is the current user, or under root (where initdb and
// postgres refuse to run) the postgres system user, else nobody.
func serverAccount() (*account, error) {
	if os.Geteuid() != 0 {
		name := strconv.Itoa(os.Getuid())
		if u, err := user.Current(); err == nil {
			name = u.Username
		}
		return &account{name: name, uid: os.Getuid(), gid: os.Getgid()}, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.Atoi(u.Uid)
		gid, err2 := strconv.Atoi(u.Gid)
		if err1 != nil || err2 != nil || uid == 0 {
			continue
		}
		return &account{name: name, uid: uid, gid: gid,
			cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}, nil
	}
	return nil, errors.New("running as root, but there is neither a postgres nor a nobody user for initdb and postgres to run as (they refuse root)")
}

// startPostgres makes a cluster of its own with initdb, starts postgres
// on a free loopback port, and creates the database test.
func (s *servers) startPostgres(bins binaries, as *account) error {
	dir := filepath.Join(s.dir, "postgres")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	if as.cred != nil {
		if err := os.Chown(dir, as.uid, as.gid); err != nil {
			return err
		}
	}
	data := filepath.Join(dir, "data")
	// Trust authentication is written into this cluster's own pg_hba.conf;
	// the cluster listens on loopback only and lives as long as the run.
	initdb := exec.Command(bins.initdb, "-D", data, "-U", "postgres", "--auth=trust",
		"--encoding=UTF8", "--no-locale", "--no-sync")
	initdb.Dir = dir
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: as.cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb (as user %s): %v\n%s", as.name, err, out)
	}
	logFile := filepath.Join(dir, "postgres.log")
	// The Unix socket goes into the directory too (never the system's
	// /var/run/postgresql), unless its path would be too long for a
	// socket (108 bytes on Linux, 104 on macOS): then there is none, the
	// tests use TCP.
	sockets := dir
	if len(filepath.Join(dir, ".s.PGSQL.65535")) >= 104 {
		sockets = ""
		logf("no Unix socket for PostgreSQL: %s is too long a path for one", dir)
	}
	var lastErr error
	for range startAttempts {
		port, err := freePort()
		if err != nil {
			return err
		}
		log, err := os.OpenFile(logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		cmd := exec.Command(bins.postgres, "-D", data, "-p", strconv.Itoa(port),
			"-c", "listen_addresses=127.0.0.1",
			"-c", "unix_socket_directories="+sockets,
			"-c", "logging_collector=off")
		cmd.Dir = dir
		cmd.Stdout, cmd.Stderr = log, log
		// SIGINT is PostgreSQL's fast shutdown: clients are disconnected,
		// not waited for.
		p, err := s.launch("postgres", cmd, as.cred, syscall.SIGINT)
		log.Close() // the child has its own copy
		if err != nil {
			return err
		}
		dsn, version, err := waitPostgres(p, port)
		if err == nil {
			s.env = append(s.env, envPostgresDSN+"="+dsn)
			s.names = append(s.names, "PostgreSQL")
			logf("PostgreSQL %s on 127.0.0.1:%d, running as user %s: %s=%s", version, port, as.name, envPostgresDSN, dsn)
			return nil
		}
		lastErr = err
		if err := p.stop(); err != nil {
			return err
		}
	}
	return fmt.Errorf("postgres did not start: %v\n%s", lastErr, tail(logFile, 20))
}

// waitPostgres waits until the server on port takes connections, creates
// the database test, and returns the DSN of that database.
func waitPostgres(p *server, port int) (dsn, version string, err error) {
	admin := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err := pgx.Connect(ctx, admin)
		if err == nil {
			if _, err = conn.Exec(ctx, "CREATE DATABASE test"); err == nil {
				err = conn.QueryRow(ctx, "SHOW server_version").Scan(&version)
			}
			conn.Close(ctx)
			cancel()
			if err != nil {
				return "", "", err
			}
			return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/test?sslmode=disable", port), version, nil
		}
		cancel()
		if p.exited() {
			return "", "", fmt.Errorf("postgres on port %d exited", port)
		}
		if time.Now().After(deadline) {
			return "", "", fmt.Errorf("postgres on port %d: no connection within 60s: %v", port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
