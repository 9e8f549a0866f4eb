package idempotency

import (
	"encoding/json"
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/backend/backendtest"
)

// The backend matrix: a handler scenario runs once per store, as subtests
// named memory, redis and postgres, with the same assertions on each.
//
//	backends(t).run(func(t *testing.T, b *testStore) {
//		h := b.handler(t, &Handler{})
//		...
//	})
//
// The rows are backendtest.Kinds, the public matrix a third party's
// backend tests use too, each opening a backendtest.Namespace; a subtest
// whose server does not answer is skipped, or failed under CI=true. The
// scenarios every backend must pass, through the handler's public
// surface only, are backendtest.Run's (TestBackends); those here reach
// into the handler.

// testStore is one store opened for one subtest: the row of the matrix it
// comes from (Name, Shared) and a namespace of its own (a memory store, a
// Redis key prefix, a PostgreSQL table) to provision handlers on.
type testStore struct {
	backendtest.Kind
	*backendtest.Namespace
}

// matrix is the backends a scenario runs on.
type matrix struct {
	t     *testing.T
	kinds []backendtest.Kind
}

// backends is every backend: memory, redis, postgres.
func backends(t *testing.T) matrix { return matrix{t, backendtest.Kinds} }

// sharedBackends is the backends several Caddy instances can share:
// redis, postgres.
func sharedBackends(t *testing.T) matrix {
	var shared []backendtest.Kind
	for _, k := range backendtest.Kinds {
		if k.Shared {
			shared = append(shared, k)
		}
	}
	return matrix{t, shared}
}

// run runs scenario once per backend, each a subtest on a namespace of
// its own.
func (m matrix) run(scenario func(t *testing.T, b *testStore)) {
	m.t.Helper()
	for _, k := range m.kinds {
		m.t.Run(k.Name, func(t *testing.T) { scenario(t, &testStore{k, k.Open(t)}) })
	}
}

// runUnreachable runs scenario once per backend with a storage config
// that points where nothing listens.
func (m matrix) runUnreachable(scenario func(t *testing.T, storage json.RawMessage)) {
	m.t.Helper()
	for _, k := range m.kinds {
		m.t.Run(k.Name, func(t *testing.T) { scenario(t, k.Unreachable) })
	}
}

// handler provisions h on the namespace.
func (b *testStore) handler(t *testing.T, h *Handler) *Handler {
	t.Helper()
	return b.handlerWith(t, h, "")
}

// handlerWith is handler with extra members of the storage object
// (`"replay_cache":{"max_entries":100}`).
func (b *testStore) handlerWith(t *testing.T, h *Handler, extra string) *Handler {
	t.Helper()
	h.StorageRaw = b.config(t, 0, extra)
	return provision(t, h)
}

// config is the storage JSON of the namespace for pool, with extra.
func (b *testStore) config(t *testing.T, pool int, extra string) json.RawMessage {
	t.Helper()
	raw, err := json.Marshal(b.Config(t, pool, "", extra)["storage"])
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// TestBackends runs the scenarios every storage backend must pass
// (backendtest.Run, the entry a third party's backend runs too) on each
// built-in backend.
func TestBackends(t *testing.T) {
	for _, k := range backendtest.Kinds {
		t.Run(k.Name, func(t *testing.T) { backendtest.Run(t, k) })
	}
}
