package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Execer is what Flush needs: a pool, a connection or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// FlushSQL makes the session that runs it publish its pending statistics
// when the statement ends, instead of up to a second (or, when idle, ten)
// later. It is itself one committed transaction. It reads a catalog table
// because a session with no pending table statistics publishes nothing,
// not even its transaction counts (seen on PostgreSQL 15).
const FlushSQL = `SELECT pg_stat_force_next_flush(), (SELECT count(*) FROM pg_namespace)`

// Commits returns the committed transactions of database db, as
// pg_stat_database reports them, read from a session on dsn (which should
// name another database, so that reading does not count).
func Commits(t testing.TB, dsn, db string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connecting to the test server: %v", err)
	}
	defer conn.Close(ctx)
	var n int64
	if err := conn.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = $1`, db).Scan(&n); err != nil {
		t.Fatalf("reading pg_stat_database: %v", err)
	}
	return n
}

// CountCommits returns how many transactions fn commits in database db
// through session, the only session on db (a pool of one connection):
// it flushes the session's statistics before and after fn, and subtracts
// the flush that ends the measurement. A stray transaction of the server's
// own (autovacuum) can only add, so the fewest of three tries is the
// answer: prepare (when not nil, unmeasured) and fn run three times and
// must do the same work each time.
func CountCommits(t testing.TB, dsn, db string, session Execer, prepare, fn func()) int64 {
	t.Helper()
	best := int64(-1)
	for range 3 {
		if prepare != nil {
			prepare()
		}
		flush(t, session)
		before := Commits(t, dsn, db)
		fn()
		flush(t, session)
		n := Commits(t, dsn, db) - before - 1
		if best < 0 || n < best {
			best = n
		}
	}
	return best
}

func flush(t testing.TB, session Execer) {
	t.Helper()
	if _, err := session.Exec(context.Background(), FlushSQL); err != nil {
		t.Fatalf("flushing statistics: %v", err)
	}
}
