package postgres_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

func TestTableNames(t *testing.T) {
	valid := map[string]string{
		"":                        `"idempotency_keys"`,
		"idempotency_keys":        `"idempotency_keys"`,
		"_keys2":                  `"_keys2"`,
		"app.keys":                `"app"."keys"`,
		strings.Repeat("k", 63):   `"` + strings.Repeat("k", 63) + `"`,
		"select":                  `"select"`, // quoted, so reserved words are fine
		"public.idempotency_keys": `"public"."idempotency_keys"`,
	}
	for name, want := range valid {
		ddl, err := postgres.Schema(name)
		if err != nil {
			t.Errorf("Schema(%q): %v", name, err)
			continue
		}
		if !strings.HasPrefix(ddl[0], "CREATE TABLE IF NOT EXISTS "+want+" (") {
			t.Errorf("Schema(%q) = %q, want table %s", name, ddl[0], want)
		}
	}
	invalid := []string{
		"Keys", // would be a different table quoted than unquoted
		"a.b.c",
		".keys",
		"app.",
		"1keys",
		"keys-v2",
		"my keys",
		`keys"; DROP TABLE x; --`,
		"ключи",
		strings.Repeat("k", 64),
	}
	for _, name := range invalid {
		if _, err := postgres.Schema(name); err == nil {
			t.Errorf("Schema(%q) accepted", name)
		}
		pool := testPool(t, pgtest.DefaultDSN, 1) // never connects
		if s, err := postgres.New(pool, postgres.Options{Table: name}); err == nil {
			s.Close()
			t.Errorf("New with table %q accepted", name)
		} else {
			pool.Close()
		}
	}
}

func TestIndexNameFitsPostgresLimit(t *testing.T) {
	ddl, err := postgres.Schema("app." + strings.Repeat("t", 63))
	if err != nil {
		t.Fatal(err)
	}
	want := `CREATE INDEX IF NOT EXISTS "` + strings.Repeat("t", 48) + `_expires_at_idx" ON "app"."` + strings.Repeat("t", 63) + `" (expires_at)`
	if ddl[1] != want {
		t.Fatalf("index DDL\n%s\nwant\n%s", ddl[1], want)
	}
}

// TestConcurrentTableCreation starts several instances at once on a table
// that does not exist yet: CREATE TABLE IF NOT EXISTS alone fails in this
// race (duplicate catalog rows); every first operation must succeed.
func TestConcurrentTableCreation(t *testing.T) {
	const instances = 8
	dsn := pgtest.Require(t)
	for round := range 5 {
		table := pgtest.Table(t, dsn)
		if round%2 == 1 {
			// Schema-qualified, in a fresh schema.
			schema := pgtest.Name("idem_schema_")
			pgtest.Exec(t, dsn, `CREATE SCHEMA `+schema)
			t.Cleanup(func() { pgtest.Exec(t, dsn, `DROP SCHEMA `+schema+` CASCADE`) })
			table = schema + "." + table
		}
		var stores []*postgres.Store
		for range instances {
			stores = append(stores, openStore(t, testPool(t, dsn, 2), postgres.Options{Table: table, CreateTable: true}))
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, s := range stores {
			wg.Go(func() {
				<-start
				key := storage.Key{Scope: "ddl", ID: string(rune('a' + i))}
				if _, err := s.Reserve(t.Context(), key, fpA, time.Minute); err != nil {
					t.Errorf("round %d: instance %d: first Reserve: %v", round, i, err)
				}
			})
		}
		close(start)
		wg.Wait()
	}
}

func TestMissingTableWithoutCreateTable(t *testing.T) {
	dsn := pgtest.Require(t)
	table := pgtest.Table(t, dsn)
	s := openStore(t, testPool(t, dsn, 2), postgres.Options{Table: table}) // New succeeds
	_, err := s.Reserve(t.Context(), storage.Key{Scope: "s", ID: "k"}, fpA, time.Minute)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
		t.Fatalf("Reserve on a missing table: %v, want SQLSTATE 42P01", err)
	}
	if storage.Unavailable(err) {
		t.Errorf("Reserve on a missing table: %v reads as the store being unavailable: fail_open would run requests without idempotency", err)
	}
	for _, want := range []string{"postgres reserve", table, "does not exist", "caddy idempotency schema", "docs/storage-postgres.md"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// TestOperatorCreatedTable creates the table from Schema, as an operator
// with create_table off would from the README, and uses it.
func TestOperatorCreatedTable(t *testing.T) {
	dsn := pgtest.Require(t)
	table := pgtest.Table(t, dsn)
	ddl, err := postgres.Schema(table)
	ok(t, err)
	for _, stmt := range ddl {
		pgtest.Exec(t, dsn, stmt)
	}
	s := openStore(t, testPool(t, dsn, 2), postgres.Options{Table: table})
	key := storage.Key{Scope: "s", ID: "k"}
	completed(t, s, key, time.Hour)
	if o := outcome(t, s, key, fpA); o != storage.Replay {
		t.Fatalf("Reserve = %v, want replay", o)
	}
}

func TestDroppedTableIsCreatedAgain(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.Require(t)
	s := newStore(t, postgres.Options{})
	key := storage.Key{Scope: "s", ID: "k"}
	completed(t, s, key, time.Hour)
	pgtest.Exec(t, dsn, `DROP TABLE `+s.Table())
	_, err := s.Get(ctx, key, false)
	if err == nil || !strings.Contains(err.Error(), "created again") {
		t.Fatalf("Get right after the drop: %v, want an error saying the table will be created again", err)
	}
	if _, err := s.Get(ctx, key, false); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("Get after that: %v, want ErrNotFound from a new table", err)
	}
	acquire(t, s, key, fpA, time.Minute)
}

// TestUnreachableServer builds a store while nothing listens on the port:
// New succeeds (Caddy must start while PostgreSQL is down) and every
// operation fails promptly with an error that names the operation and not
// the password.
func TestUnreachableServer(t *testing.T) {
	pool := testPool(t, "postgres://postgres:s3cret@127.0.0.1:1/test?sslmode=disable&connect_timeout=2", 2)
	s, err := postgres.New(pool, postgres.Options{CreateTable: true})
	if err != nil {
		t.Fatalf("New with the server down: %v", err)
	}
	defer s.Close()
	ctx := context.Background()
	key := storage.Key{Scope: "s", ID: "k"}
	ops := map[string]func() error{
		"reserve": func() error { _, err := s.Reserve(ctx, key, fpA, time.Minute); return err },
		"complete": func() error {
			return s.Complete(ctx, key, 1, &storage.Response{Status: 200}, time.Hour)
		},
		"release": func() error { return s.Release(ctx, key, 1) },
		"renew":   func() error { return s.Renew(ctx, key, 1, time.Minute) },
		"get":     func() error { _, err := s.Get(ctx, key, true); return err },
		"delete":  func() error { return s.Delete(ctx, key) },
		"cleanup": func() error { _, err := s.CleanupNow(ctx); return err },
	}
	for op, fn := range ops {
		begun := time.Now()
		err := fn()
		if took := time.Since(begun); took > 5*time.Second {
			t.Errorf("%s took %v", op, took)
		}
		switch {
		case err == nil:
			t.Errorf("%s succeeded with the server down", op)
		case errors.Is(err, storage.ErrLeaseLost), errors.Is(err, storage.ErrNotFound):
			t.Errorf("%s: %v, want a connection error, not an answer", op, err)
		case !errors.Is(err, storage.ErrUnavailable) || !storage.Unavailable(err):
			t.Errorf("%s: %v, want an error wrapping storage.ErrUnavailable", op, err)
		case !strings.HasPrefix(err.Error(), "postgres "+op):
			t.Errorf("%s: %q does not name the operation", op, err)
		case strings.Contains(err.Error(), "s3cret"):
			t.Errorf("%s: %q shows the password", op, err)
		}
	}
}

// TestSilentServerFailsConcurrentCallersTogether points the store at a
// server that accepts connections and never answers, as a blackholed
// PostgreSQL does. Concurrent first operations share one attempt to create
// the table, so they all fail after one connect timeout rather than one
// after the other.
func TestSilentServerFailsConcurrentCallersTogether(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	ok(t, err)
	defer l.Close()
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	}()

	const timeout = time.Second
	dsn := "postgres://postgres@" + l.Addr().String() + "/test?sslmode=disable&connect_timeout=1"
	s := openStore(t, testPool(t, dsn, 4), postgres.Options{CreateTable: true})
	const callers = 20
	var wg sync.WaitGroup
	begun := time.Now()
	for i := range callers {
		wg.Go(func() {
			_, err := s.Reserve(t.Context(), storage.Key{Scope: "s", ID: string(rune('a' + i))}, fpA, time.Minute)
			if err == nil {
				t.Errorf("caller %d: Reserve succeeded against a silent server", i)
			}
		})
	}
	wg.Wait()
	if took := time.Since(begun); took > 3*timeout {
		t.Fatalf("%d concurrent callers took %v to fail with a %v connect timeout", callers, took, timeout)
	}
}
