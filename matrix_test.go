package idempotency

import (
	"encoding/json"
	"maps"
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
// backend tests use too; a subtest whose server does not answer is
// skipped, or failed under CI=true.

// testStore is one store opened for one subtest: a namespace of its own (a
// memory store, a Redis key prefix, a PostgreSQL table) to provision
// handlers on.
type testStore struct {
	name   string
	shared bool
	// storage returns the storage config of the namespace; pool > 0 gives
	// the same namespace through a client or pool of its own, as Caddy
	// instance number pool would have.
	storage func(pool int) map[string]any
	// forget deletes the namespace's records behind the handlers' back;
	// nil for memory.
	forget func(t *testing.T)
}

// kind is a row of the matrix: how to open a backend for a subtest.
type kind struct {
	name   string
	shared bool // several Caddy instances can share it (not memory)
	open   func(t *testing.T) *testStore
	// unreachable is a storage config pointing where nothing listens
	// (shared backends only); it needs no server.
	unreachable json.RawMessage
}

// kinds are the rows of the public backend matrix (backendtest.Kinds).
var kinds = func() []kind {
	var out []kind
	for _, k := range backendtest.Kinds {
		out = append(out, kind{name: k.Name, shared: k.Shared, unreachable: k.Unreachable, open: func(t *testing.T) *testStore {
			n := k.Open(t)
			return &testStore{storage: n.Storage, forget: n.Forget}
		}})
	}
	return out
}()

// matrix is the backends a scenario runs on.
type matrix struct {
	t     *testing.T
	kinds []kind
}

// backends is every backend: memory, redis, postgres.
func backends(t *testing.T) matrix { return matrix{t, kinds} }

// sharedBackends is the backends several Caddy instances can share:
// redis, postgres.
func sharedBackends(t *testing.T) matrix {
	var shared []kind
	for _, k := range kinds {
		if k.shared {
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
		m.t.Run(k.name, func(t *testing.T) {
			b := k.open(t)
			b.name, b.shared = k.name, k.shared
			scenario(t, b)
		})
	}
}

// runUnreachable runs scenario once per backend with a storage config
// that points where nothing listens.
func (m matrix) runUnreachable(scenario func(t *testing.T, storage json.RawMessage)) {
	m.t.Helper()
	for _, k := range m.kinds {
		m.t.Run(k.name, func(t *testing.T) { scenario(t, k.unreachable) })
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

// instance provisions h on the namespace as Caddy instance n (1, 2, ...)
// would be: same records, a client or pool of its own.
func (b *testStore) instance(t *testing.T, h *Handler, n int) *Handler {
	t.Helper()
	if !b.shared || n < 1 {
		t.Fatalf("instance %d of %s: only shared backends have instances, counted from 1", n, b.name)
	}
	h.StorageRaw = b.config(t, n, "")
	return provision(t, h)
}

// config is the storage JSON of the namespace for pool, with extra.
func (b *testStore) config(t *testing.T, pool int, extra string) json.RawMessage {
	t.Helper()
	cfg := b.storage(pool)
	if extra != "" {
		var more map[string]any
		if err := json.Unmarshal([]byte("{"+extra+"}"), &more); err != nil {
			t.Fatalf("storage options %s: %v", extra, err)
		}
		maps.Copy(cfg, more)
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}
