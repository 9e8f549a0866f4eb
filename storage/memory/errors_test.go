package memory_test

import (
	"errors"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/memory"
)

// TestNoMemoryStoreErrorIsUnavailable: the memory store is always there,
// so none of its errors may let the Caddy module's fail_open pass a
// request on: full stores, full scopes and invalid calls fail closed.
func TestNoMemoryStoreErrorIsUnavailable(t *testing.T) {
	ctx := t.Context()
	s := memory.New(memory.Options{MaxKeys: 2, MaxKeysPerScope: 1})
	defer s.Close()
	fill(t, s, 1, time.Minute)
	_, scopeFull := s.Reserve(ctx, key(1), fp, time.Minute)
	if _, err := s.Reserve(ctx, storage.Key{Scope: "other", ID: "1"}, fp, time.Minute); err != nil {
		t.Fatal(err)
	}
	_, full := s.Reserve(ctx, storage.Key{Scope: "third", ID: "1"}, fp, time.Minute)
	_, zeroLease := s.Reserve(ctx, key(2), fp, 0)
	for what, tt := range map[string]struct{ err, want error }{
		"full scope":  {scopeFull, storage.ErrScopeFull},
		"full store":  {full, storage.ErrFull},
		"zero lease":  {zeroLease, storage.ErrInvalid},
		"status 42":   {s.Complete(ctx, key(0), 1, &storage.Response{Status: 42}, time.Hour), storage.ErrInvalid},
		"zero ttl":    {s.Complete(ctx, key(0), 1, &storage.Response{Status: 200}, 0), storage.ErrInvalid},
		"zero renew":  {s.Renew(ctx, key(0), 1, 0), storage.ErrInvalid},
		"lease lost":  {s.Release(ctx, key(0), 1), storage.ErrLeaseLost},
		"no such key": {s.Delete(ctx, key(9)), storage.ErrNotFound},
	} {
		if !errors.Is(tt.err, tt.want) || storage.Unavailable(tt.err) || errors.Is(tt.err, storage.ErrUnavailable) {
			t.Errorf("%s: %v, want %v and not unavailable", what, tt.err, tt.want)
		}
	}
}
