package redis

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/storagetest"
)

// These tests use the shared Redis (redistest.Addr) under a key prefix of
// their own, so they never collide with other runs or packages; the ones
// that must be alone on a server start a private one.

// testPrefix returns a key prefix no other test uses.
func testPrefix() string {
	return "idempotency-test:" + redistest.RandomHex(6) + ":"
}

// newTestStore returns a store on the Redis at addr (which must answer),
// renewing on a client of its own as the Caddy module's does, closed when
// the test ends.
func newTestStore(t testing.TB, addr string, opts Options) *Store {
	t.Helper()
	redistest.Require(t, addr)
	if opts.KeyPrefix == "" {
		opts.KeyPrefix = testPrefix()
	}
	if opts.RenewClient == nil {
		renew, err := NewRenewClient(ClientOptions{URL: addr})
		if err != nil {
			t.Fatal(err)
		}
		opts.RenewClient = renew
	}
	s := New(goredis.NewClient(&goredis.Options{Addr: addr}), opts)
	t.Cleanup(func() { s.Close() })
	return s
}

// adminClient is a plain client for looking at what the store wrote.
func adminClient(t testing.TB, addr string) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	return c
}

func TestConformance(t *testing.T) {
	storagetest.Run(t, newTestStore(t, redistest.Addr(), Options{}))
}

func BenchmarkRedis(b *testing.B) {
	storagetest.Bench(b, newTestStore(b, redistest.Addr(), Options{}))
}

var fp = []byte("0123456789abcdef0123456789abcdef")

func textResponse(s string) *storage.Response {
	return &storage.Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte(s)}
}

func acquire(t *testing.T, s *Store, key storage.Key, lease time.Duration) storage.Token {
	t.Helper()
	res, err := s.Reserve(t.Context(), key, fp, lease)
	if err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("Reserve: %v %v, want acquired", res.Outcome, err)
	}
	return res.Token
}

func TestRecordsExpireNatively(t *testing.T) {
	addr := redistest.Addr()
	s := newTestStore(t, addr, Options{})
	admin := adminClient(t, addr)
	ctx := t.Context()
	key := storage.Key{Scope: "scope", ID: "ttl"}
	name := s.keyName(key)

	const lease = 10 * time.Second
	tok := acquire(t, s, key, lease)
	// In flight: the key outlives the lease (a lapsed owner may still
	// complete), by as long again and at least lapsedGrace, then goes.
	pttl := admin.PTTL(ctx, name).Val()
	if pttl <= lease || pttl > lease+lapsedGrace {
		t.Fatalf("in-flight PTTL %v, want in (%v, %v]", pttl, lease, lease+lapsedGrace)
	}
	// The PTTL read after a call is the time set, less what passed since
	// the call began (however long a busy machine took), to the
	// millisecond.
	start := time.Now()
	if err := s.Renew(ctx, key, tok, 2*lapsedGrace); err != nil {
		t.Fatal(err)
	}
	pttl = admin.PTTL(ctx, name).Val()
	if took := time.Since(start); pttl < 4*lapsedGrace-took-time.Millisecond || pttl > 4*lapsedGrace {
		t.Fatalf("PTTL %v after renewing for %v, %v ago: want %v less that", pttl, 2*lapsedGrace, took, 4*lapsedGrace)
	}

	const ttl = 5 * time.Second
	start = time.Now()
	if err := s.Complete(ctx, key, tok, textResponse("done"), ttl); err != nil {
		t.Fatal(err)
	}
	// Completed: the key lives exactly for the TTL.
	pttl = admin.PTTL(ctx, name).Val()
	if took := time.Since(start); pttl < ttl-took-time.Millisecond || pttl > ttl {
		t.Fatalf("completed PTTL %v, %v after completing for %v", pttl, took, ttl)
	}
	if fields := admin.HKeys(ctx, name).Val(); strings.Join(fields, ",") != "f,c,e,h,b,k" {
		t.Errorf("completed record fields %v, want f,c,e,h,b,k (no lease token t, no waiter mark; the token that completed it in k)", fields)
	}

	released := storage.Key{Scope: "scope", ID: "released"}
	if err := s.Release(ctx, released, acquire(t, s, released, lease)); err != nil {
		t.Fatal(err)
	}
	if n := admin.Exists(ctx, s.keyName(released)).Val(); n != 0 {
		t.Fatal("a released record is still in Redis")
	}
}

func TestKeyNamesCarryNoClientBytes(t *testing.T) {
	addr := redistest.Addr()
	prefix := testPrefix()
	s := newTestStore(t, addr, Options{KeyPrefix: prefix})
	admin := adminClient(t, addr)
	ctx := t.Context()
	ids := []string{"{brace}", "}{", "{a}:{b}", "plain", strings.Repeat("k", 255), "with space", "*?[]"}
	for _, id := range ids {
		key := storage.Key{Scope: "{scope}", ID: id}
		if err := s.Complete(ctx, key, acquire(t, s, key, time.Minute), textResponse(id), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := admin.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != len(ids) {
		t.Fatalf("%d keys under the prefix for %d records: %q", len(keys), len(ids), keys)
	}
	shape := regexp.MustCompile(`^` + regexp.QuoteMeta(prefix) + `[0-9a-f]{32}$`)
	for _, k := range keys {
		if !shape.MatchString(k) {
			t.Errorf("key %q is not the prefix and 32 hex digits", k)
		}
		// No braces, so no client-chosen Cluster hash tag.
		if strings.ContainsAny(k, "{}") {
			t.Errorf("key %q has a brace", k)
		}
	}
}

func TestKeyNamesAreInjective(t *testing.T) {
	s := New(goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"}), Options{})
	defer s.Close()
	pairs := [][2]storage.Key{
		{{Scope: "a", ID: "bc"}, {Scope: "ab", ID: "c"}},
		{{Scope: "a\x00", ID: "b"}, {Scope: "a", ID: "\x00b"}},
		{{Scope: "", ID: "x"}, {Scope: "x", ID: ""}},
	}
	for _, p := range pairs {
		if s.keyName(p[0]) == s.keyName(p[1]) {
			t.Errorf("%q and %q share the key name %s", p[0], p[1], s.keyName(p[0]))
		}
	}
	if n := s.keyName(storage.Key{Scope: "s", ID: "i"}); len(n) != len(DefaultKeyPrefix)+32 || !strings.HasPrefix(n, DefaultKeyPrefix) {
		t.Errorf("key name %q", n)
	}
}

func TestScriptCacheFlushFallsBackToEval(t *testing.T) {
	// Private server: SCRIPT FLUSH on the shared one would make the
	// command-count tests of other packages see EVAL fallbacks.
	srv := redistest.StartServer(t)
	s := newTestStore(t, srv.Addr, Options{})
	admin := adminClient(t, srv.Addr)
	ctx := t.Context()
	key := storage.Key{Scope: "scope", ID: "flush"}
	tok := acquire(t, s, key, time.Minute)
	if err := admin.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, key, tok, textResponse("after flush"), time.Minute); err != nil {
		t.Fatalf("Complete after SCRIPT FLUSH: %v", err)
	}
	res, err := s.Reserve(ctx, key, fp, time.Minute)
	if err != nil || res.Outcome != storage.Replay || string(res.Record.Response.Body) != "after flush" {
		t.Fatalf("Reserve after SCRIPT FLUSH: %v %v", res.Outcome, err)
	}
	// EVAL put the script back: EVALSHA works again.
	sha := completeScript.Hash()
	if ok := admin.ScriptExists(ctx, sha).Val(); len(ok) != 1 || !ok[0] {
		t.Errorf("complete script not cached again after the fallback")
	}
}

func TestCorruptRecordsAreErrors(t *testing.T) {
	addr := redistest.Addr()
	s := newTestStore(t, addr, Options{})
	admin := adminClient(t, addr)
	ctx := t.Context()
	future := time.Now().Add(time.Hour).UnixMilli()

	tests := []struct {
		name    string
		write   func(name string) error
		corrupt bool // the error wraps storage.ErrCorrupt (else: any error)
	}{
		{"bad head", func(n string) error {
			return admin.HSet(ctx, n, "f", fp, "c", 1, "e", future, "h", "\xff\x00", "b", "").Err()
		}, true},
		{"status no record may hold", func(n string) error {
			head := storage.AppendResponse(nil, &storage.Response{Status: 42})
			return admin.HSet(ctx, n, "f", fp, "c", 1, "e", future, "h", head, "b", "").Err()
		}, true},
		{"interim status", func(n string) error {
			head := storage.AppendResponse(nil, &storage.Response{Status: 103})
			return admin.HSet(ctx, n, "f", fp, "c", 1, "e", future, "h", head, "b", "").Err()
		}, true},
		{"body inside the head", func(n string) error {
			head := storage.AppendResponse(nil, textResponse("inside"))
			return admin.HSet(ctx, n, "f", fp, "c", 1, "e", future, "h", head, "b", "").Err()
		}, true},
		{"no head", func(n string) error {
			return admin.HSet(ctx, n, "f", fp, "c", 1, "e", future).Err()
		}, true},
		{"no expiry", func(n string) error {
			return admin.HSet(ctx, n, "f", fp, "t", "1", "c", 1).Err()
		}, true},
		{"expiry not a number", func(n string) error {
			return admin.HSet(ctx, n, "f", fp, "t", "1", "c", 1, "e", "soon").Err()
		}, true},
		{"token not a number", func(n string) error {
			return admin.HSet(ctx, n, "f", fp, "t", "x", "c", 1, "e", future).Err()
		}, false}, // Reserve sees a conflict; Get must fail
		{"not a hash", func(n string) error {
			return admin.Set(ctx, n, "junk", time.Hour).Err()
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := storage.Key{Scope: "corrupt", ID: tt.name}
			name := s.keyName(key)
			t.Cleanup(func() { admin.Del(context.Background(), name) })
			if err := tt.write(name); err != nil {
				t.Fatal(err)
			}
			_, getErr := s.Get(ctx, key, true)
			_, getHeadErr := s.Get(ctx, key, false)
			res, resErr := s.Reserve(ctx, key, fp, time.Minute)
			if tt.name == "token not a number" {
				if resErr != nil || res.Outcome != storage.Conflict {
					t.Errorf("Reserve: %v %v, want conflict", res.Outcome, resErr)
				}
				resErr = getErr
			}
			for op, err := range map[string]error{"Get": getErr, "Get without body": getHeadErr, "Reserve": resErr} {
				switch {
				case err == nil:
					t.Errorf("%s: no error", op)
				case errors.Is(err, storage.ErrNotFound):
					t.Errorf("%s: %v, want a corruption error", op, err)
				case tt.corrupt && !errors.Is(err, storage.ErrCorrupt):
					t.Errorf("%s: %v, want it to wrap storage.ErrCorrupt", op, err)
				}
			}
			// An operator can always clear an unreadable hash.
			if tt.name != "not a hash" {
				if err := s.Delete(ctx, key); err != nil {
					t.Errorf("Delete: %v", err)
				}
			}
		})
	}
}

func TestReserveRetriedByTheClientAcquires(t *testing.T) {
	s := newTestStore(t, redistest.Addr(), Options{})
	ctx := t.Context()
	key := storage.Key{Scope: "scope", ID: "retry"}
	// The same call twice, as go-redis sends it again after a connection
	// broke with the reply in flight: the retry must not see a conflict.
	for i := range 2 {
		v, err := s.run(ctx, reserveScript, key, fp, uint64(42), int64(60000), int64(120000))
		if err != nil {
			t.Fatal(err)
		}
		if r := (reply{v: v}); r.int(0) != 1 || r.check(1) != nil {
			t.Fatalf("attempt %d: reply %v, want acquired", i+1, v)
		}
	}
	if res, err := s.Reserve(ctx, key, fp, time.Minute); err != nil || res.Outcome != storage.Conflict {
		t.Fatalf("another request: %v %v, want conflict", res.Outcome, err)
	}
	if err := s.Complete(ctx, key, 42, textResponse("once"), time.Minute); err != nil {
		t.Fatal(err)
	}
}

func TestCloseIsIdempotent(t *testing.T) {
	s := newTestStore(t, redistest.Addr(), Options{})
	ctx := t.Context()
	key := storage.Key{Scope: "scope", ID: "close"}
	acquire(t, s, key, time.Minute)
	if err := s.Close(); err != nil {
		t.Fatalf("first Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := s.Reserve(ctx, key, fp, time.Minute); err == nil {
		t.Fatal("Reserve after Close succeeded")
	}
	if err := s.Wait(ctx, key, time.Second); err == nil {
		t.Fatal("Wait after Close succeeded")
	}
}

func TestProblemsNeverNameKeysOrCredentials(t *testing.T) {
	const secret = "s3cret-password"
	s := New(goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", Password: secret, DialerRetries: 1, MaxRetries: -1}), Options{})
	defer s.Close()
	key := storage.Key{Scope: "scope-bytes", ID: "client-key-bytes"}
	_, err := s.Reserve(t.Context(), key, fp, time.Minute)
	if err == nil {
		t.Fatal("Reserve on a closed port succeeded")
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "redis reserve: ") {
		t.Errorf("error %q does not say which operation failed", msg)
	}
	for _, leak := range []string{secret, key.Scope, key.ID, s.keyName(key)} {
		if strings.Contains(msg, leak) {
			t.Errorf("error %q contains %q", msg, leak)
		}
	}
}

// TestKeyPrefixWithABraceIsRefused: a brace in the prefix would be a
// Cluster hash tag putting every record in one slot. Options.Check names
// the option, and a store built anyway writes nothing.
func TestKeyPrefixWithABraceIsRefused(t *testing.T) {
	for _, prefix := range []string{"{idem}:", "app:{", "app}:"} {
		err := Options{KeyPrefix: prefix}.Check()
		if err == nil || !strings.Contains(err.Error(), "key_prefix must not contain") || !strings.Contains(err.Error(), prefix) {
			t.Errorf("Check(%q) = %v, want an error naming key_prefix and the prefix", prefix, err)
		}
	}
	addr := redistest.Addr()
	redistest.Require(t, addr)
	admin := adminClient(t, addr)
	prefix := "{" + redistest.RandomHex(6) + "}:"
	s := New(goredis.NewClient(&goredis.Options{Addr: addr}), Options{KeyPrefix: prefix})
	defer s.Close()
	ctx := t.Context()
	key := storage.Key{Scope: "scope", ID: "tagged"}
	if _, err := s.Reserve(ctx, key, fp, time.Minute); !errors.Is(err, storage.ErrInvalid) {
		t.Errorf("Reserve: %v, want an error wrapping storage.ErrInvalid", err)
	}
	if _, err := s.Get(ctx, key, false); !errors.Is(err, storage.ErrInvalid) {
		t.Errorf("Get: %v, want an error wrapping storage.ErrInvalid", err)
	}
	if err := s.Wait(ctx, key, time.Second); !errors.Is(err, storage.ErrInvalid) {
		t.Errorf("Wait: %v, want an error wrapping storage.ErrInvalid", err)
	}
	if keys := admin.Keys(ctx, escapeGlob(prefix)+"*").Val(); len(keys) != 0 {
		t.Errorf("keys written under a refused prefix: %v", keys)
	}
}
