//go:build unix

package servers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// A primary and its streaming standbys, for failover tests: a standby is
// a base backup of the primary (pg_basebackup -R writes its
// primary_conninfo and standby.signal), started on a port of its own;
// Promote makes it a primary. The primary's pg_hba.conf, as initdb writes
// it with trust authentication, lets loopback replication connections in.

// StartStandby makes a new streaming standby of primary, in a directory
// of its own in the set, on a free loopback port, and waits until it
// takes connections (read-only ones: it is in recovery). It streams from
// via, the primary's address or a proxy's in front of it ("": the
// primary's).
func (s *Set) StartStandby(primary *Postgres, via string) (*Postgres, error) {
	dir, err := s.subdir(fmt.Sprintf("postgres-standby-%d", s.next()), primary.as)
	if err != nil {
		return nil, err
	}
	p := &Postgres{bins: primary.bins, as: primary.as, dir: dir, data: filepath.Join(dir, "data"),
		log: filepath.Join(dir, "postgres.log"), sockets: dir}
	if len(filepath.Join(dir, ".s.PGSQL.65535")) >= 104 {
		p.sockets = ""
	}
	var lastErr error
	for range startAttempts {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		p.Addr = fmt.Sprintf("127.0.0.1:%d", port)
		if lastErr = p.Rebase(primary, via); lastErr == nil {
			s.add(p)
			return p, nil
		}
	}
	return nil, fmt.Errorf("standby did not start: %v\n%s", lastErr, tail(p.log, 20))
}

// Rebase makes p, stopped (it is killed if it still runs), a fresh
// standby of primary on its own port, streaming from via (as
// StartStandby): its data directory is replaced by a base backup of
// primary. That is how a failover test puts the old primary back as the
// standby of the new one, on the address a multi-host DSN names.
func (p *Postgres) Rebase(primary *Postgres, via string) error {
	p.Kill()
	if err := os.RemoveAll(p.data); err != nil {
		return err
	}
	if via == "" {
		via = primary.Addr
	}
	host, port, _ := net.SplitHostPort(via)
	// --checkpoint=fast: the backup starts at once rather than at the
	// primary's next checkpoint.
	bb := exec.Command(filepath.Join(filepath.Dir(p.bins.Postgres), "pg_basebackup"),
		"-D", p.data, "-h", host, "-p", port, "-U", "postgres", "-R", "-X", "stream",
		"--checkpoint=fast", "--no-sync")
	bb.Dir = p.dir
	bb.SysProcAttr = &syscall.SysProcAttr{Credential: p.as.cred}
	if out, err := bb.CombinedOutput(); err != nil {
		return fmt.Errorf("pg_basebackup from %s: %v\n%s", via, err, out)
	}
	return p.start(false)
}

// Promote ends p's recovery (pg_promote) and waits until it takes writes.
func (p *Postgres) Promote() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.adminDSN())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_promote(true, 60)").Scan(&ok); err != nil {
		return fmt.Errorf("promoting %s: %w", p.Addr, err)
	}
	if !ok {
		return fmt.Errorf("promoting %s: not promoted within 60s", p.Addr)
	}
	return nil
}

// AlterSystem sets the server parameter name to value (ALTER SYSTEM, then
// a reload): synchronous_standby_names "*" makes every commit wait for a
// standby, "" makes replication asynchronous. A base backup taken later
// carries the setting to the standby it makes.
func (p *Postgres) AlterSystem(name, value string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.adminDSN())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "ALTER SYSTEM SET "+pgx.Identifier{name}.Sanitize()+" = "+quoteLiteral(value)); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, "SELECT pg_reload_conf()")
	return err
}

// WaitStreaming waits until n standbys stream from p.
func (p *Postgres) WaitStreaming(n int, within time.Duration) error {
	return p.waitStandbys(n, within, false)
}

// WaitReplayed waits until n standbys stream from p and have replayed
// everything p had written when it was called: a table p just created is
// then there to read on them (streaming alone says nothing of the lag).
func (p *Postgres) WaitReplayed(n int, within time.Duration) error {
	return p.waitStandbys(n, within, true)
}

// waitStandbys waits until n standbys stream from p, and with replayed,
// until they have replayed p's WAL up to where it was when called.
func (p *Postgres) waitStandbys(n int, within time.Duration, replayed bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.adminDSN())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	lsn, what := "", "streaming from"
	if replayed {
		if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
			return err
		}
		what = "having replayed the WAL up to " + lsn + " of"
	}
	for {
		var got int
		err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND ($1 = '' OR replay_lsn >= nullif($1, '')::pg_lsn)", lsn).Scan(&got)
		if err == nil && got >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("%d of %d standbys %s %s within %v", got, n, what, p.Addr, within), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// next numbers the set's servers, for the names of their directories.
func (s *Set) next() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.servers)
}

// adminDSN names the postgres database as the superuser.
func (p *Postgres) adminDSN() string {
	return fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", p.Addr)
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string {
	out := []byte{'\''}
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			out = append(out, '\'')
		}
		out = append(out, s[i])
	}
	return string(append(out, '\''))
}
