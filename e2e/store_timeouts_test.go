package e2e

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// A store that answers too slowly is a store that is down
// (docs/guarantees.md): every store call has a deadline, after which
// fail_closed answers 503 with Retry-After and fail_open passes the
// request on. And a call that timed out leaves nothing behind: when the
// store catches up, the key is free, not held by a reservation that
// landed after its request had given up (a ghost lease, which would
// answer 409 for a whole lock_timeout).

// storeTimeout is the storage timeout of these tests; a slow store must
// be answered for within storeTimeout + slack.
const (
	storeTimeout = time.Second
	slack        = time.Second
)

// timeoutSite has two routes on one store with the default lock_timeout
// (30s, so that a ghost lease cannot pass for a short one): /open/ with
// fail_open, the rest with fail_closed.
func timeoutSite(up *caddyproc.Upstream, storage string) site {
	handler := func(policy string) string {
		return fmt.Sprintf("\t\tidempotency {\n\t\t\ton_storage_error %s\n\t\t}\n\t\treverse_proxy %s\n", policy, up.Addr)
	}
	return site{
		globals: "idempotency {\n" + storage + "\n}",
		routes: "\thandle /open/* {\n" + handler("fail_open") + "\t}\n" +
			"\thandle {\n" + handler("fail_closed") + "\t}\n",
	}
}

// timedPost is post with how long the answer took.
func timedPost(inst *caddyproc.Instance, path, key string) (reply, time.Duration) {
	start := time.Now()
	r := post(inst.URL(), path, key, `{"amount":10}`)
	return r, time.Since(start)
}

// failedClosed fails unless r is the fail_closed 503, with Retry-After,
// and came within bound.
func failedClosed(t *testing.T, what string, r reply, took, bound time.Duration) {
	t.Helper()
	if r.status != 503 || r.problem() != storeDown {
		t.Fatalf("%s: %s after %s, want 503 %s", what, describe(r), took.Round(time.Millisecond), storeDown)
	}
	t.Logf("%s: 503 after %s", what, took.Round(time.Millisecond))
	if r.header.Get("Retry-After") == "" {
		t.Errorf("%s: the 503 has no Retry-After", what)
	}
	if took > bound {
		t.Fatalf("%s: the 503 took %s, want at most %s", what, took.Round(time.Millisecond), bound)
	}
}

// passedOn fails unless r is the upstream's own answer (fail_open) and
// came within bound.
func passedOn(t *testing.T, what string, r reply, took, bound time.Duration) {
	t.Helper()
	if !r.isNew() {
		t.Fatalf("%s: %s after %s, want the request passed on to the upstream (fail_open)", what, describe(r), took.Round(time.Millisecond))
	}
	if took > bound {
		t.Fatalf("%s: the answer took %s, want at most %s", what, took.Round(time.Millisecond), bound)
	}
}

// runsOnceWithin sends key, a key refused with 503 while the store was
// slow, until it is served, for within at most (a 503 may still come
// while the store recovers). It must run (its first execution) or replay
// that execution; a 409 means the refused request's reservation landed
// after all and holds the key.
func runsOnceWithin(t *testing.T, inst *caddyproc.Instance, up *caddyproc.Upstream, key string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		r := post(inst.URL(), "/orders", key, `{"amount":10}`)
		switch {
		case r.isNew() && r.execution() == 1, r.isReplayOf(1):
			if r := post(inst.URL(), "/orders", key, `{"amount":10}`); !r.isReplayOf(1) {
				t.Fatalf("second retry of %s: %s, want a replay of execution 1", key, describe(r))
			}
			assertExecutions(t, up, key, 1)
			return
		case r.isConflict():
			t.Fatalf("retry of %s once the store answers again: %s: the request refused with 503 left a reservation behind (upstream executions: %d)",
				key, describe(r), up.Executions(key))
		case r.status == 503 && r.problem() == storeDown && time.Now().Before(deadline):
			time.Sleep(50 * time.Millisecond)
		default:
			t.Fatalf("retry of %s once the store answers again: %s, want it to run once within %s", key, describe(r), within)
		}
	}
}

// lockTable takes an ACCESS EXCLUSIVE lock on table, in a transaction
// of its own, for hold at most; release (also called when the test ends)
// rolls it back and returns once the lock is gone.
func lockTable(t *testing.T, table string, hold time.Duration) (release func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hold+30*time.Second)
	conn, err := pgx.Connect(ctx, pgtest.DSN())
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err == nil {
		_, err = tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{table}.Sanitize()+" IN ACCESS EXCLUSIVE MODE")
	}
	if err != nil {
		conn.Close(ctx)
		cancel()
		t.Fatalf("locking %s: %v", table, err)
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		defer cancel()
		select {
		case <-stop:
		case <-time.After(hold):
		}
		_ = tx.Rollback(ctx)
		conn.Close(ctx)
	}()
	var once sync.Once
	release = func() {
		once.Do(func() { close(stop) })
		<-done
	}
	t.Cleanup(release)
	return release
}

// A table locked ACCESS EXCLUSIVE (a migration, a VACUUM FULL) blocks
// every statement on it. With `timeout 1s`, requests do not wait for the
// lock: fail_closed answers 503 and fail_open passes on within a second
// or so; once the lock is released, the refused key runs once.
func TestLockedPostgresTableFailsWithinTheTimeoutAndLeavesTheKeyFree(t *testing.T) {
	store := onPostgresWith(t, "timeout "+storeTimeout.String())
	up := newUpstream(t)
	inst := startCaddy(t, "caddy", timeoutSite(up, store.storage))
	if r := post(inst.URL(), "/orders", "before-lock", `{"amount":10}`); !r.isNew() {
		t.Fatalf("before the lock (creates the table): %s", describe(r))
	}

	release := lockTable(t, store.table, 10*time.Second)
	r, took := timedPost(inst, "/orders", "during-lock")
	failedClosed(t, "fail_closed while the table is locked", r, took, storeTimeout+slack)
	assertExecutions(t, up, "during-lock", 0)
	r, took = timedPost(inst, "/open/orders", "during-lock-open")
	passedOn(t, "fail_open while the table is locked", r, took, storeTimeout+slack)
	release()

	runsOnceWithin(t, inst, up, "during-lock", 2*time.Second)
	if r := post(inst.URL(), "/orders", "before-lock", `{"amount":10}`); !r.isReplayOf(1) {
		t.Fatalf("key completed before the lock: %s, want a replay", describe(r))
	}
}

// A store behind a black hole (packets dropped, connections open: a
// stalled proxy) answers nothing at all, on pooled connections and new
// ones. Requests must not wait on it longer than the storage timeout; and
// what they sent before giving up, delivered once the network heals,
// must not hold their keys.
func TestBlackHoledStoreFailsWithinTheTimeoutAndLeavesTheKeyFree(t *testing.T) {
	for _, tc := range []struct {
		name string
		open func(t *testing.T) backend
	}{
		{"redis", func(t *testing.T) backend {
			return onRedis(t, sharedRedisAddr(t), "timeout "+storeTimeout.String())
		}},
		{"postgres", func(t *testing.T) backend { return onPostgresWith(t, "timeout "+storeTimeout.String()) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := tc.open(t)
			p := proxyTo(t, store.addr)
			up := newUpstream(t)
			inst := startCaddy(t, "caddy", timeoutSite(up, store.storageAt(p.Addr)))
			// Warm the pool: requests below find connections open.
			for _, path := range []string{"/orders", "/open/orders"} {
				if r := post(inst.URL(), path, "warm"+path, `{"amount":10}`); !r.isNew() {
					t.Fatalf("before the stall, %s: %s", path, describe(r))
				}
			}

			p.Stall()
			stalled := true
			defer func() {
				if stalled {
					p.Unstall()
				}
			}()
			for i := range 2 { // the second one finds the pooled connection gone
				r, took := timedPost(inst, "/orders", fmt.Sprintf("stalled-%d", i))
				failedClosed(t, fmt.Sprintf("fail_closed request %d while the store is black-holed", i+1), r, took, storeTimeout+slack)
			}
			r, took := timedPost(inst, "/open/orders", "stalled-open")
			passedOn(t, "fail_open while the store is black-holed", r, took, storeTimeout+slack)
			for i := range 2 {
				assertExecutions(t, up, fmt.Sprintf("stalled-%d", i), 0)
			}

			p.Unstall()
			stalled = false
			for i := range 2 {
				runsOnceWithin(t, inst, up, fmt.Sprintf("stalled-%d", i), 2*time.Second)
			}
		})
	}
}

// sleeping reports whether the Redis at addr fails to answer PING within
// d (a PING sent then is answered later, and harmlessly).
func sleeping(t *testing.T, addr string, d time.Duration) bool {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatalf("probing redis: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(d))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		t.Fatalf("probing redis: %v", err)
	}
	_, err = c.Read(make([]byte, 16))
	return err != nil
}

// A Reserve that times out on a Redis busy with something else (DEBUG
// SLEEP: a slow command, a fork, a stalled VM): the request gets 503, and
// the reservation Redis runs when it wakes up must not hold the key, or
// every retry gets 409 until lock_timeout (30s) runs out.
func TestReserveTimingOutOnASleepingRedisLeavesTheKeyFree(t *testing.T) {
	srv := redistest.StartServerArgs(t, "--enable-debug-command", "local")
	const timeout = 500 * time.Millisecond
	store := onRedis(t, srv.Addr, "timeout "+timeout.String())
	up := newUpstream(t)
	inst := startCaddy(t, "caddy", timeoutSite(up, store.storage))
	if r := post(inst.URL(), "/orders", "before-sleep", `{"amount":10}`); !r.isNew() {
		t.Fatalf("before the sleep: %s", describe(r))
	}

	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr, ReadTimeout: 10 * time.Second, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	woke := make(chan error, 1)
	go func() { woke <- rdb.Do(context.Background(), "DEBUG", "SLEEP", "3").Err() }()
	testutil.Eventually(t, 2*time.Second, "redis to fall asleep", func() bool {
		select {
		case err := <-woke:
			t.Fatalf("DEBUG SLEEP returned at once: %v", err)
		default:
		}
		return sleeping(t, srv.Addr, 100*time.Millisecond)
	})

	r, took := timedPost(inst, "/orders", "asleep")
	failedClosed(t, "fail_closed while redis sleeps", r, took, timeout+slack)
	select {
	case <-woke:
		t.Fatal("redis woke up before the request was answered: the test proves nothing")
	default:
	}
	if err := <-woke; err != nil {
		t.Fatalf("DEBUG SLEEP: %v", err)
	}
	assertExecutions(t, up, "asleep", 0)
	runsOnceWithin(t, inst, up, "asleep", 2*time.Second)
}
