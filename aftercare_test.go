package idempotency

import (
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/memory"
)

func newTestAftercare(t *testing.T) (*aftercare, *memory.Store) {
	store := memory.New(memory.Options{})
	t.Cleanup(func() { store.Close() })
	return &aftercare{store: store, logger: zap.NewNop(), hold: func() (func(), bool) { return func() {}, true }}, store
}

// A retry may meet the abandoned reservation a moment before the worker
// releases it; it must still be told to look again.
func TestReclaimAfterTheWorkerReleasedTheGhost(t *testing.T) {
	a, store := newTestAftercare(t)
	key := storage.Key{Scope: "s", ID: "k"}
	res, err := store.Reserve(t.Context(), key, []byte("fp"), time.Minute) // the ghost
	if err != nil {
		t.Fatal(err)
	}
	a.add(&chore{kind: choreAbandon, key: key, token: res.Token, until: time.Now().Add(time.Minute)})
	testutil.Eventually(t, 5*time.Second, "the worker to release the ghost", func() bool {
		_, err := store.Get(t.Context(), key, false)
		return err != nil
	})
	if !a.reclaim(key) {
		t.Fatal("reclaim right after the worker released the ghost: false, want true (look again)")
	}
	if a.reclaim(storage.Key{Scope: "s", ID: "other"}) {
		t.Fatal("reclaim of a key never abandoned: true")
	}
	time.Sleep(ghostSettle + 100*time.Millisecond)
	if a.reclaim(key) {
		t.Fatal("reclaim long after the abandon finished: true, want false")
	}
}

func TestReclaimReleasesAPendingGhost(t *testing.T) {
	a, store := newTestAftercare(t)
	key := storage.Key{Scope: "s", ID: "k"}
	res, err := store.Reserve(t.Context(), key, []byte("fp"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// Queued but not started: the worker is held back by a long pause.
	a.abandoned = map[storage.Key]*chore{key: {kind: choreAbandon, key: key, token: res.Token, until: time.Now().Add(time.Minute)}}
	if !a.reclaim(key) {
		t.Fatal("reclaim of a pending ghost: false")
	}
	if _, err := store.Get(t.Context(), key, false); err == nil {
		t.Fatal("the ghost is still there")
	}
}
