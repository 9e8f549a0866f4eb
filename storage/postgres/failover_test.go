//go:build unix

package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/servers"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

// Failover: a private primary with a streaming standby (pgtest.Replicated),
// never the shared test server.

// failoverStore opens a store on dsn through NewPoolConfig, as the Caddy
// module does.
func failoverStore(t *testing.T, dsn string) *postgres.Store {
	t.Helper()
	cfg, err := postgres.NewPoolConfig(dsn, 4)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := postgres.New(pool, postgres.Options{CreateTable: true, Timeout: 5 * time.Second, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// multiHost is a URL DSN naming the servers in order, with extra query
// parameters.
func multiHost(query string, ps ...*servers.Postgres) string {
	dsn := "postgres://postgres@"
	for i, p := range ps {
		if i > 0 {
			dsn += ","
		}
		dsn += p.Addr
	}
	return dsn + "/test?sslmode=disable" + query
}

func TestFailover(t *testing.T) {
	_, primary, standby := pgtest.Replicated(t)
	ctx := context.Background()
	key := func(id string) storage.Key { return storage.Key{Scope: "failover", ID: id} }

	onPrimary := failoverStore(t, primary.DSN)
	if _, err := onPrimary.Reserve(ctx, key("created"), fpA, time.Minute); err != nil {
		t.Fatal(err) // creates the table, which the standby then has too
	}
	if err := primary.WaitReplayed(1, time.Minute); err != nil {
		t.Fatal(err) // the standby has the table: its store's ping reads it
	}

	t.Run("the facts of a primary name its standby and whether commits wait for it", func(t *testing.T) {
		d, err := onPrimary.Facts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d.InRecovery || d.TransactionReadOnly || d.Synchronous || d.SynchronousCommit != "on" || d.Server != primary.Addr || len(d.Standbys) != 1 || d.Standbys[0].SyncState != "async" {
			t.Errorf("facts of an asynchronous primary: %+v", d)
		}
		if err := primary.AlterSystem("synchronous_standby_names", "*"); err != nil {
			t.Fatal(err)
		}
		defer primary.AlterSystem("synchronous_standby_names", "")
		testutil.Eventually(t, time.Minute, "the standby turns synchronous", func() bool {
			d, err = onPrimary.Facts(ctx)
			return err == nil && len(d.Standbys) == 1 && d.Standbys[0].SyncState == "sync"
		})
		if !d.Synchronous || d.SynchronousStandbyNames != "*" {
			t.Errorf("facts of a synchronous primary: %+v", d)
		}
	})

	t.Run("a store on a standby says it is read-only, as an outage, and drops its connections", func(t *testing.T) {
		s := failoverStore(t, standby.DSN)
		d, err := s.Facts(ctx)
		if !d.InRecovery || !d.TransactionReadOnly || d.Server != standby.Addr {
			t.Errorf("facts of a standby: %+v", d)
		}
		if !errors.Is(err, postgres.ErrReadOnly) || !storage.Unavailable(err) {
			t.Errorf("facts of a standby: %v; want ErrReadOnly, unavailable", err)
		}
		for op, do := range operations(s, key("read-only")) {
			switch op {
			case "get", "get by hash", "wait", "ping":
				continue // reads work on a standby
			}
			err := do(ctx)
			if !errors.Is(err, postgres.ErrReadOnly) || !errors.Is(err, storage.ErrUnavailable) {
				t.Errorf("%s on a standby: %v; want ErrReadOnly and ErrUnavailable", op, err)
			}
			if n := s.Pool().Stat().TotalConns(); n != 0 {
				t.Errorf("%s on a standby: %d connections left in the pool; want them dropped", op, n)
			}
		}
	})

	t.Run("target_session_attrs=read-write without a primary among the hosts is an outage", func(t *testing.T) {
		s := failoverStore(t, multiHost("&target_session_attrs=read-write", standby))
		_, err := s.Reserve(ctx, key("no primary"), fpA, time.Minute)
		wantUnavailable(t, "reserve with no primary among the hosts", err)
	})

	t.Run("a multi-host DSN without target_session_attrs stays on the standby it names first", func(t *testing.T) {
		s := failoverStore(t, multiHost("", standby, primary))
		_, err := s.Reserve(ctx, key("standby first"), fpA, time.Minute)
		if !errors.Is(err, postgres.ErrReadOnly) {
			t.Errorf("reserve: %v; want ErrReadOnly", err)
		}
	})

	t.Run("target_session_attrs=read-write finds the primary, and the new one after a promotion", func(t *testing.T) {
		dsn := multiHost("&target_session_attrs=read-write", standby, primary)
		s := failoverStore(t, dsn)
		if _, err := s.Reserve(ctx, key("before"), fpA, time.Minute); err != nil {
			t.Fatal(err)
		}
		if d, err := s.Facts(ctx); err != nil || d.Server != primary.Addr {
			t.Fatalf("facts before the promotion: %+v, %v; want the primary %s", d, err, primary.Addr)
		}
		// The same DSN in keyword/value form.
		host, port, _ := net.SplitHostPort(standby.Addr)
		host2, port2, _ := net.SplitHostPort(primary.Addr)
		kv := failoverStore(t, fmt.Sprintf("host=%s,%s port=%s,%s user=postgres dbname=test sslmode=disable target_session_attrs=read-write", host, host2, port, port2))
		if d, err := kv.Facts(ctx); err != nil || d.Server != primary.Addr {
			t.Fatalf("facts through a keyword/value DSN: %+v, %v; want the primary %s", d, err, primary.Addr)
		}

		primary.Kill()
		if err := standby.Promote(); err != nil {
			t.Fatal(err)
		}
		var err error
		testutil.Eventually(t, time.Minute, "a reservation on the promoted standby", func() bool {
			_, err = s.Reserve(ctx, key("after"), fpA, time.Minute)
			return err == nil
		})
		if d, err := s.Facts(ctx); err != nil || d.Server != standby.Addr || d.InRecovery {
			t.Fatalf("facts after the promotion: %+v, %v; want the new primary %s", d, err, standby.Addr)
		}

		// The old primary comes back, as a standby of the new one, on the
		// address the DSN names: new connections skip it.
		if err := primary.Rebase(standby, ""); err != nil {
			t.Fatal(err)
		}
		s.Pool().Reset()
		if _, err := s.Reserve(ctx, key("after rebase"), fpA, time.Minute); err != nil {
			t.Errorf("reserve with the old primary back as a standby: %v", err)
		}
	})
}

// TestAPrimaryThatDefaultsToReadOnlyIsNamedAsSuch: a primary whose
// database defaults to read-only transactions (default_transaction_read_only
// on, as an operator sets to freeze writes, or a disk-full guard does)
// refuses the store's writes as a standby does, and the store treats it
// as an outage; but the error says what it is, not that the server is in
// recovery (target_session_attrs=read-write would skip this server, not
// fix it). Once the database takes writes again, the store recovers
// without a restart.
func TestAPrimaryThatDefaultsToReadOnlyIsNamedAsSuch(t *testing.T) {
	dsn := pgtest.Require(t)
	dbDSN, name := pgtest.Database(t, dsn)
	db := pgx.Identifier{name}.Sanitize()
	pgtest.Exec(t, dsn, `ALTER DATABASE `+db+` SET default_transaction_read_only = on`)
	s := failoverStore(t, dbDSN)
	ctx := context.Background()
	key := storage.Key{Scope: "read-only", ID: "k"}

	d, err := s.Facts(ctx)
	if !errors.Is(err, postgres.ErrReadOnly) || !storage.Unavailable(err) {
		t.Fatalf("facts: %v; want ErrReadOnly, unavailable", err)
	}
	if d.InRecovery || !d.DefaultTransactionReadOnly {
		t.Errorf("facts %+v; want a primary defaulting to read-only", d)
	}
	for _, e := range []error{err, func() error { _, err := s.Reserve(ctx, key, fpA, time.Minute); return err }()} {
		if !errors.Is(e, postgres.ErrReadOnly) || !storage.Unavailable(e) {
			t.Errorf("%v; want ErrReadOnly, unavailable", e)
		}
		if msg := e.Error(); strings.Contains(msg, "(in recovery)") || !strings.Contains(msg, "default_transaction_read_only") {
			t.Errorf("%s; want it to name default_transaction_read_only, not recovery", msg)
		}
	}

	pgtest.Exec(t, dsn, `ALTER DATABASE `+db+` SET default_transaction_read_only = off`)
	testutil.Eventually(t, 10*time.Second, "a reservation once the database takes writes again", func() bool {
		_, err := s.Reserve(ctx, key, fpA, time.Minute)
		return err == nil
	})
}
