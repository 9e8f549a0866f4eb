package postgres_test

import (
	"math"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

// TestHugeDurationsSaturate passes math.MaxInt64 nanoseconds wherever the
// store takes a duration (a lock wait too, which PostgreSQL's lock_timeout
// cannot hold and the store cuts to what it can): the arithmetic saturates at MaxDuration, so a
// lease that long is live (a second request conflicts, instead of running
// too), a record kept that long replays, and the times read back lie about
// MaxDuration ahead, never in the past and never an SQL error.
func TestHugeDurationsSaturate(t *testing.T) {
	const huge = time.Duration(math.MaxInt64)
	s := newStore(t, postgres.Options{Timeout: huge, LapsedGrace: huge, LockWait: huge, CleanupInterval: -1})
	ctx := t.Context()
	far := func(what string, at time.Time) {
		t.Helper()
		if want := time.Now().Add(postgres.MaxDuration); at.Before(want.Add(-time.Hour)) || at.After(want.Add(time.Hour)) {
			t.Errorf("%s = %v, want about %v", what, at, want)
		}
	}

	running := storage.Key{Scope: "huge", ID: "running"}
	tok := acquire(t, s, running, fpA, huge)
	wantOutcome(t, s, running, fpA, storage.Conflict)
	ok(t, s.Renew(ctx, running, tok, huge))
	batch := []storage.Renewal{{Key: running, Token: tok, Lease: huge}}
	if err := s.RenewBatch(ctx, batch); err != nil || batch[0].Err != nil {
		t.Fatalf("RenewBatch of a lease of %v: %v, %v", huge, err, batch[0].Err)
	}
	rec, err := s.Get(ctx, running, false)
	ok(t, err)
	far("the lease's end", rec.ExpiresAt)

	done := storage.Key{Scope: "huge", ID: "done"}
	ok(t, s.Complete(ctx, done, acquire(t, s, done, fpA, huge), &storage.Response{Status: 201}, huge))
	res, err := s.Reserve(ctx, done, fpA, huge)
	if err != nil || res.Outcome != storage.Replay {
		t.Fatalf("Reserve of a record kept %v: %v, %v; want replay", huge, res.Outcome, err)
	}
	far("the record's expiry", res.Record.ExpiresAt)

	if _, err := s.CleanupNow(ctx); err != nil {
		t.Fatalf("cleanup with a grace of %v: %v", huge, err)
	}
	if _, err := s.GetByHash(ctx, done.Hash(), false); err != nil {
		t.Fatalf("GetByHash with a timeout of %v: %v", huge, err)
	}
	wantOutcome(t, s, running, fpA, storage.Conflict) // cleanup left the lease alone
}
