package idempotency

import (
	"context"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/storage/cache"
)

func TestReplayCacheCaddyfile(t *testing.T) {
	for _, backend := range []string{"redis", "postgres dsn"} {
		for in, want := range map[string]string{
			"replay_cache 5000":     `"replay_cache":{"max_entries":5000}`,
			"replay_cache 5000 30s": `"replay_cache":{"max_entries":5000,"ttl":30000000000}`,
		} {
			block := "storage " + strings.Fields(backend)[0] + " {\n" + in + "\n"
			if backend == "postgres dsn" {
				block += "dsn postgres://x@h/db\n"
			}
			h, err := cfParse(cfBlock(block + "}"))
			if err != nil {
				t.Fatalf("%s: %v", in, err)
			}
			if !strings.Contains(string(h.StorageRaw), want) {
				t.Errorf("%s %s: storage JSON %s lacks %s", backend, in, h.StorageRaw, want)
			}
		}
		for _, bad := range []string{"replay_cache", "replay_cache 0", "replay_cache x", "replay_cache 10 -1s", "replay_cache 10 1s 2"} {
			block := "storage " + strings.Fields(backend)[0] + " {\n" + bad + "\n}"
			if _, err := cfParse(cfBlock(block)); err == nil || !strings.Contains(err.Error(), "Testfile:") {
				t.Errorf("%s %q: err %v, want an error with file and line", backend, bad, err)
			}
		}
	}
}

// A cached replay needs no store: it survives the record vanishing from
// Redis (a FLUSH by someone else) until the cache entry's ttl ends.
func TestRedisReplayCacheServesReplaysWithoutTheStore(t *testing.T) {
	addr := sharedRedis(t)
	prefix := redisPrefix()
	h := onRedis(t, &Handler{}, addr, prefix, `,"replay_cache":{"max_entries":100,"ttl":300000000}`)
	up := &upstream{}
	serve(h, up, request("cached", "{}"))
	if w := serve(h, up, request("cached", "{}")); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatal("no replay")
	}
	deleteRedisPrefix(t, addr, prefix) // the record is gone from Redis
	if w := serve(h, up, request("cached", "{}")); w.Header().Get("Idempotent-Replayed") != "true" || w.Body.String() != `{"order":42}` {
		t.Fatalf("cached replay after the record left Redis: %d %q", w.Code, w.Body.String())
	}
	if w := serve(h, up, request("cached", `{"other":1}`)); w.Code != 422 {
		t.Fatalf("other request against the cached record: %d, want 422", w.Code)
	}
	time.Sleep(500 * time.Millisecond) // past the cache ttl
	if w := serve(h, up, request("cached", "{}")); w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatal("replayed from the cache after its ttl")
	}
	if up.calls.Load() != 2 {
		t.Fatalf("upstream ran %d times, want 2", up.calls.Load())
	}
}

func TestPostgresReplayCacheIsUsed(t *testing.T) {
	dsn := pgtest.Require(t)
	h := onPostgres(t, &Handler{}, dsn, pgtest.Table(t, dsn), `"replay_cache":{"max_entries":100}`)
	up := &upstream{}
	serve(h, up, request("cached", "{}"))
	serve(h, up, request("cached", "{}")) // fills the cache
	pgtest.Exec(t, dsn, "DELETE FROM "+h.store.(*cache.Store).Unwrap().(interface{ Table() string }).Table())
	if w := serve(h, up, request("cached", "{}")); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("no cached replay: %d", w.Code)
	}
	if up.calls.Load() != 1 {
		t.Fatalf("upstream ran %d times, want 1", up.calls.Load())
	}
}

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
