package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/caddy-idempotency/caddy-idempotency/internal/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

// TestStatementsTimeOutAndAreCancelledOnTheServer holds the table locked
// as a migration would: every operation gives up after Timeout, and the
// reservation that timed out is cancelled on the server rather than
// committed once the lock goes (which would leave a lease nobody knows).
func TestStatementsTimeOutAndAreCancelledOnTheServer(t *testing.T) {
	dsn := pgtest.Require(t)
	table := pgtest.Table(t, dsn)
	cfg, err := postgres.NewPoolConfig(dsn, 4)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	const timeout = 300 * time.Millisecond
	s := openStore(t, pool, postgres.Options{Table: table, CreateTable: true, Timeout: timeout})
	ctx := t.Context()
	warm := storage.Key{Scope: "s", ID: "warm"}
	if _, err := s.Reserve(ctx, warm, []byte("fp"), time.Minute); err != nil {
		t.Fatal(err)
	}

	locker, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{table}.Sanitize()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}

	key := storage.Key{Scope: "s", ID: "locked"}
	ops := map[string]func() error{
		"reserve": func() error { _, err := s.Reserve(ctx, key, []byte("fp"), time.Minute); return err },
		"get":     func() error { _, err := s.Get(ctx, warm, false); return err },
		"renew":   func() error { return s.Renew(ctx, warm, 1, time.Minute) },
		"delete":  func() error { return s.Delete(ctx, warm) },
	}
	for name, op := range ops {
		began := time.Now()
		err := op()
		took := time.Since(began)
		if err == nil || errors.Is(err, storage.ErrLeaseLost) || errors.Is(err, storage.ErrNotFound) {
			t.Errorf("%s on a locked table: %v, want a timeout error", name, err)
		}
		// Too slow is unavailable: fail_open may pass the request on.
		wantUnavailable(t, name+" on a locked table", err)
		// The bound the handler promises: timeout plus a small margin.
		if took > timeout+time.Second {
			t.Errorf("%s took %s on a locked table, want about %s", name, took, timeout)
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// A statement still queued behind the lock would run now: give it the
	// time to land before looking (waiting longer only makes the check
	// stricter).
	time.Sleep(time.Second)

	if _, err := s.Get(ctx, key, false); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("the reservation that timed out exists after the lock went: %v (it must have been cancelled on the server)", err)
	}
	if res, err := s.Reserve(ctx, key, []byte("fp"), time.Minute); err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("after the lock: %v, %v; want Acquired", res.Outcome, err)
	}
}
