// Package pgtest finds the PostgreSQL server the tests run against and
// gives each test tables and databases of its own, so that runs (and test
// packages running in parallel) never collide and leave nothing behind.
//
// The server is named by IDEMPOTENCY_POSTGRES_DSN (make test starts a
// private one and sets it, see internal/testkit/cmd/testservers; default:
// loopback, database test). When it cannot be reached, tests are skipped,
// except under CI=true, where they fail: CI must never pass by skipping.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage/redact"
)

// EnvDSN names the environment variable holding the test server's DSN.
const EnvDSN = "IDEMPOTENCY_POSTGRES_DSN"

// DefaultDSN is used when EnvDSN is not set.
const DefaultDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// DSN returns the test server's connection string.
func DSN() string {
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		return dsn
	}
	return DefaultDSN
}

var (
	reachOnce sync.Once
	reachErr  error
)

// Require returns the test server's DSN once it answers a ping. If it does
// not, the test is skipped with the error, or failed under CI=true.
func Require(t testing.TB) string {
	t.Helper()
	dsn := DSN()
	reachOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(ctx)
		}
		reachErr = err
	})
	if reachErr != nil {
		testutil.Unavailable(t, "PostgreSQL at %s=%q is unreachable: %v", EnvDSN, redact.DSN(dsn), reachErr)
	}
	return dsn
}

// Name returns a fresh name with prefix, unique across runs.
func Name(prefix string) string {
	b := make([]byte, 6)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// Table returns a fresh table name, dropped (if it was created) when the
// test ends.
func Table(t testing.TB, dsn string) string {
	t.Helper()
	name := Name("idem_test_")
	t.Cleanup(func() { Exec(t, dsn, `DROP TABLE IF EXISTS `+pgx.Identifier{name}.Sanitize()) })
	return name
}

// Database creates a fresh database and returns a DSN for it; the
// database is dropped when the test ends. Statistics of a database of
// one's own are not disturbed by tests running in parallel.
func Database(t testing.TB, dsn string) (dbDSN, name string) {
	t.Helper()
	name = Name("idempotency_test_")
	Exec(t, dsn, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize())
	t.Cleanup(func() {
		Exec(t, dsn, `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`)
	})
	return WithDatabase(dsn, name), name
}

// WithDatabase returns dsn pointed at database name.
func WithDatabase(dsn, name string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		if u, err := url.Parse(dsn); err == nil {
			u.Path = "/" + name
			return u.String()
		}
	}
	// Keyword/value form: a later keyword overrides an earlier one.
	return dsn + " dbname=" + name
}

// Exec runs one statement on a connection of its own.
func Exec(t testing.TB, dsn, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connecting to the test server: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// WaitForLockWait waits until a statement on table waits for a lock (it
// is blocked by another transaction's row or table lock).
func WaitForLockWait(t testing.TB, dsn, table string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connecting to the test server: %v", err)
	}
	defer conn.Close(context.Background())
	for {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, table).Scan(&n); err != nil {
			t.Fatalf("waiting for a lock wait: %v", err)
		}
		if n > 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}
