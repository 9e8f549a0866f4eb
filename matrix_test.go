package idempotency

import (
	"context"
	"encoding/json"
	"maps"
	"testing"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
)

// The backend matrix: a handler scenario runs once per store, as subtests
// named memory, redis and postgres, with the same assertions on each.
//
//	backends(t).run(func(t *testing.T, b *testStore) {
//		h := b.handler(t, &Handler{})
//		...
//	})
//
// Redis and PostgreSQL are the shared servers of internal/testkit/redistest and
// internal/testkit/pgtest; a subtest whose server does not answer is skipped, or
// failed under CI=true.

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

var kinds = []kind{
	{name: "memory", open: openMemory},
	{
		name: "redis", shared: true, open: openRedis,
		unreachable: json.RawMessage(`{"backend":"redis","url":"redis://127.0.0.1:1/0","timeout":"500ms","key_prefix":"idempotency-test:unreachable:"}`),
	},
	{
		name: "postgres", shared: true, open: openPostgres,
		unreachable: json.RawMessage(`{"backend":"postgres","dsn":"postgres://postgres@127.0.0.1:1/test?sslmode=disable","table":"unreachable","timeout":"500ms"}`),
	},
}

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

// openMemory is a memory store of the test's own (see isolated).
func openMemory(*testing.T) *testStore {
	maxKeys := 900_000_000 + nextMaxKeys.Add(1)
	return &testStore{
		storage: func(int) map[string]any {
			return map[string]any{"backend": "memory", "max_keys": maxKeys}
		},
	}
}

// openRedis is a fresh key prefix on the shared Redis; its keys are
// deleted when the test ends. Instances get a client of their own through
// another pool_size.
func openRedis(t *testing.T) *testStore {
	t.Helper()
	addr := redistest.Addr()
	redistest.Require(t, addr)
	prefix := redisPrefix()
	b := &testStore{
		storage: func(pool int) map[string]any {
			cfg := map[string]any{"backend": "redis", "url": "redis://" + addr + "/0", "key_prefix": prefix}
			if pool > 0 {
				cfg["pool_size"] = 10 + pool
			}
			return cfg
		},
		forget: func(t *testing.T) { deleteRedisPrefix(t, addr, prefix) },
	}
	t.Cleanup(func() { b.forget(t) })
	return b
}

// openPostgres is a fresh table on the shared PostgreSQL, dropped when the
// test ends. Pools default to 8 connections, not pgx's one per CPU: on a
// big machine, test packages running in parallel would otherwise exhaust
// the server's connections. Instances get a pool of their own through
// another max_conns.
func openPostgres(t *testing.T) *testStore {
	t.Helper()
	dsn := pgtest.Require(t)
	table := pgtest.Table(t, dsn)
	return &testStore{
		storage: func(pool int) map[string]any {
			cfg := map[string]any{"backend": "postgres", "dsn": dsn, "table": table, "max_conns": 8}
			if pool > 0 {
				cfg["max_conns"] = 2 + pool
			}
			return cfg
		},
		forget: func(t *testing.T) { pgtest.Exec(t, dsn, "DELETE FROM "+pgx.Identifier{table}.Sanitize()) },
	}
}

// redisPrefix returns a key prefix no other test or run uses.
func redisPrefix() string {
	return "idempotency-test:" + redistest.RandomHex(6) + ":"
}

// deleteRedisPrefix deletes every key under prefix on the Redis at addr.
func deleteRedisPrefix(t *testing.T, addr, prefix string) {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	ctx := context.Background()
	keys, err := c.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) > 0 {
		if err := c.Del(ctx, keys...).Err(); err != nil {
			t.Fatal(err)
		}
	}
}
