package postgres_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

// insertExpired adds n completed rows of scope that expired a minute ago,
// straight into the table: going through the store would take a TTL's
// sleep.
func insertExpired(t *testing.T, dsn string, s *postgres.Store, scope string, n int) {
	t.Helper()
	pgtest.Exec(t, dsn, `INSERT INTO `+s.Table()+`
	(scope, key, fingerprint, state, token, status, headers, created_at, expires_at)
SELECT $1, 'expired-' || i, '\x00', 2, 0, 200, '\x00', now() - interval '2 minutes', now() - interval '1 minute'
FROM generate_series(1, $2::int) i`, scope, n)
}

// rows counts the rows of scope in the table, live or not.
func rows(t *testing.T, dsn string, s *postgres.Store, scope string) int {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	ok(t, err)
	defer conn.Close(context.Background())
	var n int
	ok(t, conn.QueryRow(t.Context(), `SELECT count(*) FROM `+s.Table()+` WHERE scope = $1`, scope).Scan(&n))
	return n
}

func TestCleanupDeletesExpiredRowsInBatches(t *testing.T) {
	const (
		batch   = 100
		expired = 250
	)
	dsn := pgtest.Require(t)
	dbDSN, db := pgtest.Database(t, dsn)
	// One connection: the statistics of the database are this session's.
	s := openStore(t, testPool(t, dbDSN, 1), postgres.Options{
		CreateTable:     true,
		CleanupInterval: -1,
		CleanupBatch:    batch,
	})
	ctx := t.Context()

	live := storage.Key{Scope: "cleanup", ID: "live"}
	completed(t, s, live, time.Hour)
	running := storage.Key{Scope: "cleanup", ID: "running"}
	tok := acquire(t, s, running, fpA, time.Hour)
	lapsed := storage.Key{Scope: "cleanup", ID: "lapsed"}
	lapsedTok := acquire(t, s, lapsed, fpA, time.Millisecond)

	var deleted []int64
	// Each batch is a transaction of its own, between taking and giving
	// back the lock: 100 + 100 + 50 rows are 3 DELETEs, 5 transactions.
	commits := pgtest.CountCommits(t, dsn, db, s.Pool(),
		func() { insertExpired(t, dbDSN, s, "cleanup", expired) },
		func() {
			n, err := s.CleanupNow(ctx)
			ok(t, err)
			deleted = append(deleted, n)
		})
	if want := int64(2 + (expired+batch-1)/batch); commits != want {
		t.Errorf("cleanup of %d rows in batches of %d committed %d transactions, want %d", expired, batch, commits, want)
	}
	for i, n := range deleted {
		if n != expired {
			t.Errorf("run %d deleted %d rows, want %d", i, n, expired)
		}
	}
	if n := rows(t, dbDSN, s, "cleanup"); n != 3 {
		t.Errorf("%d rows left, want 3 (live, running and lapsed within its grace)", n)
	}
	if _, err := s.Get(ctx, live, true); err != nil {
		t.Errorf("live record after cleanup: %v", err)
	}
	ok(t, s.Renew(ctx, running, tok, time.Hour))
	ok(t, s.Release(ctx, lapsed, lapsedTok))

	// Nothing left to do: one batch, nothing deleted.
	n, err := s.CleanupNow(ctx)
	if err != nil || n != 0 {
		t.Fatalf("second cleanup = %d, %v; want 0, nil", n, err)
	}
}

// TestCleanupKeepsLapsedLeasesForTheirGrace lets leases lapse by moving
// their end into the past in the table, by the server's clock, rather
// than by sleeping through them: a second ago (within every grace here)
// and a minute ago (past the strict store's grace of 30 seconds only).
// No margin depends on how fast the machine runs.
func TestCleanupKeepsLapsedLeasesForTheirGrace(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.Require(t)
	table := pgtest.Table(t, dsn)
	patient := newStore(t, postgres.Options{Table: table, CleanupInterval: -1})
	// A second store (instance) on the same table, with a short grace.
	strict := newStore(t, postgres.Options{Table: table, CleanupInterval: -1, LapsedGrace: 30 * time.Second})
	lapse := func(key storage.Key, ago string) {
		pgtest.Exec(t, dsn, `UPDATE `+patient.Table()+` SET expires_at = now() - $3::interval WHERE scope = $1 AND key = $2`, key.Scope, key.ID, ago)
	}

	key := storage.Key{Scope: "grace", ID: "k"}
	tok := acquire(t, patient, key, fpA, time.Hour)
	lapse(key, "1 second")
	if _, err := patient.Get(ctx, key, false); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("Get of a lapsed lease: %v, want ErrNotFound", err)
	}
	for name, s := range map[string]*postgres.Store{"1h": patient, "30s": strict} {
		if n, err := s.CleanupNow(ctx); err != nil || n != 0 {
			t.Fatalf("cleanup with a %s grace, within it = %d, %v; want 0, nil", name, n, err)
		}
	}
	// Nobody took it over: the owner can still record its response.
	ok(t, patient.Complete(ctx, key, tok, &storage.Response{Status: 201}, time.Hour))
	if o := outcome(t, patient, key, fpA); o != storage.Replay {
		t.Fatalf("after completing a lapsed lease: %v, want replay", o)
	}

	other := storage.Key{Scope: "grace", ID: "other"}
	tok = acquire(t, patient, other, fpA, time.Hour)
	lapse(other, "1 minute") // past strict's grace
	if n, err := patient.CleanupNow(ctx); err != nil || n != 0 {
		t.Fatalf("cleanup with a 1h grace = %d, %v; want 0, nil", n, err)
	}
	if n, err := strict.CleanupNow(ctx); err != nil || n != 1 {
		t.Fatalf("cleanup with a 30s grace = %d, %v; want 1, nil", n, err)
	}
	if err := patient.Complete(ctx, other, tok, &storage.Response{Status: 201}, time.Hour); !errors.Is(err, storage.ErrLeaseLost) {
		t.Fatalf("Complete after cleanup removed the lapsed lease: %v, want ErrLeaseLost", err)
	}
}

func TestCleanupSkipsWhileAnotherInstanceHoldsTheLock(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.Require(t)
	s := newStore(t, postgres.Options{CleanupInterval: -1})
	_, _ = s.Get(ctx, storage.Key{}, false) // creates the table
	insertExpired(t, dsn, s, "locked", 10)

	other, err := pgx.Connect(ctx, dsn)
	ok(t, err)
	defer other.Close(context.Background())
	_, err = other.Exec(ctx, `SELECT pg_advisory_lock($1)`, s.CleanupLockKey())
	ok(t, err)
	if n, err := s.CleanupNow(ctx); !errors.Is(err, postgres.ErrCleanupLocked) || n != 0 {
		t.Fatalf("cleanup while locked = %d, %v; want 0, ErrCleanupLocked", n, err)
	}
	if n := rows(t, dsn, s, "locked"); n != 10 {
		t.Fatalf("%d rows left, want all 10", n)
	}
	_, err = other.Exec(ctx, `SELECT pg_advisory_unlock($1)`, s.CleanupLockKey())
	ok(t, err)
	if n, err := s.CleanupNow(ctx); err != nil || n != 10 {
		t.Fatalf("cleanup after unlock = %d, %v; want 10, nil", n, err)
	}
}

// TestConcurrentCleanersShareTheWork starts several stores (instances)
// cleaning one table at once: one runs, the others skip, and together
// they delete every expired row exactly once without an error.
func TestConcurrentCleanersShareTheWork(t *testing.T) {
	const (
		cleaners = 4
		expired  = 20000
		batch    = 50 // many batches: the run outlasts the others' attempts
	)
	dsn := pgtest.Require(t)
	table := pgtest.Table(t, dsn)
	var stores []*postgres.Store
	for range cleaners {
		stores = append(stores, openStore(t, testPool(t, dsn, 2), postgres.Options{
			Table: table, CreateTable: true, CleanupInterval: -1, CleanupBatch: batch,
		}))
	}
	_, _ = stores[0].Get(t.Context(), storage.Key{}, false) // creates the table
	insertExpired(t, dsn, stores[0], "shared", expired)

	var total, locked atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, s := range stores {
		wg.Go(func() {
			<-start
			n, err := s.CleanupNow(t.Context())
			switch {
			case errors.Is(err, postgres.ErrCleanupLocked):
				locked.Add(1)
			case err != nil:
				t.Errorf("cleanup: %v", err)
			}
			total.Add(n)
		})
	}
	close(start)
	wg.Wait()
	if total.Load() != expired {
		t.Errorf("deleted %d rows together, want %d", total.Load(), expired)
	}
	if locked.Load() == 0 {
		t.Errorf("no cleaner was kept out by the lock")
	}
	t.Logf("%d of %d cleaners skipped", locked.Load(), cleaners)
}

func TestCleanupRunsPeriodicallyUntilClose(t *testing.T) {
	dsn := pgtest.Require(t)
	var runs atomic.Int64
	var deleted atomic.Int64
	s := newStore(t, postgres.Options{
		CleanupInterval: 20 * time.Millisecond,
		OnCleanup: func(n int64, err error) {
			if err != nil && !errors.Is(err, postgres.ErrCleanupLocked) {
				t.Errorf("periodic cleanup: %v", err)
			}
			runs.Add(1)
			deleted.Add(n)
		},
	})
	_, _ = s.Get(t.Context(), storage.Key{}, false) // creates the table
	insertExpired(t, dsn, s, "periodic", 5)
	testutil.Eventually(t, 30*time.Second, "the periodic cleanup to delete 5 rows", func() bool { return deleted.Load() >= 5 })
	ok(t, s.Close()) // returns once the cleanup goroutine has
	after := runs.Load()
	time.Sleep(100 * time.Millisecond)
	if n := runs.Load(); n != after {
		t.Fatalf("%d cleanup runs after Close", n-after)
	}
	ok(t, s.Close()) // idempotent
	if _, err := s.Get(context.Background(), storage.Key{Scope: "x", ID: "y"}, false); err == nil || errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("Get after Close: %v, want the closed pool's error", err)
	}
}

// TestCloseStopsARunningCleanup closes a store in the middle of a long
// cleanup: Close must return promptly, and the lock must be free for the
// next instance.
func TestCloseStopsARunningCleanup(t *testing.T) {
	dsn := pgtest.Require(t)
	table := pgtest.Table(t, dsn)
	s, err := postgres.New(testPool(t, dsn, 2), postgres.Options{
		Table: table, CreateTable: true, CleanupInterval: 10 * time.Millisecond, CleanupBatch: 10,
	})
	ok(t, err)
	defer s.Close()
	_, _ = s.Get(t.Context(), storage.Key{}, false)
	insertExpired(t, dsn, s, "close", 50000)
	// Wait until a run is deleting.
	for deadline := time.Now().Add(5 * time.Second); rows(t, dsn, s, "close") == 50000; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("cleanup did not start")
		}
	}
	begun := time.Now()
	ok(t, s.Close())
	if took := time.Since(begun); took > 3*time.Second {
		t.Fatalf("Close took %v during a cleanup", took)
	}
	next := newStore(t, postgres.Options{Table: table, CleanupInterval: -1})
	n, err := next.CleanupNow(t.Context())
	if err != nil {
		t.Fatalf("cleanup after the other instance closed mid-run: %v", err)
	}
	t.Logf("the next instance deleted the remaining %d rows", n)
	if left := rows(t, dsn, next, "close"); left != 0 {
		t.Fatalf("%d rows left", left)
	}
}
