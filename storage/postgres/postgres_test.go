package postgres_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
	"github.com/caddy-idempotency/caddy-idempotency/storage/storagetest"
)

// The tests run against the server named by IDEMPOTENCY_POSTGRES_DSN
// (default: loopback, database test), each on tables of its own; see
// internal/testkit/pgtest.

// testPool returns a pool of at most maxConns connections on dsn. The
// store that gets it closes it.
func testPool(t testing.TB, dsn string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return pool
}

// newStore returns a store on a fresh table of the test server, closed and
// dropped when the test ends. opts.Table is filled in when empty; the
// table is created on first use.
func newStore(t testing.TB, opts postgres.Options) *postgres.Store {
	t.Helper()
	dsn := pgtest.Require(t)
	if opts.Table == "" {
		opts.Table = pgtest.Table(t, dsn)
	}
	opts.CreateTable = true
	return openStore(t, testPool(t, dsn, 16), opts)
}

// openStore builds a store on pool, closed when the test ends.
func openStore(t testing.TB, pool *pgxpool.Pool, opts postgres.Options) *postgres.Store {
	t.Helper()
	s, err := postgres.New(pool, opts)
	if err != nil {
		pool.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	storagetest.Run(t, newStore(t, postgres.Options{}))
}

// TestConformanceWithoutStatementCache runs the suite in the query modes
// that need no prepared statements kept on a session: what a DSN sets
// (default_query_exec_mode=exec or simple_protocol) to go through a
// transaction-pooling proxy such as PgBouncer.
func TestConformanceWithoutStatementCache(t *testing.T) {
	for _, mode := range []string{"exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			dsn := pgtest.Require(t)
			cfg, err := pgxpool.ParseConfig(dsn + withParam(dsn) + "default_query_exec_mode=" + mode)
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxConns = 8
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			storagetest.Run(t, openStore(t, pool, postgres.Options{Table: pgtest.Table(t, dsn), CreateTable: true}))
		})
	}
}

// withParam returns what joins one more parameter to dsn.
func withParam(dsn string) string {
	switch {
	case !strings.Contains(dsn, "://"):
		return " "
	case strings.Contains(dsn, "?"):
		return "&"
	}
	return "?"
}

func BenchmarkPostgres(b *testing.B) {
	storagetest.Bench(b, newStore(b, postgres.Options{}))
}

var (
	fpA = []byte("fingerprint A, as long as a SHA-256")
	fpB = []byte("fingerprint B, as long as a SHA-256")
)

// ok is a helper for store calls that must succeed.
func ok(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// acquire reserves key and fails unless it is acquired.
func acquire(t testing.TB, s storage.Store, key storage.Key, fp []byte, lease time.Duration) storage.Token {
	t.Helper()
	res, err := s.Reserve(context.Background(), key, fp, lease)
	if err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("Reserve(%q) = %v, %v; want acquired", key.ID, res.Outcome, err)
	}
	return res.Token
}

// outcome reserves key and returns what happened.
func outcome(t testing.TB, s storage.Store, key storage.Key, fp []byte) storage.Outcome {
	t.Helper()
	res, err := s.Reserve(context.Background(), key, fp, time.Minute)
	if err != nil {
		t.Fatalf("Reserve(%q): %v", key.ID, err)
	}
	return res.Outcome
}

// completed stores a small completed record under key for ttl.
func completed(t testing.TB, s storage.Store, key storage.Key, ttl time.Duration) {
	t.Helper()
	tok := acquire(t, s, key, fpA, time.Minute)
	ok(t, s.Complete(context.Background(), key, tok, &storage.Response{Status: 201, Body: []byte("done")}, ttl))
}

// Ping checks the table and every column the store uses, so that a
// table missing or of an older version is named at start-up rather than
// by every request (issue 28); with CreateTable it creates the table.
// Check finds what Ping would, without writing: with CreateTable a table
// that does not exist yet is fine and is not created; without it, it is
// named; a read-only server is ErrReadOnly.
func TestCheckWritesNothing(t *testing.T) {
	dsn := pgtest.Require(t)
	ctx := context.Background()
	table := pgtest.Table(t, dsn)
	ok(t, openStore(t, testPool(t, dsn, 2), postgres.Options{Table: table, CreateTable: true}).Check(ctx))
	var n int
	p := testPool(t, dsn, 1)
	defer p.Close()
	ok(t, p.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = $1", table).Scan(&n))
	if n != 0 {
		t.Fatalf("Check created the table %s", table)
	}
	err := openStore(t, testPool(t, dsn, 2), postgres.Options{Table: table}).Check(ctx)
	if err == nil || !strings.Contains(err.Error(), `table "`+table+`" does not exist`) || storage.Unavailable(err) {
		t.Errorf("Check without the table and CreateTable: %v", err)
	}
	readOnly, name := pgtest.Database(t, dsn)
	pgtest.Exec(t, dsn, `ALTER DATABASE `+pgx.Identifier{name}.Sanitize()+` SET default_transaction_read_only = on`)
	err = openStore(t, testPool(t, readOnly, 2), postgres.Options{CreateTable: true}).Check(ctx)
	if !errors.Is(err, postgres.ErrReadOnly) || !errors.Is(err, storage.ErrReadOnly) {
		t.Errorf("Check on a read-only database: %v, want ErrReadOnly", err)
	}
}

func TestPingChecksTheTableAndItsColumns(t *testing.T) {
	dsn := pgtest.Require(t)
	ctx := context.Background()
	missing := pgtest.Table(t, dsn)
	err := openStore(t, testPool(t, dsn, 2), postgres.Options{Table: missing}).Ping(ctx)
	for _, want := range []string{`table "` + missing + `" does not exist`, "caddy idempotency schema", "create_table"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Ping without the table: %v, want it to say %s", err, want)
		}
	}

	for _, col := range []string{"detail", "body_omitted"} {
		table := pgtest.Table(t, dsn)
		ddl, err := postgres.Schema(table)
		ok(t, err)
		pgtest.Exec(t, dsn, ddl[0])
		pgtest.Exec(t, dsn, "ALTER TABLE "+pgx.Identifier{table}.Sanitize()+" DROP COLUMN "+col)
		err = openStore(t, testPool(t, dsn, 2), postgres.Options{Table: table}).Ping(ctx)
		for _, want := range []string{`table "` + table + `" lacks a column`, "column " + col, "caddy idempotency schema", "create_table"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("Ping without column %s: %v, want it to say %s", col, err, want)
			}
		}
	}

	// A column of another type (a fingerprint made text) fails every
	// request that writes to it: Ping names it too.
	for col, typ := range map[string]string{"fingerprint": "text", "body": "text", "body_omitted": "integer"} {
		table := pgtest.Table(t, dsn)
		ddl, err := postgres.Schema(table)
		ok(t, err)
		pgtest.Exec(t, dsn, ddl[0])
		pgtest.Exec(t, dsn, "ALTER TABLE "+pgx.Identifier{table}.Sanitize()+" ALTER COLUMN "+col+" DROP DEFAULT, ALTER COLUMN "+col+" TYPE "+typ+" USING NULL")
		err = openStore(t, testPool(t, dsn, 2), postgres.Options{Table: table}).Ping(ctx)
		for _, want := range []string{`table "` + table + `" has a column of another type`, "caddy idempotency schema"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("Ping with column %s of type %s: %v, want it to say %s", col, typ, err, want)
			}
		}
	}

	created := pgtest.Table(t, dsn)
	ok(t, openStore(t, testPool(t, dsn, 2), postgres.Options{Table: created, CreateTable: true}).Ping(ctx))
	var n int
	p := testPool(t, dsn, 1)
	defer p.Close()
	ok(t, p.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = $1", created).Scan(&n))
	if n != 1 {
		t.Errorf("Ping with CreateTable left no table %s", created)
	}
}

// A setting the server refuses is quoted by its error, and pgx sends
// every keyword it does not know as one: a password where a keyword was
// meant goes to the server as a setting's name. Every error of the store
// is scrubbed of the DSN's password (issue 28).
func TestErrorsNeverQuoteTheDSNsPassword(t *testing.T) {
	dsn := pgtest.Require(t)
	const pw = "Zq7leak-pw"
	u, err := url.Parse(dsn)
	if err != nil {
		testutil.Unavailable(t, "this test needs %s as a URL", pgtest.EnvDSN)
	}
	u.User = url.UserPassword(u.User.Username(), pw)
	cfg, err := postgres.NewPoolConfig(u.String(), 2)
	ok(t, err)
	cfg.ConnConfig.RuntimeParams[pw] = "on" // as pgx reads `... password=x Zq7leak-pw=on`
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	ok(t, err)
	s := openStore(t, pool, postgres.Options{Table: pgtest.Table(t, dsn), CreateTable: true})
	key := storage.Key{Scope: "s", ID: "k"}
	for op, run := range operations(s, key) {
		err := run(context.Background())
		if err == nil {
			t.Fatalf("%s succeeded with a misread DSN", op)
		}
		if strings.Contains(err.Error(), pw) {
			t.Errorf("%s: %v", op, err)
		}
		if op == "ping" && (!strings.Contains(err.Error(), "configuration parameter") || !strings.Contains(err.Error(), "a misspelt keyword")) {
			t.Errorf("%s: %v, want the server's refusal (else this test proves nothing)", op, err)
		}
	}
}

// A DSN written as a URL of another scheme (postgress://) is refused,
// naming the scheme, before anything is built: pgx would read it as one
// keyword and connect to its defaults.
func TestAURLOfAnotherSchemeIsRefused(t *testing.T) {
	for _, dsn := range []string{"postgress://u:Zq7leak-pw@db:5432/app", "mysql://u@db/app", " pg://db/app", "POSTGRES://db/app"} {
		_, err := postgres.NewPoolConfig(dsn, 2)
		if err == nil || !strings.Contains(err.Error(), "must be postgres:// or postgresql://") || strings.Contains(err.Error(), "Zq7leak-pw") {
			t.Errorf("%q: %v", dsn, err)
		}
	}
	for _, dsn := range []string{"postgres://db/app", "postgresql://db/app", "host=db dbname=app options='-c x=y://z'"} {
		if _, err := postgres.NewPoolConfig(dsn, 2); err != nil {
			t.Errorf("%q: %v", dsn, err)
		}
	}
}

// The facts warn when the server may lose records without a fault of the
// store's: synchronous_commit off for the store's sessions (set on its
// database here), with the fix; fsync is reported. A server with both on
// says nothing.
func TestFactsWarnOfCommitsNotOnDisk(t *testing.T) {
	dsn := pgtest.Require(t)
	ctx := context.Background()
	d, err := openStore(t, testPool(t, dsn, 2), postgres.Options{CreateTable: true, Table: pgtest.Table(t, dsn)}).Facts(ctx)
	if d.Fsync == "" {
		t.Fatalf("facts lack fsync: %+v", d)
	}
	if d.Fsync == "on" && d.SynchronousCommit != "off" && err != nil {
		t.Fatalf("Facts on a server that keeps its commits: %v, want no warning", err)
	}
	lax, name := pgtest.Database(t, dsn)
	pgtest.Exec(t, dsn, `ALTER DATABASE `+pgx.Identifier{name}.Sanitize()+` SET synchronous_commit = off`)
	d, err = openStore(t, testPool(t, lax, 2), postgres.Options{CreateTable: true}).Facts(ctx)
	if d.SynchronousCommit != "off" || err == nil || storage.Unavailable(err) ||
		!strings.Contains(err.Error(), "synchronous_commit is off") || !strings.Contains(err.Error(), "set it to on") {
		t.Fatalf("Facts with synchronous_commit off: %+v, %v; want a warning (the store still works)", d, err)
	}
}
