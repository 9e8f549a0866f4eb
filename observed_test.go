package idempotency

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/memory"
)

// TestObservedStoreSeesOptionalInterfaces: an observed store does not hide what the store
// can do beyond storage.Store (the wrapper it replaced did): the memory
// store notifies waiters and finds records by key hash, and a store that
// cannot makes Wait say so.
func TestObservedStoreSeesOptionalInterfaces(t *testing.T) {
	k, _ := testKeeper(t, "keeper-test")
	if k.store.waiter == nil || k.store.finder == nil {
		t.Fatalf("waiter %v, finder %v: the memory store is both", k.store.waiter, k.store.finder)
	}
	plain := observe(struct{ storage.Store }{memory.New(memory.Options{})}, "keeper-test", nil)
	if err := plain.Wait(context.Background(), storage.Key{Scope: "s", ID: "k"}, time.Millisecond); !errors.Is(err, errCannotWait) {
		t.Fatalf("Wait on a store that cannot notify: %v", err)
	}
	if recs, err := plain.GetByHash(context.Background(), "00", false); recs != nil || err != nil {
		t.Fatalf("GetByHash on a store that cannot: %v %v", recs, err)
	}
}
