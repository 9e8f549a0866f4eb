package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

// The Caddy module's fail_open passes a request on without the store only
// after an error that says the store could not be reached or was too slow
// (storage.Unavailable); an error that proves PostgreSQL answered fails
// closed. These tests produce each kind against the real server.

// wantUnavailable fails unless err says the store was unreachable or too
// slow, both by wrapping storage.ErrUnavailable and for storage.Unavailable.
func wantUnavailable(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil || !errors.Is(err, storage.ErrUnavailable) || !storage.Unavailable(err) {
		t.Errorf("%s: %v; want an error wrapping storage.ErrUnavailable", what, err)
	}
}

// wantAnswered fails unless err is an error that the store must not pass
// off as an outage.
func wantAnswered(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil || errors.Is(err, storage.ErrUnavailable) || storage.Unavailable(err) {
		t.Errorf("%s: %v; want an error that is not unavailable", what, err)
	}
}

// operations returns every operation of s that reaches the server, on
// key, by name.
func operations(s *postgres.Store, key storage.Key) map[string]func(context.Context) error {
	resp := &storage.Response{Status: 201}
	hash := key.Hash()
	return map[string]func(context.Context) error{
		"reserve":  func(ctx context.Context) error { _, err := s.Reserve(ctx, key, fpA, time.Minute); return err },
		"complete": func(ctx context.Context) error { return s.Complete(ctx, key, 1, resp, time.Hour) },
		"release":  func(ctx context.Context) error { return s.Release(ctx, key, 1) },
		"renew":    func(ctx context.Context) error { return s.Renew(ctx, key, 1, time.Minute) },
		"get":      func(ctx context.Context) error { _, err := s.Get(ctx, key, true); return err },
		"delete":   func(ctx context.Context) error { return s.Delete(ctx, key) },
		"get by hash": func(ctx context.Context) error {
			_, err := s.GetByHash(ctx, hash, true)
			return err
		},
		"delete by hash": func(ctx context.Context) error { _, err := s.DeleteByHash(ctx, hash); return err },
		"wait":           func(ctx context.Context) error { return s.Wait(ctx, key, time.Second) },
		"ping":           s.Ping,
		"cleanup":        func(ctx context.Context) error { _, err := s.CleanupNow(ctx); return err },
	}
}

// proxiedStore returns a store reaching the test server through a proxy
// that can cut or stall its connections, with a warm table and pool.
func proxiedStore(t *testing.T, timeout time.Duration) (*postgres.Store, *caddyproc.Proxy) {
	t.Helper()
	dsn := pgtest.Require(t)
	proxy, err := caddyproc.NewProxy(pgtest.Address(t, dsn))
	ok(t, err)
	t.Cleanup(proxy.Close)
	cfg, err := postgres.NewPoolConfig(pgtest.WithAddress(dsn, proxy.Addr), 4)
	ok(t, err)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	ok(t, err)
	table := pgtest.Table(t, dsn)
	s := openStore(t, pool, postgres.Options{Table: table, CreateTable: true, Timeout: timeout, CleanupInterval: -1})
	// Warm up the table and a connection through the proxy: on a loaded
	// machine, the first tries may take longer than the timeout.
	completed(t, newStore(t, postgres.Options{Table: table}), storage.Key{Scope: "proxied", ID: "warm"}, time.Hour)
	testutil.Eventually(t, 30*time.Second, "a first Get through the proxy", func() bool {
		_, err := s.Get(t.Context(), storage.Key{Scope: "proxied", ID: "warm"}, false)
		return err == nil
	})
	return s, proxy
}

// TestBlackHoledServerIsUnavailable stalls every connection, as a network
// partition that drops packets does: each operation gives up after its
// timeout (the hash scans after theirs) with an unavailable error.
func TestBlackHoledServerIsUnavailable(t *testing.T) {
	const timeout = 200 * time.Millisecond
	s, proxy := proxiedStore(t, timeout)
	proxy.Stall()
	defer proxy.Unstall()
	for name, op := range operations(s, storage.Key{Scope: "proxied", ID: "k"}) {
		if name == "cleanup" {
			continue // in the background, each statement within a minute: see CleanupNow
		}
		began := time.Now()
		err := op(t.Context())
		wantUnavailable(t, name+" through a black hole", err)
		// The scans have ten times the timeout; everything gets the
		// cancel request's grace and a margin for a loaded machine.
		if took := time.Since(began); took > 10*timeout+5*time.Second {
			t.Errorf("%s took %v through a black hole", name, took)
		}
	}
}

// TestCutConnectionsAreUnavailable closes every connection and refuses new
// ones, as a server that went away does; once it is back, the store works
// again without anything done to it.
func TestCutConnectionsAreUnavailable(t *testing.T) {
	s, proxy := proxiedStore(t, 2*time.Second)
	proxy.Cut()
	key := storage.Key{Scope: "proxied", ID: "k"}
	for name, op := range operations(s, key) {
		wantUnavailable(t, name+" with the connections cut", op(t.Context()))
	}
	ok(t, proxy.Restore())
	acquire(t, s, key, fpA, time.Minute)
}

// TestTerminatedSessionIsUnavailable ends the store's session from the
// server side, as pg_terminate_backend, a failover or an administrator's
// shutdown do (SQLSTATE 57P01).
func TestTerminatedSessionIsUnavailable(t *testing.T) {
	dsn := pgtest.Require(t)
	s := openStore(t, pinnedPool(t, dsn, 1), postgres.Options{Table: pgtest.Table(t, dsn), CreateTable: true})
	key := storage.Key{Scope: "terminated", ID: "k"}
	completed(t, s, key, time.Hour)
	var pid uint32
	ok(t, s.Pool().AcquireFunc(t.Context(), func(c *pgxpool.Conn) error {
		pid = c.Conn().PgConn().PID()
		return nil
	}))
	pgtest.Exec(t, dsn, `SELECT pg_terminate_backend($1)`, int(pid))
	_, err := s.Get(t.Context(), key, false)
	wantUnavailable(t, "get on a terminated session", err)
	if _, err := s.Get(t.Context(), key, false); err != nil {
		t.Fatalf("get on a new session: %v", err)
	}
}

// TestNoConnectionSlotIsUnavailable connects as a role that may open no
// connection, which PostgreSQL refuses as it refuses a client past
// max_connections (SQLSTATE 53300).
func TestNoConnectionSlotIsUnavailable(t *testing.T) {
	dsn := pgtest.Require(t)
	roleDSN, _ := pgtest.Role(t, dsn, "CONNECTION LIMIT 0")
	s := openStore(t, pinnedPool(t, roleDSN, 2), postgres.Options{Table: pgtest.Table(t, dsn)})
	_, err := s.Reserve(t.Context(), storage.Key{Scope: "s", ID: "k"}, fpA, time.Minute)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "53300" {
		t.Fatalf("Reserve as a role without connections: %v, want SQLSTATE 53300", err)
	}
	wantUnavailable(t, "reserve without a connection slot", err)
}

// TestClosedStoreIsUnavailable: a request that still holds a store closed
// under it (a config reload) finds nothing that answers.
func TestClosedStoreIsUnavailable(t *testing.T) {
	s := newStore(t, postgres.Options{})
	completed(t, s, storage.Key{Scope: "closed", ID: "warm"}, time.Hour)
	ok(t, s.Close())
	for name, op := range operations(s, storage.Key{Scope: "closed", ID: "k"}) {
		if name == "cleanup" {
			continue // CleanupNow after Close is the caller's affair
		}
		wantUnavailable(t, name+" after Close", op(t.Context()))
	}
}

// TestServerAnswersAreNotUnavailable produces errors that prove PostgreSQL
// answered, each the way a deployment runs into it: none may let fail_open
// run requests without idempotency.
func TestServerAnswersAreNotUnavailable(t *testing.T) {
	dsn := pgtest.Require(t)
	ctx := t.Context()
	// operatorTable creates a table as an operator would, then changes it.
	operatorTable := func(t *testing.T, change string) *postgres.Store {
		table := pgtest.Table(t, dsn)
		ddl, err := postgres.Schema(table)
		ok(t, err)
		for _, stmt := range ddl {
			pgtest.Exec(t, dsn, stmt)
		}
		if change != "" {
			pgtest.Exec(t, dsn, strings.ReplaceAll(change, "{table}", pgx.Identifier{table}.Sanitize()))
		}
		return openStore(t, pinnedPool(t, dsn, 2), postgres.Options{Table: table})
	}
	key := storage.Key{Scope: "answered", ID: "k"}
	for _, tc := range []struct {
		name string
		code string // the SQLSTATE, when the server gave one
		run  func(t *testing.T) error
	}{
		{"missing table without create_table", "42P01", func(t *testing.T) error {
			s := openStore(t, pinnedPool(t, dsn, 2), postgres.Options{Table: pgtest.Table(t, dsn)})
			_, err := s.Reserve(ctx, key, fpA, time.Minute)
			return err
		}},
		{"permission denied", "42501", func(t *testing.T) error {
			table := pgtest.Table(t, dsn)
			_, _ = newStore(t, postgres.Options{Table: table}).Get(ctx, key, false) // the superuser creates it
			roleDSN, _ := pgtest.Role(t, dsn, "")
			s := openStore(t, pinnedPool(t, roleDSN, 2), postgres.Options{Table: table})
			_, err := s.Reserve(ctx, key, fpA, time.Minute)
			return err
		}},
		{"check constraint", "23514", func(t *testing.T) error {
			s := operatorTable(t, `ALTER TABLE {table} ADD CHECK (length(key) < 3)`)
			_, err := s.Reserve(ctx, key, fpA, time.Minute)
			if err == nil {
				_, err = s.Reserve(ctx, storage.Key{Scope: "answered", ID: "long"}, fpA, time.Minute)
			}
			return err
		}},
		{"value too long for the column", "22001", func(t *testing.T) error {
			s := operatorTable(t, `ALTER TABLE {table} ALTER COLUMN key TYPE varchar(3)`)
			_, err := s.Reserve(ctx, storage.Key{Scope: "answered", ID: "long"}, fpA, time.Minute)
			return err
		}},
		{"index row too large", "54000", func(t *testing.T) error {
			s := operatorTable(t, `CREATE INDEX ON {table} (headers)`)
			tok := acquire(t, s, key, fpA, time.Minute)
			noise := make([]byte, 6000)
			rand.Read(noise)
			resp := &storage.Response{Status: 201, Header: http.Header{"X-Noise": {base64.StdEncoding.EncodeToString(noise)}}}
			return s.Complete(ctx, key, tok, resp, time.Hour)
		}},
		{"corrupt row", "", func(t *testing.T) error {
			s := newStore(t, postgres.Options{})
			completed(t, s, key, time.Hour)
			pgtest.Exec(t, dsn, `UPDATE `+s.Table()+` SET status = 42`)
			_, err := s.Reserve(ctx, key, fpA, time.Minute)
			if !errors.Is(err, storage.ErrCorrupt) {
				t.Errorf("corrupt row: %v, want storage.ErrCorrupt", err)
			}
			return err
		}},
		{"caller cancelled", "", func(t *testing.T) error {
			s := newStore(t, postgres.Options{})
			completed(t, s, key, time.Hour)
			locker, err := pgx.Connect(ctx, dsn)
			ok(t, err)
			defer locker.Close(context.Background())
			tx, err := locker.Begin(ctx)
			ok(t, err)
			defer tx.Rollback(context.Background())
			_, err = tx.Exec(ctx, `LOCK TABLE `+s.Table()+` IN ACCESS EXCLUSIVE MODE`)
			ok(t, err)
			c, cancel := context.WithCancel(ctx)
			time.AfterFunc(100*time.Millisecond, cancel)
			_, err = s.Reserve(c, key, fpA, time.Minute)
			if !errors.Is(err, context.Canceled) {
				t.Errorf("cancelled Reserve: %v, want context.Canceled", err)
			}
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run(t)
			if tc.code != "" {
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) || pgErr.Code != tc.code {
					t.Fatalf("%v, want SQLSTATE %s", err, tc.code)
				}
			}
			wantAnswered(t, tc.name, err)
		})
	}
}
