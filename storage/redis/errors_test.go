package redis

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// Each error class below is produced by a real, private redis-server put
// in the state that makes it: the store must say which errors mean that
// Redis cannot be reached or answer in time (storage.ErrUnavailable: the
// only ones after which the Caddy module's fail_open may pass a request
// on) and which prove that Redis answered.

// classStore returns a store on the Redis at addr with a client that does
// not retry (each class shows at once), closed when the test ends.
func classStore(t *testing.T, addr string, opt func(*goredis.Options)) (*Store, *goredis.Client) {
	t.Helper()
	o := &goredis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1, ContextTimeoutEnabled: true}
	if opt != nil {
		opt(o)
	}
	client := goredis.NewClient(o)
	s := New(client, Options{KeyPrefix: testPrefix(), Timeout: 5 * time.Second})
	t.Cleanup(func() { s.Close() })
	return s, client
}

// reserveErr returns the error of a Reserve of a new key.
func reserveErr(t *testing.T, s *Store) error {
	t.Helper()
	_, err := s.Reserve(t.Context(), storage.Key{Scope: "class", ID: redistest.RandomHex(4)}, fp, time.Minute)
	return err
}

// adminOf returns a plain client of the server at addr, without retries
// or read timeout, for putting the server in a state.
func adminOf(t *testing.T, addr string) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1, ReadTimeout: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

func TestErrorsThatMeanUnreachableWrapErrUnavailable(t *testing.T) {
	tests := []struct {
		name string
		// err makes the error; is checks that it is the class named.
		err func(t *testing.T) error
		is  func(error) bool
	}{
		{"connection refused", func(t *testing.T) error {
			srv := redistest.StartServer(t)
			srv.Kill()
			s, _ := classStore(t, srv.Addr, nil)
			return reserveErr(t, s)
		}, nil},
		{"black hole past the timeout", func(t *testing.T) error {
			srv := redistest.StartServer(t)
			proxy, err := caddyproc.NewProxy(srv.Addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(proxy.Close)
			s, _ := classStore(t, proxy.Addr, nil)
			s.timeout = 200 * time.Millisecond
			proxy.Stall()
			defer proxy.Unstall()
			return reserveErr(t, s)
		}, func(err error) bool { return errors.Is(err, context.DeadlineExceeded) || isTimeout(err) }},
		{"pool timeout", func(t *testing.T) error {
			srv := redistest.StartServer(t)
			s, client := classStore(t, srv.Addr, func(o *goredis.Options) {
				o.PoolSize, o.PoolTimeout, o.ReadTimeout = 1, 50*time.Millisecond, -1
			})
			admin := adminOf(t, srv.Addr)
			// The one connection of the pool blocks in BLPOP.
			go client.BLPop(context.Background(), 0, "unblock-"+s.prefix)
			testutil.Eventually(t, 30*time.Second, "the pool's connection to block", func() bool {
				return strings.Contains(admin.Info(t.Context(), "clients").Val(), "blocked_clients:1")
			})
			defer admin.LPush(context.Background(), "unblock-"+s.prefix, "x")
			return reserveErr(t, s)
		}, func(err error) bool { return errors.Is(err, goredis.ErrPoolTimeout) }},
		{"closed store", func(t *testing.T) error {
			s, _ := classStore(t, redistest.StartServer(t).Addr, nil)
			s.Close()
			return reserveErr(t, s)
		}, nil},
		{"client closed under the store", func(t *testing.T) error {
			s, client := classStore(t, redistest.StartServer(t).Addr, nil)
			client.Close()
			return reserveErr(t, s)
		}, func(err error) bool { return errors.Is(err, goredis.ErrClosed) }},
		{"LOADING", func(t *testing.T) error {
			srv := redistest.StartServerArgs(t, "--enable-debug-command", "local")
			admin := adminOf(t, srv.Addr)
			ctx := t.Context()
			// A dataset that takes seconds to load, answering clients
			// meanwhile: 1000 keys of 1 KiB, 10 ms each.
			if err := admin.Eval(ctx, `local v = string.rep('x', 1024) for i = 1, 1000 do redis.call('SET', 'k' .. i, v) end`, nil).Err(); err != nil && err != goredis.Nil {
				t.Fatal(err)
			}
			admin.ConfigSet(ctx, "key-load-delay", "10000")
			admin.ConfigSet(ctx, "loading-process-events-interval-bytes", "1024")
			go admin.Do(context.Background(), "DEBUG", "RELOAD")
			probe := adminOf(t, srv.Addr)
			testutil.Eventually(t, 30*time.Second, "the server to load its dataset", func() bool {
				return goredis.IsLoadingError(probe.Ping(ctx).Err())
			})
			s, _ := classStore(t, srv.Addr, nil)
			return reserveErr(t, s)
		}, goredis.IsLoadingError},
		{"BUSY", func(t *testing.T) error {
			srv := redistest.StartServer(t)
			admin := adminOf(t, srv.Addr)
			ctx := t.Context()
			if err := admin.ConfigSet(ctx, "busy-reply-threshold", "50").Err(); err != nil {
				t.Fatal(err)
			}
			go adminOf(t, srv.Addr).Eval(context.Background(), `while true do end`, nil)
			testutil.Eventually(t, 30*time.Second, "a script to keep the server busy", func() bool {
				return goredis.HasErrorPrefix(admin.Ping(ctx).Err(), "BUSY ")
			})
			defer admin.ScriptKill(context.Background())
			s, _ := classStore(t, srv.Addr, nil)
			return reserveErr(t, s)
		}, func(err error) bool { return goredis.HasErrorPrefix(err, "BUSY ") }},
		{"READONLY", func(t *testing.T) error {
			// A replica, as the old primary becomes during a failover.
			srv := redistest.StartServerArgs(t, "--replicaof", "127.0.0.1", "1")
			s, _ := classStore(t, srv.Addr, nil)
			return reserveErr(t, s)
		}, goredis.IsReadOnlyError},
		{"MASTERDOWN", func(t *testing.T) error {
			// Made a replica once up: it answers even PING with
			// MASTERDOWN, which the server's start-up check would not take.
			srv := redistest.StartServer(t)
			admin := adminOf(t, srv.Addr)
			admin.ConfigSet(t.Context(), "replica-serve-stale-data", "no")
			if err := admin.ReplicaOf(t.Context(), "127.0.0.1", "1").Err(); err != nil {
				t.Fatal(err)
			}
			s, _ := classStore(t, srv.Addr, nil)
			return reserveErr(t, s)
		}, goredis.IsMasterDownError},
		{"CLUSTERDOWN", func(t *testing.T) error {
			// A cluster node no slot is assigned to.
			srv := redistest.StartServerArgs(t, "--cluster-enabled", "yes")
			s, _ := classStore(t, srv.Addr, nil)
			return reserveErr(t, s)
		}, goredis.IsClusterDownError},
		{"NOREPLICAS", func(t *testing.T) error {
			srv := redistest.StartServerArgs(t, "--min-replicas-to-write", "1")
			s, _ := classStore(t, srv.Addr, nil)
			return reserveErr(t, s)
		}, goredis.IsNoReplicasError},
		{"max number of clients reached", func(t *testing.T) error {
			srv := redistest.StartServerArgs(t, "--maxclients", "1")
			if err := adminOf(t, srv.Addr).Ping(t.Context()).Err(); err != nil {
				t.Fatal(err)
			}
			s, _ := classStore(t, srv.Addr, nil)
			return reserveErr(t, s)
		}, func(err error) bool {
			// The server writes the error and closes the connection: the
			// client reads the error, or finds the connection closed (a
			// reset, or EOF when the close overtakes the error).
			return goredis.IsMaxClientsError(err) || isNetError(err) || errors.Is(err, io.EOF)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.err(t)
			if tt.is != nil && !tt.is(err) {
				t.Fatalf("the setup made %v, not the class this case is about", err)
			}
			if !errors.Is(err, storage.ErrUnavailable) || !storage.Unavailable(err) {
				t.Fatalf("error %v does not wrap storage.ErrUnavailable", err)
			}
			if !strings.HasPrefix(err.Error(), "redis reserve: ") {
				t.Errorf("error %q does not say which operation failed", err)
			}
		})
	}
}

func TestErrorsRedisAnsweredAreNotUnavailable(t *testing.T) {
	tests := []struct {
		name string
		err  func(t *testing.T) error
		is   func(error) bool
	}{
		{"CORRUPT record", func(t *testing.T) error {
			srv := redistest.StartServer(t)
			s, _ := classStore(t, srv.Addr, nil)
			key := storage.Key{Scope: "class", ID: "corrupt"}
			adminOf(t, srv.Addr).HSet(t.Context(), s.keyName(key), "f", fp, "c", 1) // no expiry
			_, err := s.Reserve(t.Context(), key, fp, time.Minute)
			return err
		}, func(err error) bool { return errors.Is(err, storage.ErrCorrupt) }},
		{"WRONGTYPE at the record's key", func(t *testing.T) error {
			srv := redistest.StartServer(t)
			s, _ := classStore(t, srv.Addr, nil)
			key := storage.Key{Scope: "class", ID: "string"}
			adminOf(t, srv.Addr).Set(t.Context(), s.keyName(key), "junk", 0)
			_, err := s.Reserve(t.Context(), key, fp, time.Minute)
			return err
		}, func(err error) bool { return goredis.HasErrorPrefix(err, "WRONGTYPE") }},
		{"OOM refusing a write", func(t *testing.T) error {
			srv := redistest.StartServerArgs(t, "--maxmemory", "1")
			s, _ := classStore(t, srv.Addr, nil)
			return reserveErr(t, s)
		}, goredis.IsOOMError},
		{"NOAUTH", func(t *testing.T) error {
			srv := redistest.StartServerArgs(t, "--requirepass", "s3cret")
			s, _ := classStore(t, srv.Addr, nil)
			return reserveErr(t, s)
		}, goredis.IsAuthError},
		{"WRONGPASS", func(t *testing.T) error {
			srv := redistest.StartServerArgs(t, "--requirepass", "s3cret")
			s, _ := classStore(t, srv.Addr, func(o *goredis.Options) { o.Password = "wrong" })
			return reserveErr(t, s)
		}, goredis.IsAuthError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.err(t)
			if err == nil || !tt.is(err) {
				t.Fatalf("the setup made %v, not the class this case is about", err)
			}
			if errors.Is(err, storage.ErrUnavailable) || storage.Unavailable(err) {
				t.Fatalf("error %v, which Redis answered, counts as unavailable", err)
			}
		})
	}
}

// TestEveryOperationClassifiesItsErrors: not only Reserve; the admin
// side and waiting report an unreachable Redis the same way.
func TestEveryOperationClassifiesItsErrors(t *testing.T) {
	srv := redistest.StartServer(t)
	srv.Kill()
	s, _ := classStore(t, srv.Addr, nil)
	ctx := t.Context()
	key := storage.Key{Scope: "class", ID: "all"}
	_, getErr := s.Get(ctx, key, true)
	_, byHashErr := s.GetByHash(ctx, key.Hash(), true)
	_, delByHashErr := s.DeleteByHash(ctx, key.Hash())
	for op, err := range map[string]error{
		"Complete":     s.Complete(ctx, key, 1, &storage.Response{Status: 200}, time.Minute),
		"Release":      s.Release(ctx, key, 1),
		"Renew":        s.Renew(ctx, key, 1, time.Minute),
		"Get":          getErr,
		"Delete":       s.Delete(ctx, key),
		"GetByHash":    byHashErr,
		"DeleteByHash": delByHashErr,
		"Wait":         s.Wait(ctx, key, time.Second),
		"Ping":         s.Ping(ctx),
	} {
		if !errors.Is(err, storage.ErrUnavailable) {
			t.Errorf("%s on a stopped Redis: %v, want an error wrapping storage.ErrUnavailable", op, err)
		}
	}
}

func isNetError(err error) bool {
	var ne net.Error
	return errors.As(err, &ne)
}

// Every error of the store is scrubbed of its secrets (issue 28): here the
// dead server's port stands for a password that a message would quote,
// since neither Redis nor go-redis quotes a real one.
func TestEveryOperationsErrorIsScrubbedOfTheSecrets(t *testing.T) {
	srv := redistest.StartServer(t)
	srv.Kill()
	_, port, _ := net.SplitHostPort(srv.Addr)
	client := goredis.NewClient(&goredis.Options{Addr: srv.Addr, MaxRetries: -1, DialerRetries: 1, ContextTimeoutEnabled: true})
	s := New(client, Options{KeyPrefix: testPrefix(), Timeout: 5 * time.Second, Secrets: []string{port}})
	t.Cleanup(func() { s.Close() })
	ctx := t.Context()
	key := storage.Key{Scope: "class", ID: "all"}
	_, reserveErr := s.Reserve(ctx, key, fp, time.Minute)
	_, getErr := s.Get(ctx, key, true)
	_, byHashErr := s.GetByHash(ctx, key.Hash(), true)
	batch := []storage.Renewal{{Key: key, Token: 1, Lease: time.Minute}}
	for op, err := range map[string]error{
		"Reserve":    reserveErr,
		"Complete":   s.Complete(ctx, key, 1, &storage.Response{Status: 200}, time.Minute),
		"Get":        getErr,
		"GetByHash":  byHashErr,
		"Wait":       s.Wait(ctx, key, time.Second),
		"Ping":       s.Ping(ctx),
		"RenewBatch": s.RenewBatch(ctx, batch),
	} {
		if err == nil || strings.Contains(err.Error(), port) || !errors.Is(err, storage.ErrUnavailable) {
			t.Errorf("%s on a stopped Redis: %v, want an unavailable error without %s", op, err, port)
		}
	}
}
