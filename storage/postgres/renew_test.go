package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

// renewalTracer counts the pipelines that carry the renewal statement, on
// whichever pool of the store's (the renewal pool is made from the store
// pool's configuration, tracer included).
type renewalTracer struct {
	pipelines atomic.Int64
}

func (tr *renewalTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if isRenewal(d.SQL) {
		tr.pipelines.Add(1) // a renewal sent alone: not what RenewBatch does
	}
	return ctx
}

func (*renewalTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (tr *renewalTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for _, q := range d.Batch.QueuedQueries {
		if isRenewal(q.SQL) {
			tr.pipelines.Add(1)
		}
	}
	return ctx
}

func (*renewalTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (*renewalTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// isRenewal reports whether sql renews leases: Renew's statement or
// RenewBatch's.
func isRenewal(sql string) bool {
	return strings.Contains(sql, "unnest(") || strings.HasPrefix(sql, "UPDATE") && strings.Contains(sql, "SET expires_at")
}

// insertLeases writes n in-flight rows of scope straight into the table,
// keys "1" to "n", key i holding token i, each lease lapsed a second ago
// (nobody took them over: they are still their owners' to renew), and
// returns the renewals that name them.
func insertLeases(t *testing.T, dsn string, s *postgres.Store, scope string, n int, lease time.Duration) []storage.Renewal {
	t.Helper()
	pgtest.Exec(t, dsn, `INSERT INTO `+s.Table()+` (scope, key, fingerprint, state, token, created_at, expires_at)
		SELECT $1, i::text, '\x00', 1, i, now(), now() - interval '1 second' FROM generate_series(1, $2::int) i`, scope, n)
	batch := make([]storage.Renewal, n)
	for i := range batch {
		batch[i] = storage.Renewal{Key: storage.Key{Scope: scope, ID: fmt.Sprint(i + 1)}, Token: storage.Token(i + 1), Lease: lease}
	}
	return batch
}

// leasesLongerThan counts the in-flight rows of scope whose lease ends
// more than d from now, by the server's clock.
func leasesLongerThan(t *testing.T, dsn string, s *postgres.Store, scope string, d time.Duration) int {
	t.Helper()
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, dsn)
	ok(t, err)
	defer conn.Close(context.Background())
	var n int
	ok(t, conn.QueryRow(ctx, `SELECT count(*) FROM `+s.Table()+` WHERE scope = $1 AND state = 1
		AND expires_at > now() + $2::bigint * interval '1 microsecond'`, scope, d.Microseconds()).Scan(&n))
	return n
}

// renewBatch runs RenewBatch in the background; its error arrives on the
// channel returned.
func renewBatch(s *postgres.Store, batch []storage.Renewal) <-chan error {
	done := make(chan error, 1)
	go func() { done <- s.RenewBatch(context.Background(), batch) }()
	return done
}

// TestRenewBatchRenewsTenThousandLeasesInOneRoundTrip: the leases of ten
// thousand running requests (lapsed, but nobody took them over) are
// renewed by one statement in one pipeline, counted by the store and seen
// on the wire: what renewals cost does not grow with the leases.
func TestRenewBatchRenewsTenThousandLeasesInOneRoundTrip(t *testing.T) {
	const n = 10000
	dsn := pgtest.Require(t)
	cfg, err := pgxpool.ParseConfig(dsn)
	ok(t, err)
	cfg.MaxConns = 4
	tr := new(renewalTracer)
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	ok(t, err)
	s := openStore(t, pool, postgres.Options{Table: pgtest.Table(t, dsn), CreateTable: true})
	if _, err := s.Get(t.Context(), storage.Key{Scope: "many", ID: "0"}, false); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("creating the table: %v", err)
	}
	batch := insertLeases(t, dsn, s, "many", n, time.Hour)

	roundTrips, pipelines := s.RenewalRoundTrips(), tr.pipelines.Load()
	if err := s.RenewBatch(t.Context(), batch); err != nil {
		t.Fatalf("RenewBatch of %d leases: %v", n, err)
	}
	for i, r := range batch {
		if r.Err != nil {
			t.Fatalf("lease %d of %d: %v, want renewed", i+1, n, r.Err)
		}
	}
	if got := s.RenewalRoundTrips() - roundTrips; got != 1 {
		t.Errorf("RenewBatch of %d leases took %d round trips, want 1", n, got)
	}
	if got := tr.pipelines.Load() - pipelines; got != 1 {
		t.Errorf("RenewBatch of %d leases sent the renewal in %d pipelines, want 1", n, got)
	}
	if got := leasesLongerThan(t, dsn, s, "many", 50*time.Minute); got != n {
		t.Errorf("%d leases of %d run for most of the hour asked, want all", got, n)
	}
}

// TestRenewBatchPassesOverALockedRow: one lease's row is held by an outside
// transaction. RenewBatch does not wait for it: it returns while the row is
// still held, with that lease alone busy (not renewed, not lost) and every
// other renewed, in one round trip; once the row is let go, the busy lease
// is renewed on the next call.
func TestRenewBatchPassesOverALockedRow(t *testing.T) {
	dsn := pgtest.Require(t)
	s := newStore(t, postgres.Options{})
	if _, err := s.Get(t.Context(), storage.Key{Scope: "locked", ID: "0"}, false); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("creating the table: %v", err)
	}
	batch := insertLeases(t, dsn, s, "locked", 5, time.Hour)
	release, still := holdRow(t, dsn, s, batch[2].Key)

	roundTrips := s.RenewalRoundTrips()
	if err := receive(t, renewBatch(s, batch), "RenewBatch with a row held by another transaction"); err != nil {
		t.Fatalf("RenewBatch: %v", err)
	}
	if !still() {
		t.Fatal("the outside transaction no longer holds its row")
	}
	for i, r := range batch {
		switch {
		case i == 2:
			if !errors.Is(r.Err, storage.ErrBusy) || storage.Unavailable(r.Err) || errors.Is(r.Err, storage.ErrLeaseLost) {
				t.Errorf("the lease whose row is held: %v, want ErrBusy", r.Err)
			}
		case r.Err != nil:
			t.Errorf("lease %d: %v, want renewed", i, r.Err)
		}
	}
	if got := s.RenewalRoundTrips() - roundTrips; got != 1 {
		t.Errorf("RenewBatch took %d round trips, want 1", got)
	}
	if got := leasesLongerThan(t, dsn, s, "locked", 50*time.Minute); got != 4 {
		t.Errorf("%d leases renewed, want the 4 whose rows were free", got)
	}

	release()
	if err := receive(t, renewBatch(s, batch), "RenewBatch once the row is let go"); err != nil {
		t.Fatalf("RenewBatch: %v", err)
	}
	for i, r := range batch {
		if r.Err != nil {
			t.Errorf("lease %d once the row is let go: %v, want renewed", i, r.Err)
		}
	}
	if got := leasesLongerThan(t, dsn, s, "locked", 50*time.Minute); got != 5 {
		t.Errorf("%d leases renewed, want all 5", got)
	}
}

// TestRenewBatchDoesNotWaitForTheStorePool: every connection of the
// store's pool is taken (requests holding them all, as under a burst of
// reserves and completions), and renewals go through all the same, on
// their own connections.
func TestRenewBatchDoesNotWaitForTheStorePool(t *testing.T) {
	dsn := pgtest.Require(t)
	const conns = 4
	s := openStore(t, testPool(t, dsn, conns), postgres.Options{Table: pgtest.Table(t, dsn), CreateTable: true})
	key := storage.Key{Scope: "exhausted", ID: "k"}
	tok := acquire(t, s, key, fpA, time.Minute)

	var held []*pgxpool.Conn
	for range conns {
		c, err := s.Pool().Acquire(t.Context())
		ok(t, err)
		held = append(held, c)
	}
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	if st := s.Pool().Stat(); st.AcquiredConns() != conns || st.MaxConns() != conns {
		t.Fatalf("the store's pool: %d of %d connections taken, want all", st.AcquiredConns(), st.MaxConns())
	}

	batch := []storage.Renewal{{Key: key, Token: tok, Lease: time.Hour}}
	if err := receive(t, renewBatch(s, batch), "RenewBatch while the store's pool is exhausted"); err != nil || batch[0].Err != nil {
		t.Fatalf("RenewBatch while the store's pool is exhausted: %v, lease: %v; want renewed", err, batch[0].Err)
	}
	if got := leasesLongerThan(t, dsn, s, "exhausted", 50*time.Minute); got != 1 {
		t.Fatalf("the lease was not renewed")
	}
}
