package postgres_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

// tracer counts what the client sends: round trips (a statement alone,
// or a pipeline of them), statements, and statement preparations (each
// preparation is one more round trip).
type tracer struct {
	roundTrips, queries, prepares atomic.Int64
}

func (tr *tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	tr.roundTrips.Add(1)
	tr.queries.Add(1)
	return ctx
}

func (*tracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (tr *tracer) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	tr.prepares.Add(1)
	return ctx
}

func (*tracer) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

// A pipeline (batch.go: reserves, completions and releases, each after
// the guard that bounds its lock waits) is one round trip, of several
// statements.
func (tr *tracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	tr.roundTrips.Add(1)
	return ctx
}

func (tr *tracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	tr.queries.Add(1)
}

func (*tracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TestStatementsPerOperation measures what each operation costs the
// server, as committed transactions of a database of the test's own (so
// that tests running in parallel do not count), and the client, as round
// trips. Every operation is one transaction and one round trip, so a new
// key (Reserve, Complete) costs two and a replay one; once a connection
// has prepared its statements, running them is one round trip. (A
// reserve, a completion, a release or a renewal goes in a pipeline after
// the guard statement that bounds its wait for a locked row: two
// statements, one round trip, one transaction.)
func TestStatementsPerOperation(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.Require(t)
	dbDSN, db := pgtest.Database(t, dsn)
	cfg, err := pgxpool.ParseConfig(dbDSN)
	ok(t, err)
	cfg.MaxConns = 1 // one session: the database's statistics are its own
	tr := new(tracer)
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	ok(t, err)
	s := openStore(t, pool, postgres.Options{CreateTable: true, CleanupInterval: -1})

	n := 0
	fresh := func() storage.Key {
		n++
		return storage.Key{Scope: "count", ID: strconv.Itoa(n)}
	}
	resp := &storage.Response{Status: 201, Body: []byte(`{"id":1}`)}
	done := fresh()
	completed(t, s, done, time.Hour)
	running := fresh()
	tok := acquire(t, s, running, fpA, time.Hour)
	gone := fresh()

	ops := []struct {
		name    string
		prepare func() // unmeasured
		op      func()
		want    int64
	}{
		{name: "new key: reserve and complete", want: 2, op: func() {
			key := fresh()
			ok(t, s.Complete(ctx, key, acquire(t, s, key, fpA, time.Minute), resp, time.Hour))
		}},
		{name: "replay", want: 1, op: func() { wantOutcome(t, s, done, fpA, storage.Replay) }},
		{name: "conflict", want: 1, op: func() { wantOutcome(t, s, running, fpA, storage.Conflict) }},
		{name: "mismatch", want: 1, op: func() { wantOutcome(t, s, done, fpB, storage.Mismatch) }},
		{name: "renew", want: 1, op: func() { ok(t, s.Renew(ctx, running, tok, time.Hour)) }},
		{name: "reserve and release", want: 2, op: func() {
			key := fresh()
			ok(t, s.Release(ctx, key, acquire(t, s, key, fpA, time.Minute)))
		}},
		{name: "get", want: 1, op: func() {
			_, err := s.Get(ctx, done, true)
			ok(t, err)
		}},
		{name: "delete", want: 1, prepare: func() { completed(t, s, gone, time.Hour) }, op: func() { ok(t, s.Delete(ctx, gone)) }},
	}
	// Warm up: prepare every statement on the connection (and create the
	// table), as any connection does on its first requests.
	for _, o := range ops {
		if o.prepare != nil {
			o.prepare()
		}
		o.op()
	}

	for _, o := range ops {
		if o.prepare != nil {
			o.prepare()
		}
		rt, q, p := tr.roundTrips.Load(), tr.queries.Load(), tr.prepares.Load()
		o.op()
		roundTrips, sent := tr.roundTrips.Load()-rt, tr.queries.Load()-q
		if roundTrips != o.want {
			t.Errorf("%s: %d round trips, want %d", o.name, roundTrips, o.want)
		}
		if prepared := tr.prepares.Load() - p; prepared != 0 {
			t.Errorf("%s: prepared %d statements on a warm connection, want 0", o.name, prepared)
		}
		commits := pgtest.CountCommits(t, dsn, db, s.Pool(), o.prepare, o.op)
		t.Logf("%s: %d round trips, %d statements, %d transactions", o.name, roundTrips, sent, commits)
		if commits != o.want {
			t.Errorf("%s: committed %d transactions, want %d", o.name, commits, o.want)
		}
	}
}

// wantOutcome reserves key and fails unless the outcome is want.
func wantOutcome(t testing.TB, s storage.Store, key storage.Key, fp []byte, want storage.Outcome) {
	t.Helper()
	if got := outcome(t, s, key, fp); got != want {
		t.Fatalf("Reserve(%q) = %v, want %v", key.ID, got, want)
	}
}
