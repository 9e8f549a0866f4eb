package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// outageLease is the lock_timeout of the outage tests: longer than the
// request cut mid-flight, so that its lease is still live when the store
// comes back.
const outageLease = 3 * time.Second

// outage is a way for a store to go away and come back. The shared
// servers are never stopped: Redis is a private server killed and
// restarted (it comes back empty, as a Redis without persistence does), or
// a server behind a caddyproc.Proxy that cuts every connection.
type outage struct {
	name string
	// open returns the storage block Caddy uses and how to break and mend
	// the store; kept says whether records survive the outage.
	open func(t *testing.T) (storage string, cut, restore func(), kept bool)
}

// redisTimeouts keep a request's wait for a dead Redis short.
const redisTimeouts = "timeout 500ms\ndial_timeout 500ms"

var outages = []outage{
	{"redis-restart", func(t *testing.T) (string, func(), func(), bool) {
		srv := redistest.StartServer(t)
		store := onRedis(t, srv.Addr, redisTimeouts)
		return store.storage, srv.Kill, func() { srv.Restart(t) }, false
	}},
	{"redis-partition", func(t *testing.T) (string, func(), func(), bool) {
		store := onRedis(t, sharedRedisAddr(t), redisTimeouts)
		p := proxyTo(t, store.addr)
		return store.storageAt(p.Addr), p.Cut, func() { mustRestore(t, p) }, true
	}},
	{"postgres-partition", func(t *testing.T) (string, func(), func(), bool) {
		store := onPostgres(t)
		p := proxyTo(t, store.addr)
		return store.storageAt(p.Addr), p.Cut, func() { mustRestore(t, p) }, true
	}},
}

func proxyTo(t *testing.T, addr string) *caddyproc.Proxy {
	t.Helper()
	p, err := caddyproc.NewProxy(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func mustRestore(t *testing.T, p *caddyproc.Proxy) {
	t.Helper()
	if err := p.Restore(); err != nil {
		t.Fatal(err)
	}
}

// outageSite has two routes on one store: /open/ with fail_open, the rest
// with the default fail_closed.
func outageSite(up *caddyproc.Upstream, storage string) site {
	handler := func(policy string) string {
		return fmt.Sprintf("\t\tidempotency {\n\t\t\tlock_timeout %s\n\t\t\ton_storage_error %s\n\t\t}\n\t\treverse_proxy %s\n", outageLease, policy, up.Addr)
	}
	return site{
		globals: "idempotency {\n" + storage + "\n}",
		routes: "\thandle /open/* {\n" + handler("fail_open") + "\t}\n" +
			"\thandle {\n" + handler("fail_closed") + "\t}\n",
	}
}

const storeDown = "urn:caddy-idempotency:store-unavailable"

// recoveryBound is how soon after the store comes back requests must be
// served again.
const recoveryBound = 2500 * time.Millisecond

// awaitRecovery sends key until the answer is not a fail_closed 503, for
// recoveryBound at most, and returns that answer. A 503 stores nothing
// and runs nothing, so the same key can be sent again.
func awaitRecovery(t *testing.T, inst *caddyproc.Instance, path, key, body string) reply {
	t.Helper()
	deadline := time.Now().Add(recoveryBound)
	for {
		r := post(inst.URL(), path, key, body)
		if r.status != 503 || r.problem() != storeDown {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("still 503 %s after the store came back", recoveryBound)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestStoreOutageFailsClosedOrOpenAndRecoversWithoutRestart(t *testing.T) {
	for _, o := range outages {
		t.Run(o.name, func(t *testing.T) {
			storage, cut, restore, kept := o.open(t)
			up := newUpstream(t)
			inst := startCaddy(t, "caddy", outageSite(up, storage))
			pid := inst.PID()
			const body = `{"amount":10}`

			if r := post(inst.URL(), "/orders", "before", body); !r.isNew() {
				t.Fatalf("before the outage: %s", r)
			}
			if r := post(inst.URL(), "/orders", "before", body); !r.isReplayOf(1) {
				t.Fatalf("replay before the outage: %s", r)
			}

			// A request whose upstream is running when the store goes away.
			inFlight := running(t, up, inst, "cut-mid-flight", body, time.Second)
			cut()

			// fail_closed: 503, the upstream never runs, not even to replay.
			for i := range 5 {
				key := fmt.Sprintf("during-%d", i)
				if r := post(inst.URL(), "/orders", key, body); r.status != 503 || r.problem() != storeDown {
					t.Fatalf("fail_closed during the outage: %s, want 503 %s", r, storeDown)
				}
				assertExecutions(t, up, key, 0)
			}
			if r := post(inst.URL(), "/orders", "before", body); r.status != 503 || r.problem() != storeDown {
				t.Fatalf("retry of a completed key during the outage: %s, want 503", r)
			}
			assertExecutions(t, up, "before", 1)

			// fail_open: requests pass, unprotected (not guaranteed: the
			// same key runs twice).
			for want := 1; want <= 2; want++ {
				if r := post(inst.URL(), "/open/orders", "open-during", body); !r.isNew() || r.execution() != want {
					t.Fatalf("fail_open during the outage, attempt %d: %s, want the upstream's answer", want, r)
				}
			}
			testutil.Eventually(t, 30*time.Second, "fail_open's warning in the log", func() bool {
				return strings.Contains(inst.Log(), "passing the request on without idempotency (fail_open)")
			})

			// The request cut mid-flight answered its client, but its
			// record could not be written yet: it is retried in the
			// background.
			if r := <-inFlight; !r.isNew() || r.execution() != 1 {
				t.Fatalf("request running during the cut: %s, want its upstream answer", r)
			}
			testutil.Eventually(t, 5*time.Second, "the failed completion to be logged", func() bool {
				return strings.Contains(inst.Log(), "recording idempotent response failed; retrying in the background")
			})

			restore()
			restored := time.Now()
			if !inst.Running() || inst.PID() != pid {
				t.Fatalf("caddy restarted or died during the outage")
			}
			// Service resumes on its own, within about a second: once
			// go-redis has failed to dial pool_size times it answers with
			// the last dial error until its background probe, once a
			// second, gets through. Until then requests still fail closed.
			r := awaitRecovery(t, inst, "/orders", "after", body)
			t.Logf("service resumed %s after the store came back", time.Since(restored).Round(time.Millisecond))
			if !r.isNew() {
				t.Fatalf("first request served after the store came back: %s, want it to run", r)
			}
			// The client has its answer before the record is written (the
			// response streams first): a retry right after may still meet
			// the key in flight, never run it again.
			if r := retryPast409(inst, "after", body, recoveryBound); !r.isReplayOf(1) {
				t.Fatalf("replay after the store came back: %s", r)
			}
			assertExecutions(t, up, "after", 1)
			if kept {
				if r := post(inst.URL(), "/orders", "before", body); !r.isReplayOf(1) {
					t.Fatalf("key completed before the outage: %s, want a replay", r)
				}
				assertExecutions(t, up, "before", 1)
			} else {
				// Not guaranteed: a Redis restarted without persistence has
				// forgotten the record, so the retry runs again.
				if r := post(inst.URL(), "/orders", "before", body); !r.isNew() || r.execution() != 2 {
					t.Fatalf("key completed before an empty restart: %s, want a second execution", r)
				}
			}

			// No stuck key: the completion of the key cut mid-flight is
			// written once the store is back (when the store kept its
			// reservation), so its retry replays; a store that forgot
			// everything lets the retry run again (not guaranteed).
			cutRuns := 1
			r, at := takeOver(inst, "cut-mid-flight", outageLease+5*time.Second)
			if kept {
				if !r.isReplayOf(1) {
					t.Fatalf("retry of the key cut mid-flight: %s, want the replay of its one execution", r)
				}
			} else {
				cutRuns = 2
				if !r.isNew() || r.execution() != 2 {
					t.Fatalf("retry of the key cut mid-flight after an empty restart: %s, want it to run again", r)
				}
			}
			t.Logf("the key cut mid-flight was answered %s after the store came back (lock_timeout %s)", at.Sub(restored).Round(time.Millisecond), outageLease)
			// The background retry pauses 2s at most between tries.
			if at.Sub(restored) > 3*time.Second {
				t.Fatalf("the key cut mid-flight stayed in flight %s after the store came back", at.Sub(restored))
			}

			// fail_open routes are protected again.
			if r := post(inst.URL(), "/open/orders", "open-after", body); !r.isNew() {
				t.Fatalf("fail_open route after the outage: %s", r)
			}
			if r := post(inst.URL(), "/open/orders", "open-after", body); !r.isReplayOf(1) {
				t.Fatalf("fail_open route after the outage, retry: %s, want a replay", r)
			}
			for i := range 5 {
				assertExecutions(t, up, fmt.Sprintf("during-%d", i), 0)
			}
			assertExecutions(t, up, "cut-mid-flight", cutRuns)
			assertExecutions(t, up, "open-during", 2)
			assertExecutions(t, up, "open-after", 1)
			if inst.PID() != pid {
				t.Fatalf("caddy was restarted")
			}
		})
	}
}

func TestCaddyStartsWhileTheStoreIsDownAndServesOnceItIsBack(t *testing.T) {
	for _, o := range outages {
		t.Run(o.name, func(t *testing.T) {
			storage, cut, restore, _ := o.open(t)
			cut()
			up := newUpstream(t)
			inst := startCaddy(t, "caddy", outageSite(up, storage))
			pid := inst.PID()
			if r := post(inst.URL(), "/orders", "k", `{}`); r.status != 503 || r.problem() != storeDown {
				t.Fatalf("fail_closed with the store down since start: %s, want 503", r)
			}
			if r := post(inst.URL(), "/open/orders", "k-open", `{}`); !r.isNew() {
				t.Fatalf("fail_open with the store down since start: %s", r)
			}
			assertExecutions(t, up, "k", 0)

			restore()
			if r := awaitRecovery(t, inst, "/orders", "k", `{}`); !r.isNew() {
				t.Fatalf("first request served once the store is up: %s, want it to run", r)
			}
			if r := post(inst.URL(), "/orders", "k", `{}`); !r.isReplayOf(1) {
				t.Fatalf("retry once the store is up: %s, want a replay", r)
			}
			assertExecutions(t, up, "k", 1)
			if inst.PID() != pid {
				t.Fatalf("caddy was restarted")
			}
		})
	}
}

// TestAStopWaitsForACompletionTheStoreCouldNotTake is the review's
// finding: a request ran while its store was unreachable, so its
// completion went to the background retries (aftercare); Caddy, told to
// stop (SIGTERM), exited at once and the completion died with it. Its key
// stayed in flight until the lease lapsed, and the retry, on the next
// instance, ran the payment again. Now an exiting Caddy waits for the
// pending writes (up to exitDrain): the store comes back a second into
// the stop, the completion lands, and the retry is a replay.
func TestAStopWaitsForACompletionTheStoreCouldNotTake(t *testing.T) {
	for _, name := range []string{"redis", "postgres"} {
		t.Run(name, func(t *testing.T) {
			var store backend
			if name == "redis" {
				store = onRedis(t, sharedRedisAddr(t), redisTimeouts)
			} else {
				store = onPostgres(t)
			}
			p := proxyTo(t, store.addr)
			up := newUpstream(t)
			lease := 2 * time.Second
			siteOn := func(storage string) site {
				return site{
					globals: "idempotency {\n" + storage + "\n}",
					routes:  fmt.Sprintf("\tidempotency {\n\t\tlock_timeout %s\n\t}\n\treverse_proxy %s\n", lease, up.Addr),
				}
			}
			inst := startCaddy(t, "stopping", siteOn(store.storageAt(p.Addr)))
			const body = `{"amount":10}`
			inFlight := running(t, up, inst, "stop-pending", body, time.Second)
			p.Cut()
			if r := <-inFlight; !r.isNew() {
				t.Fatalf("the request that ran while the store was cut: %s, want its 201", r)
			}
			restored := make(chan struct{})
			go func() {
				defer close(restored)
				time.Sleep(time.Second)
				mustRestore(t, p)
			}()
			if !inst.Terminate(30 * time.Second) {
				t.Fatalf("caddy did not stop within 30s of SIGTERM:\n%s", inst.Log())
			}
			<-restored
			// Past the lease: a completion that died with the process
			// would have left the key to the retry.
			time.Sleep(lease + time.Second)
			next := startCaddy(t, "next", siteOn(store.storage))
			if r := post(next.URL(), "/orders", "stop-pending", body); !r.isReplayOf(1) {
				t.Fatalf("the retry on the next instance: %s, want the replay of the one execution\n%s", r, inst.Log())
			}
			assertExecutions(t, up, "stop-pending", 1)
		})
	}
}
