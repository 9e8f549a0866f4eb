package e2e

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
)

// reloadSite is the memory store with ttl in front of up.
func reloadSite(up *caddyproc.Upstream, ttl time.Duration) site {
	return site{routes: route(up, "storage memory\nttl "+ttl.String())}
}

// Requests keep flowing while `caddy reload` changes the TTL twice: no
// answer is a 5xx or a broken connection, every key runs once, and the
// memory store's records survive both reloads.
func TestReloadUnderLoadKeepsMemoryStoreAndRunsEachKeyOnce(t *testing.T) {
	// A connection refused or reset while it is being opened never sent
	// its request: Caddy's listener changing hands during a reload may do
	// that (seen once on a heavily loaded machine), and any client sends
	// such a request again. What is judged is every request that was sent.
	postDuringReload := func(base, key string, auth []string) reply {
		for range 3 {
			r := post(base, "/orders", key, `{"n":1}`, auth...)
			var op *net.OpError
			if r.err == nil || !errors.As(r.err, &op) || op.Op != "dial" {
				return r
			}
			time.Sleep(10 * time.Millisecond)
		}
		return post(base, "/orders", key, `{"n":1}`, auth...)
	}
	up := newUpstream(t)
	inst := startCaddy(t, "caddy", reloadSite(up, time.Hour))
	auth := []string{"Authorization", "Bearer reload-test", "X-Upstream-Delay", "20"}
	const scope = "127.0.0.1 Bearer reload-test" // the default scope, evaluated

	var (
		mu       sync.Mutex
		done     []string // keys whose first request has completed
		problems []string
		sent     int
	)
	failed := func(format string, args ...any) {
		mu.Lock()
		problems = append(problems, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				mu.Lock()
				sent++
				var retry string
				if len(done) > 0 && i%3 == 2 {
					retry = done[rand.IntN(len(done))]
				}
				mu.Unlock()
				if retry != "" {
					if r := postDuringReload(inst.URL(), retry, auth); !r.isReplayOf(1) {
						failed("retry of %s: %s, want a replay", retry, r)
					}
					continue
				}
				key := fmt.Sprintf("reload-%d-%d", w, i)
				if r := postDuringReload(inst.URL(), key, auth); !r.isNew() {
					failed("new key %s: %s, want it to run (upstream executions: %d)", key, r, up.Executions(key))
					continue
				}
				mu.Lock()
				done = append(done, key)
				mu.Unlock()
			}
		})
	}

	time.Sleep(time.Second)
	mu.Lock()
	beforeReload := done[0]
	mu.Unlock()
	reload(t, inst, reloadSite(up, 2*time.Hour))
	time.Sleep(time.Second)
	reload(t, inst, reloadSite(up, 3*time.Hour))
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()

	for _, p := range problems {
		t.Error(p)
	}
	t.Logf("%d requests, %d keys, 2 reloads", sent, len(done))
	if len(done) < 20 {
		t.Fatalf("only %d keys completed: too little load to prove anything", len(done))
	}
	for _, key := range done {
		assertExecutions(t, up, key, 1)
		if r := post(inst.URL(), "/orders", key, `{"n":1}`, auth...); !r.isReplayOf(1) {
			t.Fatalf("retry of %s after the reloads: %s, want a replay", key, r)
		}
	}
	assertExecutions(t, up, "", 0) // every request carried a key

	// The new TTL applies to records completed after the reload; older
	// records keep theirs.
	if r := post(inst.URL(), "/orders", "after-reloads", `{"n":1}`, auth...); !r.isNew() {
		t.Fatal(r)
	}
	for key, ttl := range map[string]time.Duration{beforeReload: time.Hour, "after-reloads": 3 * time.Hour} {
		rec, ok := storedRecord(t, inst, key, scope)
		if !ok || rec.State != "completed" {
			t.Fatalf("record of %s: %+v, %v", key, rec, ok)
		}
		if left := time.Until(rec.ExpiresAt); left > ttl || left < ttl-time.Minute {
			t.Errorf("record of %s expires in %s, want about %s", key, left.Round(time.Second), ttl)
		}
	}
}

// A reload that changes the storage configuration (here Redis pool_size,
// hence a new client) drops the old store while a request it started is
// still running: the old store stays open until that request has recorded
// its response, and the retry is a replay.
func TestReloadThatChangesTheStoreConfigLetsRunningRequestsFinish(t *testing.T) {
	store := onRedis(t, sharedRedisAddr(t), "pool_size 5")
	up := newUpstream(t)
	lease := "\nlock_timeout " + lockTimeout.String()
	inst := startCaddy(t, "caddy", site{routes: route(up, store.storage+lease)})

	inFlight := running(t, up, inst, "k", `{}`, 2*lockTimeout)
	changed := strings.Replace(store.storage, "pool_size 5", "pool_size 6", 1)
	reload(t, inst, site{routes: route(up, changed+lease)})

	if r := <-inFlight; !r.isNew() {
		t.Fatalf("request running across the reload: %s", r)
	}
	if r := post(inst.URL(), "/orders", "k", `{}`); !r.isReplayOf(1) {
		t.Fatalf("retry after the reload: %s, want a replay of execution 1", r)
	}
	if strings.Contains(inst.Log(), "client is closed") {
		t.Fatalf("the old store was closed under a running request:\n%s", tail(inst.Log(), 20))
	}
	assertExecutions(t, up, "k", 1)
}

// Not guaranteed: memory stores are shared per max_keys, so a reload that
// changes max_keys starts an empty store and forgets every record.
func TestReloadThatChangesMemoryMaxKeysStartsAnEmptyStore(t *testing.T) {
	up := newUpstream(t)
	inst := startCaddy(t, "caddy", site{routes: route(up, "storage memory {\n\tmax_keys 1000\n}")})
	if r := post(inst.URL(), "/orders", "k", `{}`); !r.isNew() {
		t.Fatal(r)
	}
	reload(t, inst, site{routes: route(up, "storage memory {\n\tmax_keys 2000\n}")})
	if r := post(inst.URL(), "/orders", "k", `{}`); !r.isNew() || r.execution() != 2 {
		t.Fatalf("retry after a reload that changed max_keys: %s, want a second execution", r)
	}
	assertExecutions(t, up, "k", 2)
}

// A request that runs across a reload keeps renewing its lease and
// records its response: the old config's handler keeps its store after
// Caddy has cleaned that config up.
func TestRequestRunningAcrossAReloadKeepsItsLeaseAndRunsOnce(t *testing.T) {
	store := onRedis(t, sharedRedisAddr(t), "")
	up := newUpstream(t)
	s := func(ttl time.Duration) site {
		return site{routes: route(up, store.storage+"\nlock_timeout "+lockTimeout.String()+"\nttl "+ttl.String()+"\nin_flight reject")}
	}
	inst := startCaddy(t, "caddy", s(time.Hour))
	pid := inst.PID()

	inFlight := running(t, up, inst, "k", `{}`, 3*lockTimeout)
	reload(t, inst, s(2*time.Hour))
	// Past the lease the request started with: only renewals made after
	// the reload keep it.
	time.Sleep(2 * lockTimeout)
	if r := post(inst.URL(), "/orders", "k", `{}`); !r.isConflict() {
		t.Fatalf("retry while the request runs across the reload: %s, want 409", r)
	}
	if r := <-inFlight; !r.isNew() {
		t.Fatalf("request running across the reload: %s", r)
	}
	if r := post(inst.URL(), "/orders", "k", `{}`); !r.isReplayOf(1) {
		t.Fatalf("retry after it finished: %s, want a replay", r)
	}
	assertExecutions(t, up, "k", 1)
	if !inst.Running() || inst.PID() != pid {
		t.Fatal("caddy died")
	}
}
