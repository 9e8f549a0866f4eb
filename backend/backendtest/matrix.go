package backendtest

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
)

// The backend matrix: the backends a handler scenario runs on, each a
// Kind that opens a namespace of its own for one test (a memory store, a
// Redis key prefix, a PostgreSQL table). The handler's scenarios run
// over Kinds; a third party's backend tests take the same rows, or add
// a Kind of their own for the same scenarios of theirs. Redis and
// PostgreSQL are the servers IDEMPOTENCY_REDIS_URL and
// IDEMPOTENCY_POSTGRES_DSN name (bin/testservers starts private ones); a
// test whose server does not answer is skipped, or failed under CI=true.

// Kind is a row of the matrix: how to open a backend for a test.
type Kind struct {
	Name   string
	Shared bool // several Caddy instances can share it (not memory)
	Open   func(t *testing.T) *Namespace
	// Unreachable is a storage config pointing where nothing listens
	// (shared backends only); it needs no server.
	Unreachable json.RawMessage
}

// Namespace is a backend opened for one test: records of its own.
type Namespace struct {
	// Storage returns the storage config of the namespace (the members
	// of the handler's storage object); pool > 0 gives the same namespace
	// through a client or pool of its own, as Caddy instance number pool
	// would have.
	Storage func(pool int) map[string]any
	// Forget deletes the namespace's records behind the handlers' back;
	// nil for memory.
	Forget func(t *testing.T)
}

// Kinds are the built-in backends: memory, redis, postgres.
var Kinds = []Kind{
	{Name: "memory", Open: OpenMemory},
	{
		Name: "redis", Shared: true, Open: OpenRedis,
		Unreachable: json.RawMessage(`{"backend":"redis","url":"redis://127.0.0.1:1/0","timeout":"500ms","key_prefix":"idempotency-test:unreachable:"}`),
	},
	{
		Name: "postgres", Shared: true, Open: OpenPostgres,
		Unreachable: json.RawMessage(`{"backend":"postgres","dsn":"postgres://postgres@127.0.0.1:1/test?sslmode=disable","table":"unreachable","timeout":"500ms"}`),
	},
}

// nextMaxKeys makes memory stores of their own: handlers share a memory
// store when their storage configs are the same.
var nextMaxKeys atomic.Int64

// OpenMemory is a memory store of the test's own.
func OpenMemory(*testing.T) *Namespace {
	maxKeys := 800_000_000 + nextMaxKeys.Add(1)
	return &Namespace{
		Storage: func(int) map[string]any {
			return map[string]any{"backend": "memory", "max_keys": maxKeys}
		},
	}
}

// OpenRedis is a fresh key prefix on the Redis of the tests; its keys are
// deleted when the test ends. Instances get a client of their own through
// another pool_size.
func OpenRedis(t *testing.T) *Namespace {
	t.Helper()
	addr := redistest.Addr()
	redistest.Require(t, addr)
	prefix := RedisPrefix()
	n := &Namespace{
		Storage: func(pool int) map[string]any {
			cfg := map[string]any{"backend": "redis", "url": "redis://" + addr + "/0", "key_prefix": prefix}
			if pool > 0 {
				cfg["pool_size"] = 10 + pool
			}
			return cfg
		},
		Forget: func(t *testing.T) { DeleteRedisPrefix(t, addr, prefix) },
	}
	t.Cleanup(func() { n.Forget(t) })
	return n
}

// OpenPostgres is a fresh table on the PostgreSQL of the tests, dropped
// when the test ends. Pools default to 8 connections, not pgx's one per
// CPU: on a big machine, test packages running in parallel would
// otherwise exhaust the server's connections. Instances get a pool of
// their own through another max_conns.
func OpenPostgres(t *testing.T) *Namespace {
	t.Helper()
	dsn := pgtest.Require(t)
	table := pgtest.Table(t, dsn)
	return &Namespace{
		Storage: func(pool int) map[string]any {
			cfg := map[string]any{"backend": "postgres", "dsn": dsn, "table": table, "max_conns": 8}
			if pool > 0 {
				cfg["max_conns"] = 2 + pool
			}
			return cfg
		},
		Forget: func(t *testing.T) { pgtest.Exec(t, dsn, "DELETE FROM "+pgx.Identifier{table}.Sanitize()) },
	}
}

// RedisPrefix returns a key prefix no other test or run uses.
func RedisPrefix() string {
	return "idempotency-test:" + redistest.RandomHex(6) + ":"
}

// DeleteRedisPrefix deletes every key under prefix on the Redis at addr.
func DeleteRedisPrefix(t testing.TB, addr, prefix string) {
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
