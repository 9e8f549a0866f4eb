package pgtest

import (
	"context"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Isolation levels a database or role can default to, as
// default_transaction_isolation spells them.
var isolationLevels = []string{"serializable", "repeatable read", "read committed", "read uncommitted"}

// DatabaseWithIsolation creates a database of the test's own on the test
// server whose default transaction isolation is level ("serializable",
// "repeatable read", ...), as some organisations configure theirs and as
// PostgreSQL-compatible databases such as CockroachDB default to, and
// returns a DSN for it. The database is dropped when the test ends. It
// skips (fails under CI=true) when the server does not answer, like
// Require, and fails the test unless a new session on the database
// really starts with level.
func DatabaseWithIsolation(t testing.TB, level string) string {
	t.Helper()
	checkLevel(t, level)
	dsn := Require(t)
	dbDSN, name := Database(t, dsn)
	Exec(t, dsn, `ALTER DATABASE `+pgx.Identifier{name}.Sanitize()+` SET default_transaction_isolation = '`+level+`'`)
	if got := Setting(t, dbDSN, "default_transaction_isolation"); got != level {
		t.Fatalf("database %s: default_transaction_isolation is %q, want %q", name, got, level)
	}
	return dbDSN
}

// Role creates a login role of the test's own (no password: the test
// servers trust loopback connections) with the given extra attributes
// (e.g. "CONNECTION LIMIT 0"; "" for none) and returns dsn connecting as
// it. The role is dropped when the test ends, with whatever it owns and
// every privilege granted to it; its sessions are ended first.
func Role(t testing.TB, dsn, attributes string) (roleDSN, name string) {
	t.Helper()
	name = Name("idem_role_")
	role := pgx.Identifier{name}.Sanitize()
	Exec(t, dsn, `CREATE ROLE `+role+` LOGIN `+attributes)
	t.Cleanup(func() {
		Exec(t, dsn, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, name)
		Exec(t, dsn, `DROP OWNED BY `+role)
		Exec(t, dsn, `DROP ROLE IF EXISTS `+role)
	})
	return WithUser(dsn, name), name
}

// RoleWithIsolation is Role whose sessions default to the transaction
// isolation level: a role default, which applies on every database.
func RoleWithIsolation(t testing.TB, level string) string {
	t.Helper()
	checkLevel(t, level)
	dsn := Require(t)
	roleDSN, name := Role(t, dsn, "")
	Exec(t, dsn, `ALTER ROLE `+pgx.Identifier{name}.Sanitize()+` SET default_transaction_isolation = '`+level+`'`)
	// Since PostgreSQL 15 only the owner of schema public may create
	// tables in it.
	Exec(t, dsn, `GRANT CREATE, USAGE ON SCHEMA public TO `+pgx.Identifier{name}.Sanitize())
	if got := Setting(t, roleDSN, "default_transaction_isolation"); got != level {
		t.Fatalf("role %s: default_transaction_isolation is %q, want %q", name, got, level)
	}
	return roleDSN
}

// WithUser returns dsn connecting as user, without a password.
func WithUser(dsn, user string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		if u, err := url.Parse(dsn); err == nil {
			u.User = url.User(user)
			return u.String()
		}
	}
	// Keyword/value form: a later keyword overrides an earlier one.
	return dsn + " user=" + user + " password=''"
}

// Setting returns the value of a server setting in a new session on dsn.
func Setting(t testing.TB, dsn, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connecting to the test server: %v", err)
	}
	defer conn.Close(ctx)
	var v string
	if err := conn.QueryRow(ctx, `SELECT current_setting($1)`, name).Scan(&v); err != nil {
		t.Fatalf("reading %s: %v", name, err)
	}
	return v
}

func checkLevel(t testing.TB, level string) {
	t.Helper()
	for _, l := range isolationLevels {
		if l == level {
			return
		}
	}
	t.Fatalf("pgtest: isolation level %q: want one of %q", level, isolationLevels)
}

// Address returns the host:port that dsn connects to.
func Address(t testing.TB, dsn string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("parsing the test server's DSN: %v", err)
	}
	return net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
}

// WithAddress returns dsn connecting to addr (host:port) instead, e.g.
// through a proxy that can cut or stall the connections.
func WithAddress(dsn, addr string) string {
	host, port, _ := net.SplitHostPort(addr)
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		if u, err := url.Parse(dsn); err == nil {
			u.Host = addr
			return u.String()
		}
	}
	return dsn + " host=" + host + " port=" + port
}
