package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/caddy-idempotency/caddy-idempotency/internal/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

// blockedReserve starts a reserve of a key another transaction is
// inserting: it is the store's batch out (a request alone sends its own
// statement) until release ends that transaction, and every reserve made
// meanwhile queues for the next batch. wait returns the blocked reserve's
// error.
func blockedReserve(t *testing.T, s *postgres.Store, dsn string) (release func(), wait func() error) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	ok(t, err)
	tx, err := conn.Begin(ctx)
	ok(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO `+s.Table()+` (scope, key, fingerprint, state, token, created_at, expires_at)
		VALUES ('block', 'leader', '\x00', 1, 1, now(), now() + interval '1 minute')`)
	ok(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := s.Reserve(ctx, storage.Key{Scope: "block", ID: "leader"}, fpA, time.Minute)
		done <- err
	}()
	// The reserve is out once the server shows it waiting for the lock.
	pgtest.WaitForLockWait(t, dsn, s.Table())
	return heldBy(ctx, tx, conn, done)
}

// heldBy returns what ends tx, letting the statement it holds go on, and
// what waits for that statement's result on done.
func heldBy(ctx context.Context, tx pgx.Tx, conn *pgx.Conn, done <-chan error) (release func(), wait func() error) {
	return func() {
			tx.Rollback(ctx)
			conn.Close(ctx)
		}, func() error {
			return <-done
		}
}

// TestReservesWaitingTogetherShareOneBatch sends 16 keys, each reserved
// twice at once, in one batch (one commit): each key has exactly one
// winner, the other request in the same batch sees its row in flight;
// then the 16 completions go out together, and every key replays.
func TestReservesWaitingTogetherShareOneBatch(t *testing.T) {
	dsn := pgtest.Require(t)
	s := newStore(t, postgres.Options{CreateTable: true})
	completed(t, s, storage.Key{Scope: "warm", ID: "up"}, time.Hour) // the table exists
	const keys = 16
	release, blocked := blockedReserve(t, s, dsn)
	var mu sync.Mutex
	won := map[string][]storage.Token{}
	conflicts := map[string]int{}
	var wg sync.WaitGroup
	for i := range 2 * keys {
		wg.Go(func() {
			key := storage.Key{Scope: "batch", ID: fmt.Sprint(i % keys)}
			res, err := s.Reserve(t.Context(), key, fpA, time.Minute)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Errorf("reserve %s: %v", key.ID, err)
			case res.Outcome == storage.Acquired:
				won[key.ID] = append(won[key.ID], res.Token)
			case res.Outcome == storage.Conflict:
				conflicts[key.ID]++
			default:
				t.Errorf("reserve %s: %v", key.ID, res.Outcome)
			}
		})
	}
	for s.Queued() < 2*keys {
		time.Sleep(time.Millisecond)
	}
	release()
	if err := blocked(); err != nil {
		t.Fatalf("the blocked reserve: %v", err)
	}
	wg.Wait()
	if _, largest, _, _ := s.BatchStats(); largest != 2*keys {
		t.Fatalf("the largest batch of reserves held %d statements, want all %d", largest, 2*keys)
	}
	for i := range keys {
		id := fmt.Sprint(i)
		if len(won[id]) != 1 || conflicts[id] != 1 {
			t.Fatalf("key %s: %d winners, %d conflicts; want one of each", id, len(won[id]), conflicts[id])
		}
	}

	// The completions queue behind one held back by a row lock too.
	releaseC, blockedC := blockedComplete(t, s, dsn)
	for id, toks := range won {
		wg.Go(func() {
			key := storage.Key{Scope: "batch", ID: id}
			if err := s.Complete(t.Context(), key, toks[0], &storage.Response{Status: 201, Body: []byte(id)}, time.Hour); err != nil {
				t.Errorf("complete %s: %v", id, err)
			}
		})
	}
	for s.Queued() < keys {
		time.Sleep(time.Millisecond)
	}
	releaseC()
	if err := blockedC(); err != nil {
		t.Fatalf("the blocked completion: %v", err)
	}
	wg.Wait()
	if _, _, _, largest := s.BatchStats(); largest != keys {
		t.Fatalf("the largest batch of completions held %d statements, want all %d", largest, keys)
	}
	for id := range won {
		res, err := s.Reserve(t.Context(), storage.Key{Scope: "batch", ID: id}, fpA, time.Minute)
		if err != nil || res.Outcome != storage.Replay || string(res.Record.Response.Body) != id {
			t.Fatalf("key %s after its batch completed: %v %v, want its replay", id, res.Outcome, err)
		}
	}
}

// TestARefusedBatchRunsEachStatementAlone: a statement the server refuses
// rolls its batch back; every other statement of it then runs alone and
// succeeds, and the refused one gets the error it gets alone (never an
// outage, so fail_open does not apply).
func TestARefusedBatchRunsEachStatementAlone(t *testing.T) {
	dsn := pgtest.Require(t)
	s := newStore(t, postgres.Options{CreateTable: true})
	completed(t, s, storage.Key{Scope: "warm", ID: "up"}, time.Hour)
	pgtest.Exec(t, dsn, `ALTER TABLE `+s.Table()+` ADD CONSTRAINT refuse_bad CHECK (key <> 'bad')`)
	release, blocked := blockedReserve(t, s, dsn)
	errs := make([]error, 4)
	outcomes := make([]storage.Outcome, 4)
	var wg sync.WaitGroup
	for i, id := range []string{"a", "b", "bad", "c"} {
		wg.Go(func() {
			res, err := s.Reserve(t.Context(), storage.Key{Scope: "refused", ID: id}, fpA, time.Minute)
			outcomes[i], errs[i] = res.Outcome, err
		})
	}
	for s.Queued() < 4 {
		time.Sleep(time.Millisecond)
	}
	release()
	if err := blocked(); err != nil {
		t.Fatalf("the blocked reserve: %v", err)
	}
	wg.Wait()
	if _, largest, _, _ := s.BatchStats(); largest != 4 {
		t.Fatalf("the batch held %d statements, want 4", largest)
	}
	for i, id := range []string{"a", "b", "bad", "c"} {
		if id == "bad" {
			var pgErr *pgconn.PgError
			if !errors.As(errs[i], &pgErr) || pgErr.Code != "23514" || storage.Unavailable(errs[i]) {
				t.Errorf("the refused statement: %v, want its own check violation, not an outage", errs[i])
			}
			continue
		}
		if errs[i] != nil || outcomes[i] != storage.Acquired {
			t.Errorf("key %s of the refused batch: %v %v, want it acquired on its own", id, outcomes[i], errs[i])
		}
	}
}

// blockedComplete holds a completion back on a row another transaction
// has locked, as blockedReserve does a reserve.
func blockedComplete(t *testing.T, s *postgres.Store, dsn string) (release func(), wait func() error) {
	t.Helper()
	ctx := context.Background()
	key := storage.Key{Scope: "block", ID: "completer"}
	tok := acquire(t, s, key, fpA, time.Minute)
	conn, err := pgx.Connect(ctx, dsn)
	ok(t, err)
	tx, err := conn.Begin(ctx)
	ok(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM `+s.Table()+` WHERE scope = 'block' AND key = 'completer' FOR UPDATE`)
	ok(t, err)
	done := make(chan error, 1)
	go func() { done <- s.Complete(ctx, key, tok, &storage.Response{Status: 201}, time.Hour) }()
	pgtest.WaitForLockWait(t, dsn, s.Table())
	return heldBy(ctx, tx, conn, done)
}
