package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
	"github.com/caddy-idempotency/caddy-idempotency/storage/storagetest"
)

// isolationLevels are the defaults under which the store must behave as
// under PostgreSQL's own, READ COMMITTED: the levels organisations set as
// their database's or role's default, and PostgreSQL-compatible databases
// (CockroachDB, YugabyteDB) use.
var isolationLevels = []string{"serializable", "repeatable read"}

// pinnedPool returns a pool made by NewPoolConfig, as the Caddy module
// makes them; the store that gets it closes it.
func pinnedPool(t testing.TB, dsn string, maxConns int) *pgxpool.Pool {
	t.Helper()
	cfg, err := postgres.NewPoolConfig(dsn, maxConns)
	ok(t, err)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	ok(t, err)
	return pool
}

// TestConformanceUnderIsolation runs the conformance suite on a database
// whose default isolation is serializable or repeatable read, through a
// pool made by NewPoolConfig (which pins READ COMMITTED on its sessions)
// and through a pool made without it (the store then relies on retrying
// serialization failures): every concurrent same-key race must still have
// exactly one winner and no error.
func TestConformanceUnderIsolation(t *testing.T) {
	for _, level := range isolationLevels {
		t.Run(level, func(t *testing.T) {
			dsn := pgtest.DatabaseWithIsolation(t, level)
			t.Run("NewPoolConfig", func(t *testing.T) {
				storagetest.Run(t, openStore(t, pinnedPool(t, dsn, 16), postgres.Options{CreateTable: true, Table: pgtest.Name("idem_test_")}))
			})
			t.Run("plain pool", func(t *testing.T) {
				storagetest.Run(t, openStore(t, testPool(t, dsn, 16), postgres.Options{CreateTable: true, Table: pgtest.Name("idem_test_")}))
			})
		})
	}
}

// TestSerializationFailuresAreRetried takes away the pin (as a
// PostgreSQL-compatible database without READ COMMITTED, or a proxy that
// drops the start-up parameter, would): same-key races then end in
// serialization failures, and the store's retries alone must still give
// every racer a definite answer with exactly one winner.
func TestSerializationFailuresAreRetried(t *testing.T) {
	for _, level := range isolationLevels {
		t.Run(level, func(t *testing.T) {
			dsn := pgtest.DatabaseWithIsolation(t, level)
			table := pgtest.Name("idem_test_")
			stores := []*postgres.Store{
				openStore(t, testPool(t, dsn, 12), postgres.Options{Table: table, CreateTable: true}),
				openStore(t, testPool(t, dsn, 12), postgres.Options{Table: table, CreateTable: true}),
			}
			for _, s := range stores {
				s.TrustSessions()
			}
			hammer(t, 20, stores...)
			if stores[0].Retries()+stores[1].Retries() == 0 {
				t.Fatalf("no Reserve round was rolled back under %s: the test did not exercise the retries", level)
			}
		})
	}
}

// TestLeaseOperationsRetrySerializationFailures races a request's
// renewals of its lease against its completion, as the Caddy module's
// renewal goroutine does, on unpinned sessions: under REPEATABLE READ and
// SERIALIZABLE the loser of each row update fails with a serialization
// error, which the store must retry into the answer READ COMMITTED would
// give: renewals succeed until the completion, then find the lease gone;
// the completion succeeds.
func TestLeaseOperationsRetrySerializationFailures(t *testing.T) {
	const rounds = 30
	const maxOverlappingRenewals = 5 // below the store's 8 attempts
	for _, level := range isolationLevels {
		t.Run(level, func(t *testing.T) {
			dsn := pgtest.DatabaseWithIsolation(t, level)
			s := openStore(t, testPool(t, dsn, 4), postgres.Options{CreateTable: true, Table: pgtest.Name("idem_test_")})
			s.TrustSessions()
			ctx := t.Context()
			for round := range rounds {
				key := storage.Key{Scope: "lease", ID: fmt.Sprint(round)}
				tok := acquire(t, s, key, fpA, time.Minute)
				var wg sync.WaitGroup
				start := make(chan struct{})
				var renewErr, completeErr error
				completing := make(chan struct{})
				wg.Go(func() {
					<-start
					// A few renewals back to back (the module's come a
					// tenth of lock_timeout apart) while the completion
					// runs. Each can fail at most one attempt of the
					// completion, so fewer of them than the store's
					// attempts leave the completion a definite answer
					// however the scheduler interleaves them; then one
					// renewal after the completion.
					for range maxOverlappingRenewals {
						if renewErr = s.Renew(ctx, key, tok, time.Minute); renewErr != nil {
							break
						}
					}
					<-completing
					if renewErr == nil {
						renewErr = s.Renew(ctx, key, tok, time.Minute)
					}
				})
				wg.Go(func() {
					defer close(completing)
					<-start
					completeErr = s.Complete(ctx, key, tok, &storage.Response{Status: 201}, time.Hour)
				})
				close(start)
				wg.Wait()
				if completeErr != nil {
					t.Fatalf("round %d: Complete: %v", round, completeErr)
				}
				// The last renewal came after the completion.
				if !errors.Is(renewErr, storage.ErrLeaseLost) {
					t.Fatalf("round %d: renewal: %v, want success until ErrLeaseLost", round, renewErr)
				}
				if o := outcome(t, s, key, fpA); o != storage.Replay {
					t.Fatalf("round %d: after the race: %v, want replay", round, o)
				}
			}
			t.Logf("%d rounds: every completion and renewal decided", rounds)
		})
	}
}

// TestSessionsArePinnedToReadCommitted checks the pin itself, on a pool
// made by NewPoolConfig (a start-up parameter) and on a plain pool (the
// store sets each session on first use): the store's sessions run at
// READ COMMITTED whatever the database's default, so that same-key races
// are decided without a single serialization failure to retry.
func TestSessionsArePinnedToReadCommitted(t *testing.T) {
	for _, level := range isolationLevels {
		t.Run(level, func(t *testing.T) {
			dsn := pgtest.DatabaseWithIsolation(t, level)
			for name, pool := range map[string]func() *pgxpool.Pool{
				"NewPoolConfig": func() *pgxpool.Pool { return pinnedPool(t, dsn, 12) },
				"plain pool":    func() *pgxpool.Pool { return testPool(t, dsn, 12) },
			} {
				t.Run(name, func(t *testing.T) {
					table := pgtest.Name("idem_test_")
					stores := []*postgres.Store{
						openStore(t, pool(), postgres.Options{Table: table, CreateTable: true}),
						openStore(t, pool(), postgres.Options{Table: table, CreateTable: true}),
					}
					hammer(t, 10, stores...)
					// A deadlock between concurrent inserts of one key
					// is rare but possible at any level; a serialization
					// failure is not at READ COMMITTED.
					if n := stores[0].SerializationFailures() + stores[1].SerializationFailures(); n != 0 {
						t.Errorf("%d Reserve rounds failed to serialize: the sessions did not run at READ COMMITTED", n)
					}
					for i, s := range stores {
						var got string
						ok(t, s.Pool().AcquireFunc(t.Context(), func(c *pgxpool.Conn) error {
							return c.QueryRow(t.Context(), `SHOW transaction_isolation`).Scan(&got)
						}))
						if got != "read committed" {
							t.Errorf("store %d: a session of its pool runs at %s", i, got)
						}
					}
				})
			}
		})
	}
}
