package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

// A row another session commits after Reserve's statement took its
// snapshot is the READ COMMITTED trap: the INSERT conflicts with it (ON
// CONFLICT sees the latest committed row) while the statement's snapshot
// does not show it, so the statement returns no row. These tests build
// that interleaving on purpose: a competitor's transaction writes the row
// and stays open, Reserve starts and blocks on the competitor's row lock
// (its snapshot is already taken), then the competitor commits.
func TestReserveSeesRowCommittedAfterItsSnapshot(t *testing.T) {
	cases := []struct {
		name string
		// before prepares the key: nothing, or a lapsed lease to take over.
		lapsed bool
		// The competitor's row: state and fingerprint.
		state int
		fp    []byte
		want  storage.Outcome
	}{
		{name: "inserted in flight", state: 1, fp: fpA, want: storage.Conflict},
		{name: "inserted completed", state: 2, fp: fpA, want: storage.Replay},
		{name: "inserted for another request", state: 1, fp: fpB, want: storage.Mismatch},
		{name: "lapsed lease taken over", lapsed: true, state: 1, fp: fpA, want: storage.Conflict},
		{name: "lapsed lease taken over and completed", lapsed: true, state: 2, fp: fpA, want: storage.Replay},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			dsn := pgtest.Require(t)
			// Reserve waits on the competitor's row lock for as long as
			// the test takes to commit it.
			s := newStore(t, postgres.Options{LockWait: patientLockWait})
			key := storage.Key{Scope: "visibility", ID: "k"}
			if tc.lapsed {
				acquire(t, s, key, fpB, 50*time.Millisecond)
				time.Sleep(200 * time.Millisecond)
			} else {
				_, err := s.Get(ctx, key, false) // creates the table
				if err != storage.ErrNotFound {
					t.Fatalf("Get: %v", err)
				}
			}

			competitor, err := pgx.Connect(ctx, dsn)
			ok(t, err)
			defer competitor.Close(context.Background())
			tx, err := competitor.Begin(ctx)
			ok(t, err)
			defer tx.Rollback(context.Background())
			tag, err := tx.Exec(ctx, `INSERT INTO `+s.Table()+` AS r
	(scope, key, fingerprint, state, token, status, headers, body, created_at, expires_at)
VALUES ($1, $2, $3, $4, 42, 201, $5, 'done', now(), now() + interval '1 minute')
ON CONFLICT (scope, key) DO UPDATE SET fingerprint = excluded.fingerprint, state = excluded.state,
	token = excluded.token, status = excluded.status, headers = excluded.headers, body = excluded.body,
	created_at = excluded.created_at, expires_at = excluded.expires_at
WHERE r.expires_at <= now()`, key.Scope, key.ID, tc.fp, tc.state, storage.AppendHeader(nil, nil))
			ok(t, err)
			if tag.RowsAffected() != 1 {
				t.Fatalf("competitor wrote %d rows", tag.RowsAffected())
			}

			before := s.Fallbacks()
			type result struct {
				res storage.Reservation
				err error
			}
			done := make(chan result, 1)
			go func() {
				res, err := s.Reserve(ctx, key, fpA, time.Minute)
				done <- result{res, err}
			}()
			if tc.lapsed {
				// A lapsed row another transaction holds is never waited
				// for on the server (statements.reserve): Reserve finds
				// it locked, and tries again until it is let go; then the
				// competitor's row is live in its snapshot.
				testutil.Eventually(t, 10*time.Second, "Reserve to find the row locked", func() bool { return s.LockedAnswers() > 0 })
			} else {
				waitForLockWait(t, dsn, s.Table())
			}
			ok(t, tx.Commit(ctx))

			r := <-done
			if r.err != nil || r.res.Outcome != tc.want {
				t.Fatalf("Reserve = %v, %v; want %v", r.res.Outcome, r.err, tc.want)
			}
			if tc.want == storage.Replay && string(r.res.Record.Response.Body) != "done" {
				t.Fatalf("replayed body %q", r.res.Record.Response.Body)
			}
			if n, want := s.Fallbacks()-before, map[bool]int64{false: 1, true: 0}[tc.lapsed]; n != want {
				t.Fatalf("Reserve read the row again %d times, want %d", n, want)
			}
		})
	}
}

// waitForLockWait returns once a session is waiting for a lock in a
// statement on table.
func waitForLockWait(t *testing.T, dsn, table string) {
	t.Helper()
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, dsn)
	ok(t, err)
	defer conn.Close(context.Background())
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var waiting bool
		err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND query LIKE 'WITH live AS%' AND position($1 in query) > 0)`, table).Scan(&waiting)
		ok(t, err)
		if waiting {
			return
		}
	}
	t.Fatal("Reserve never waited for the competitor's row lock")
}

// TestConcurrentReservesAlwaysDecide hammers one key per round with many
// reservers released at once through two stores (two pools: two
// instances), on a new key and on an expired one to take over. Whatever
// the interleaving, every Reserve must get a definite answer: exactly one
// Acquired per round and Conflict for the rest, never an error or an empty
// result.
func TestConcurrentReservesAlwaysDecide(t *testing.T) {
	dsn := pgtest.Require(t)
	table := pgtest.Table(t, dsn)
	hammer(t, 60,
		openStore(t, testPool(t, dsn, 12), postgres.Options{Table: table, CreateTable: true}),
		openStore(t, testPool(t, dsn, 12), postgres.Options{Table: table, CreateTable: true}))
}

// hammer runs rounds of racers reserving one key at once through stores,
// every other round on an expired record to take over, and fails unless
// each round has exactly one Acquired and Conflict for the rest.
func hammer(t *testing.T, rounds int, stores ...*postgres.Store) {
	const (
		racers  = 48
		ttlUsed = 30 * time.Millisecond
	)
	ctx := t.Context()
	for round := range rounds {
		key := storage.Key{Scope: "hammer", ID: fmt.Sprint(round)}
		takeover := round%2 == 1
		if takeover {
			completed(t, stores[0], key, ttlUsed)
			// Expired once Get no longer finds it, by the server's clock.
			testutil.Eventually(t, 10*time.Second, "the record to expire", func() bool {
				_, err := stores[0].Get(ctx, key, false)
				return errors.Is(err, storage.ErrNotFound)
			})
		}
		res := make([]storage.Reservation, racers)
		errs := make([]error, racers)
		var ready, done sync.WaitGroup
		start := make(chan struct{})
		for i := range racers {
			ready.Add(1)
			done.Go(func() {
				ready.Done()
				<-start
				res[i], errs[i] = stores[i%len(stores)].Reserve(ctx, key, fpA, time.Minute)
			})
		}
		ready.Wait()
		close(start)
		done.Wait()

		acquired := 0
		for i := range racers {
			switch {
			case errs[i] != nil:
				t.Fatalf("round %d (takeover %v): racer %d: %v", round, takeover, i, errs[i])
			case res[i].Outcome == storage.Acquired:
				acquired++
			case res[i].Outcome != storage.Conflict:
				t.Fatalf("round %d (takeover %v): racer %d got %v, want conflict", round, takeover, i, res[i].Outcome)
			}
		}
		if acquired != 1 {
			t.Fatalf("round %d (takeover %v): %d racers acquired, want exactly 1", round, takeover, acquired)
		}
	}
	var fallbacks, retries, serialization int64
	for _, s := range stores {
		fallbacks += s.Fallbacks()
		retries += s.Retries()
		serialization += s.SerializationFailures()
	}
	t.Logf("%d reservations read the row in a second statement, %d rounds were rolled back and run again (%d serialization failures, %d deadlocks)",
		fallbacks, retries, serialization, retries-serialization)
}

// TestReplayAndConflictWriteNothing checks that answering a known key
// neither locks nor writes its row: a row lock would set the row's xmax and
// make every replay a writing transaction, waiting for its WAL flush and
// queueing behind concurrent replays of the same key.
func TestReplayAndConflictWriteNothing(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.Require(t)
	s := newStore(t, postgres.Options{})
	done := storage.Key{Scope: "readonly", ID: "done"}
	completed(t, s, done, time.Hour)
	running := storage.Key{Scope: "readonly", ID: "running"}
	acquire(t, s, running, fpA, time.Hour)

	conn, err := pgx.Connect(ctx, dsn)
	ok(t, err)
	defer conn.Close(context.Background())
	xmax := func(key storage.Key) string {
		var x string
		ok(t, conn.QueryRow(ctx, `SELECT xmax::text FROM `+s.Table()+` WHERE scope = $1 AND key = $2`, key.Scope, key.ID).Scan(&x))
		return x
	}
	// A completion locks its row before it writes it (SKIP LOCKED, see
	// statements.complete), and the new version keeps that lock's xmax:
	// what counts is that no Reserve changes it.
	xmax0 := map[storage.Key]string{done: xmax(done), running: xmax(running)}
	if x := xmax0[running]; x != "0" {
		t.Fatalf("running: xmax %s before any Reserve", x)
	}
	for range 3 {
		wantOutcome(t, s, done, fpA, storage.Replay)
		wantOutcome(t, s, done, fpB, storage.Mismatch)
		wantOutcome(t, s, running, fpA, storage.Conflict)
		wantOutcome(t, s, running, fpB, storage.Mismatch)
	}
	for _, key := range []storage.Key{done, running} {
		if x := xmax(key); x != xmax0[key] {
			t.Errorf("%s: xmax %s after replays and conflicts, %s before: they locked the row", key.ID, x, xmax0[key])
		}
	}
}
