package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

// TestCompleteRefusesResponsesThatCannotBeReplayed: a nil response or a
// status outside 200-999 (an upstream answering "HTTP/1.1 042") is the
// caller's mistake, refused before any I/O (the store here has no
// server), and never written: the lease stays its owner's.
func TestCompleteRefusesResponsesThatCannotBeReplayed(t *testing.T) {
	invalid := map[string]*storage.Response{
		"nil":         nil,
		"status 0":    {},
		"status 42":   {Status: 42},
		"status 100":  {Status: 100},
		"status 199":  {Status: 199},
		"status 1000": {Status: 1000},
		"status -1":   {Status: -1},
	}
	offline := openStore(t, testPool(t, "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=5", 1), postgres.Options{CreateTable: true})
	s := newStore(t, postgres.Options{})
	ctx := t.Context()
	key := storage.Key{Scope: "invalid", ID: "k"}
	tok := acquire(t, s, key, fpA, time.Minute)
	for name, resp := range invalid {
		began := time.Now()
		err := offline.Complete(ctx, key, 1, resp, time.Hour)
		if !errors.Is(err, storage.ErrInvalid) || storage.Unavailable(err) {
			t.Errorf("%s, with the server down: %v, want storage.ErrInvalid", name, err)
		}
		if took := time.Since(began); took > time.Second {
			t.Errorf("%s: refused after %v: it tried to reach the server", name, took)
		}
		if err := s.Complete(ctx, key, tok, resp, time.Hour); !errors.Is(err, storage.ErrInvalid) {
			t.Errorf("%s: %v, want storage.ErrInvalid", name, err)
		}
	}
	if o := outcome(t, s, key, fpA); o != storage.Conflict {
		t.Fatalf("after the refused completions: %v, want the lease still in flight", o)
	}
	for _, status := range []int{200, 999} {
		key := storage.Key{Scope: "invalid", ID: fmt.Sprint(status)}
		ok(t, s.Complete(ctx, key, acquire(t, s, key, fpA, time.Minute), &storage.Response{Status: status}, time.Hour))
		res, err := s.Reserve(ctx, key, fpA, time.Minute)
		if err != nil || res.Outcome != storage.Replay || res.Record.Response.Status != status {
			t.Fatalf("status %d: %v, %v; want it replayed", status, res.Outcome, err)
		}
	}
}

// corruptions are rows nobody but another program (or a hand-edited table)
// writes: each must read as storage.ErrCorrupt, on every path.
var corruptions = map[string]string{
	"status 42":                   `status = 42`,
	"status 1000":                 `status = 1000`,
	"status NULL":                 `status = NULL`,
	"headers not decodable":       `headers = '\xff'`,
	"headers NULL":                `headers = NULL`,
	"headers with trailing bytes": `headers = '\x0000'`,
	"state 7":                     `state = 7`,
	"expires at infinity":         `expires_at = 'infinity'`,
}

// TestCorruptRowsAreErrorsOnEveryReadPath writes each corruption into a
// completed row and reads it every way the store does: Reserve (a
// replay), Get, GetByHash; and Reserve's second read, after a row
// committed past its snapshot (see TestReserveSeesRowCommittedAfterItsSnapshot).
// Each is an error wrapping storage.ErrCorrupt, never a panic and never an
// outage.
func TestCorruptRowsAreErrorsOnEveryReadPath(t *testing.T) {
	dsn := pgtest.Require(t)
	ctx := t.Context()
	for name, set := range corruptions {
		t.Run(name, func(t *testing.T) {
			// Reserve's second read waits on a competitor's row lock for
			// as long as the test takes to commit it.
			s := newStore(t, postgres.Options{CleanupInterval: -1, LockWait: patientLockWait})
			key := storage.Key{Scope: "corrupt", ID: "k"}
			completed(t, s, key, time.Hour)
			pgtest.Exec(t, dsn, `UPDATE `+s.Table()+` SET `+set)
			reads := map[string]func() error{
				"reserve": func() error { _, err := s.Reserve(ctx, key, fpA, time.Minute); return err },
				"get":     func() error { _, err := s.Get(ctx, key, true); return err },
				"get by hash": func() error {
					_, err := s.GetByHash(ctx, key.Hash(), true)
					return err
				},
				"reserve's second read": func() error { return reserveAfterACommit(t, dsn, s, set) },
			}
			for what, read := range reads {
				err := read()
				if !errors.Is(err, storage.ErrCorrupt) {
					t.Errorf("%s: %v, want storage.ErrCorrupt", what, err)
				}
				wantAnswered(t, what, err)
			}
		})
	}
}

// reserveAfterACommit has a competitor write a corrupt completed row (the
// corruption set) and commit once Reserve on the same key has taken its
// snapshot, so that Reserve reads the row in its second statement, and
// returns Reserve's error.
func reserveAfterACommit(t *testing.T, dsn string, s *postgres.Store, set string) error {
	ctx := t.Context()
	key := storage.Key{Scope: "corrupt", ID: "late"}
	competitor, err := pgx.Connect(ctx, dsn)
	ok(t, err)
	defer competitor.Close(context.Background())
	tx, err := competitor.Begin(ctx)
	ok(t, err)
	defer tx.Rollback(context.Background())
	_, err = tx.Exec(ctx, `INSERT INTO `+s.Table()+` (scope, key, fingerprint, state, token, status, headers, body, created_at, expires_at)
VALUES ($1, $2, $3, 2, 0, 201, '\x00', 'done', now(), now() + interval '1 hour')`, key.Scope, key.ID, fpA)
	ok(t, err)
	_, err = tx.Exec(ctx, `UPDATE `+s.Table()+` SET `+set+` WHERE key = 'late'`)
	ok(t, err)
	before := s.Fallbacks()
	done := make(chan error, 1)
	go func() {
		_, err := s.Reserve(ctx, key, fpA, time.Minute)
		done <- err
	}()
	waitForLockWait(t, dsn, s.Table())
	ok(t, tx.Commit(ctx))
	err = <-done
	if s.Fallbacks() == before {
		t.Errorf("Reserve did not read the row in a second statement: the interleaving did not happen")
	}
	pgtest.Exec(t, dsn, `DELETE FROM `+s.Table()+` WHERE key = 'late'`)
	return err
}
