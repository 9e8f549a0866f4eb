package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
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

// TestRenewBatchRenewsTenThousandLeasesInChunks: the leases of ten
// thousand running requests (lapsed, but nobody took them over) are
// renewed by one statement per chunk of postgres.RenewChunk leases, one
// pipeline and one commit each, counted by the store and seen on the
// wire: what renewals cost grows with the leases by a round trip per
// chunk, and a slow batch renews part of its leases rather than none.
func TestRenewBatchRenewsTenThousandLeasesInChunks(t *testing.T) {
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
	chunks := int64((n + postgres.RenewChunk - 1) / postgres.RenewChunk)
	if got := s.RenewalRoundTrips() - roundTrips; got != chunks {
		t.Errorf("RenewBatch of %d leases took %d round trips, want %d", n, got, chunks)
	}
	if got := tr.pipelines.Load() - pipelines; got != chunks {
		t.Errorf("RenewBatch of %d leases sent the renewal in %d pipelines, want %d", n, got, chunks)
	}
	if got := leasesLongerThan(t, dsn, s, "many", 50*time.Minute); got != n {
		t.Errorf("%d leases of %d run for most of the hour asked, want all", got, n)
	}
}

// TestRenewBatchPassesOverALockedRow: one lease's row is held by an outside
// transaction. RenewBatch does not wait for it: it returns, after the lock
// wait, while the row is still held, with that lease alone busy (not
// renewed, not lost) and every other renewed, in one round trip and the
// waiting renewal's, which goes on waiting for the row; once the row is
// let go, the busy lease is renewed.
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
	if got := s.RenewalRoundTrips() - roundTrips; got != 2 {
		t.Errorf("RenewBatch took %d round trips, want 2 (the batch, the waiting renewal)", got)
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

// TestCloseEndsAWaitingRenewal: a lease's row held by an outside
// transaction leaves a waiting renewal on a connection of the renewal
// pool, for up to the lease (an hour here); Close does not wait for it.
func TestCloseEndsAWaitingRenewal(t *testing.T) {
	dsn := pgtest.Require(t)
	s := newStore(t, postgres.Options{})
	if _, err := s.Get(t.Context(), storage.Key{Scope: "closing", ID: "0"}, false); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("creating the table: %v", err)
	}
	batch := insertLeases(t, dsn, s, "closing", 2, time.Hour)
	_, still := holdRow(t, dsn, s, batch[0].Key)
	if err := receive(t, renewBatch(s, batch), "RenewBatch with a row held by another transaction"); err != nil {
		t.Fatalf("RenewBatch: %v", err)
	}
	if !errors.Is(batch[0].Err, storage.ErrBusy) {
		t.Fatalf("the lease whose row is held: %v, want ErrBusy (its waiting renewal goes on)", batch[0].Err)
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	if err := receive(t, closed, "Close with a waiting renewal"); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if !still() {
		t.Fatal("the outside transaction no longer holds its row")
	}
}

// TestAnOutsideLockNeverOpensAGapForATakeover is the review's finding: an
// outside transaction holds the row of a running request's lease for
// longer than the lease. The owner's renewals wait for the row, but each
// waiting renewal gave up after a lease, and the next began only at the
// owner's next tick: a lock let go in between left a lapsed lease that no
// renewal was queued for, and another instance's reserve took it over
// while the request still ran (2 executions). Now the owner's waiting
// renewal stays queued on the row as long as the owner asks for the
// lease: this test looks for a moment with no renewal waiting on the row
// (it lets the lock go then, and the other instance's reserve must not
// take the key over).
func TestAnOutsideLockNeverOpensAGapForATakeover(t *testing.T) {
	dsn := pgtest.Require(t)
	table := pgtest.Table(t, dsn)
	owner := newStore(t, postgres.Options{Table: table})
	other := newStore(t, postgres.Options{Table: table})
	ctx := t.Context()
	key := storage.Key{Scope: "gap", ID: "k"}
	const lease = 400 * time.Millisecond
	res, err := owner.Reserve(ctx, key, fpA, lease)
	if err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("reserve: %+v, %v", res, err)
	}
	release, _ := holdRow(t, dsn, owner, key)

	// The owner's renewer: a tick a third of the lease, as the handler's.
	defer renewEvery(owner, lease/3, func() []storage.Renewal {
		return []storage.Renewal{{Key: key, Token: res.Token, Lease: lease}}
	})()

	probe, err := pgx.Connect(ctx, dsn)
	ok(t, err)
	defer probe.Close(context.Background())
	waiting := func() int {
		var n int
		ok(t, probe.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%'||$1||'%'`, table).Scan(&n))
		return n
	}
	// Until a renewal waits on the row, then, for several leases, a moment
	// when none does.
	testutil.Eventually(t, 10*time.Second, "the owner's renewal to wait on the held row", func() bool { return waiting() > 0 })
	gap := false
	for deadline := time.Now().Add(6 * lease); time.Now().Before(deadline) && !gap; time.Sleep(5 * time.Millisecond) {
		gap = waiting() == 0
	}
	release()
	got, err := other.Reserve(ctx, key, fpA, lease)
	if err == nil && got.Outcome == storage.Acquired {
		t.Fatalf("the other instance took the running request's key over once the outside lock went (a gap with no renewal waiting: %v)", gap)
	}
	if gap {
		t.Errorf("a moment came with no renewal waiting on the held row of a lease its owner still asked for")
	}
}

// TestASecondOutsideLockNeverOpensAGapForATakeover is a review finding:
// TestAnOutsideLockNeverOpensAGapForATakeover with a second row. While
// the owner's waiting renewal is queued on the first held row (and stays
// queued as long as the owner asks), an outside transaction holds the
// row of a second lease of the same owner. When only one waiting renewal
// ran at a time, the second lease was answered busy at every tick and
// never queued on its row: it lapsed under the lock, and when the lock
// went another instance's reserve took the key over while the owner's
// request still ran. It gets a waiting renewal of its own now.
func TestASecondOutsideLockNeverOpensAGapForATakeover(t *testing.T) {
	l := newTwoLeases(t, "gap2")
	l.hold(l.first)
	defer l.renewBoth()()
	l.waitForTheWaitingRenewal()
	release, _ := l.hold(l.second)
	time.Sleep(4 * l.lease)
	left := l.leaseLeft(l.second)
	release()
	l.noTakeover(l.second, left)
}

// twoLeases are two leases of one owner store, for the outside-lock tests.
type twoLeases struct {
	t             *testing.T
	dsn, table    string
	owner, other  *postgres.Store
	first, second storage.Key
	tokens        [2]storage.Token
	lease         time.Duration
	probe         *pgx.Conn
}

func newTwoLeases(t *testing.T, scope string) *twoLeases {
	dsn := pgtest.Require(t)
	table := pgtest.Table(t, dsn)
	l := &twoLeases{t: t, dsn: dsn, table: table, lease: 400 * time.Millisecond,
		owner: newStore(t, postgres.Options{Table: table}), other: newStore(t, postgres.Options{Table: table}),
		first: storage.Key{Scope: scope, ID: "a"}, second: storage.Key{Scope: scope, ID: "b"}}
	for i, k := range []storage.Key{l.first, l.second} {
		res, err := l.owner.Reserve(t.Context(), k, fpA, l.lease)
		if err != nil || res.Outcome != storage.Acquired {
			t.Fatalf("reserve %v: %+v, %v", k, res, err)
		}
		l.tokens[i] = res.Token
	}
	probe, err := pgx.Connect(t.Context(), dsn)
	ok(t, err)
	t.Cleanup(func() { probe.Close(context.Background()) })
	l.probe = probe
	return l
}

// hold locks key's row from an outside transaction (holdRow).
func (l *twoLeases) hold(key storage.Key) (release func(), still func() bool) {
	return holdRow(l.t, l.dsn, l.owner, key)
}

// renewBoth renews both leases in one batch per tick, as the owner's
// renewer does, until the function it returns is called.
func (l *twoLeases) renewBoth() (stop func()) {
	return renewEvery(l.owner, l.lease/3, func() []storage.Renewal {
		return []storage.Renewal{{Key: l.first, Token: l.tokens[0], Lease: l.lease}, {Key: l.second, Token: l.tokens[1], Lease: l.lease}}
	})
}

// waitForTheWaitingRenewal waits until a renewal of the owner waits on a
// held row.
func (l *twoLeases) waitForTheWaitingRenewal() {
	testutil.Eventually(l.t, 10*time.Second, "the owner's renewal to wait on a held row", func() bool {
		var n int
		ok(l.t, l.probe.QueryRow(l.t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%'||$1||'%'`, l.table).Scan(&n))
		return n > 0
	})
}

// leaseLeft is how long key's lease has left.
func (l *twoLeases) leaseLeft(key storage.Key) time.Duration {
	var left time.Duration
	ok(l.t, l.probe.QueryRow(l.t.Context(), `SELECT extract(epoch FROM expires_at - clock_timestamp())*1e9 FROM `+l.table+` WHERE scope = $1 AND key = $2`, key.Scope, key.ID).Scan(&left))
	return left
}

// noTakeover fails the test if the other instance can take key over.
func (l *twoLeases) noTakeover(key storage.Key, left time.Duration) {
	got, err := l.other.Reserve(l.t.Context(), key, fpA, l.lease)
	l.t.Logf("%v's lease left: %v; the other instance's reserve: %+v %v", key, left, got.Outcome, err)
	if err == nil && got.Outcome == storage.Acquired {
		l.t.Fatalf("the other instance took the running request's key %v over", key)
	}
}

// renewEvery renews the leases batch makes on s every period, as a
// handler's renewer does, until the function it returns is called.
func renewEvery(s *postgres.Store, every time.Duration, batch func() []storage.Renewal) (stop func()) {
	done := make(chan struct{})
	var ticks sync.WaitGroup
	ticks.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(every):
			}
			s.RenewBatch(context.Background(), batch())
		}
	})
	return func() { close(done); ticks.Wait() }
}
