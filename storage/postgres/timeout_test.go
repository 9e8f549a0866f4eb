package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
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
	// Warm up (the table, a connection): on a loaded machine, the first
	// tries may take longer than the timeout.
	warm := storage.Key{Scope: "s", ID: "warm"}
	testutil.Eventually(t, 30*time.Second, "a first Reserve within the timeout", func() bool {
		_, err := s.Reserve(ctx, warm, []byte("fp"), time.Minute)
		return err == nil
	})

	locker, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connecting the locker: %v", err)
	}
	defer locker.Close(context.Background())
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatalf("beginning the locker's transaction: %v", err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{table}.Sanitize()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatalf("locking the table: %v", err)
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
		// The bound the handler promises: timeout plus a small margin
		// (wider than the cancel's 300ms, for a loaded machine).
		if took > timeout+2*time.Second {
			t.Errorf("%s took %s on a locked table, want about %s", name, took, timeout)
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatalf("unlocking the table: %v", err)
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

// TestHashScansGiveUpOnALockedTable: GetByHash and DeleteByHash scan the
// table, so they get ScanTimeout (default ten times Timeout) rather than
// Timeout, and give up after it when the table is locked, as the admin API
// must rather than hang with the operator's request.
func TestHashScansGiveUpOnALockedTable(t *testing.T) {
	for _, tc := range []struct {
		name           string
		opts           postgres.Options
		wantScanBudget time.Duration
	}{
		{"default", postgres.Options{Timeout: 100 * time.Millisecond}, time.Second},
		{"set", postgres.Options{Timeout: time.Second, ScanTimeout: 300 * time.Millisecond}, 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn := pgtest.Require(t)
			tc.opts.Table = pgtest.Table(t, dsn)
			tc.opts.CreateTable = true
			// Set up through a store without the short timeouts: on a
			// loaded machine, creating the table may take longer.
			key := storage.Key{Scope: "scan", ID: "k"}
			completed(t, newStore(t, postgres.Options{Table: tc.opts.Table}), key, time.Hour)
			s := openStore(t, pinnedPool(t, dsn, 4), tc.opts)
			// The store's first use settles its schema; done before the
			// lock, so that it is the scan that meets it (on a loaded
			// machine the store's own first cleanup may not be done yet).
			testutil.Eventually(t, 30*time.Second, "the store to read its record", func() bool {
				rec, err := s.Get(t.Context(), key, false)
				return err == nil && rec != nil
			})

			locker, err := pgx.Connect(t.Context(), dsn)
			ok(t, err)
			defer locker.Close(context.Background())
			tx, err := locker.Begin(t.Context())
			ok(t, err)
			defer tx.Rollback(context.Background())
			_, err = tx.Exec(t.Context(), "LOCK TABLE "+s.Table()+" IN ACCESS EXCLUSIVE MODE")
			ok(t, err)

			// A caller with a deadline far off: only the store's bound
			// can end the scan sooner.
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			for name, scan := range map[string]func() error{
				"get by hash":    func() error { _, err := s.GetByHash(ctx, key.Hash(), false); return err },
				"delete by hash": func() error { _, err := s.DeleteByHash(ctx, key.Hash()); return err },
			} {
				began := time.Now()
				err := scan()
				took := time.Since(began)
				wantUnavailable(t, name+" on a locked table", err)
				// It waits on the lock for its whole budget, however
				// slow the machine, and not much longer.
				if took < tc.wantScanBudget*9/10 || took > tc.wantScanBudget+3*time.Second {
					t.Errorf("%s on a locked table gave up after %v, want about %v", name, took, tc.wantScanBudget)
				}
			}
		})
	}
}
