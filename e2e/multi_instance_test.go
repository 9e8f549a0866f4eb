package e2e

import (
	"sync"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
)

// fireConcurrently sends n POSTs with the same key and body at once,
// alternating between instances, and returns the replies in order.
func fireConcurrently(n int, key string, instances []*caddyproc.Instance, header ...string) []reply {
	replies := make([]reply, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			replies[i] = post(instances[i%len(instances)].URL(), "/orders", key, `{"amount":10}`, header...)
		})
	}
	close(start)
	wg.Wait()
	return replies
}

func TestConcurrentSameKeyOnTwoInstancesRunsOnce(t *testing.T) {
	for _, b := range sharedBackends {
		t.Run(b.name, func(t *testing.T) {
			store := b.open(t)
			up := newUpstream(t)
			s := site{routes: route(up, store.storage)}
			a, bb := startCaddy(t, "a", s), startCaddy(t, "b", s)

			const key = "order-40-concurrent"
			replies := fireConcurrently(40, key, []*caddyproc.Instance{a, bb}, delay(500*time.Millisecond)...)
			assertExecutions(t, up, key, 1)
			var fresh, conflicts, replays int
			for i, r := range replies {
				switch {
				case r.isNew() && r.execution() == 1:
					fresh++
				case r.isConflict():
					conflicts++
				case r.isReplayOf(1):
					replays++
				default:
					t.Errorf("request %d (instance %d): unexpected reply %s", i, i%2, r)
				}
			}
			t.Logf("40 requests: 1 ran, %d got 409, %d replays", conflicts, replays)
			if fresh != 1 {
				t.Fatalf("%d requests ran the upstream (409: %d, replays: %d), want exactly 1", fresh, conflicts, replays)
			}
			for _, inst := range []*caddyproc.Instance{a, bb} {
				if r := post(inst.URL(), "/orders", key, `{"amount":10}`); !r.isReplayOf(1) {
					t.Fatalf("retry on %s after completion: %s, want a replay of execution 1", inst.Name, r)
				}
			}
			assertExecutions(t, up, key, 1)
			if n := store.records(t); n != 1 {
				t.Fatalf("store holds %d records, want 1", n)
			}
		})
	}
}

func TestWaitingRequestsOnTwoInstancesAllGetTheOneResponse(t *testing.T) {
	for _, b := range sharedBackends {
		t.Run(b.name, func(t *testing.T) {
			store := b.open(t)
			up := newUpstream(t)
			s := site{routes: route(up, store.storage+"\nin_flight wait 10s")}
			a, bb := startCaddy(t, "a", s), startCaddy(t, "b", s)

			const key = "order-40-waiting"
			replies := fireConcurrently(40, key, []*caddyproc.Instance{a, bb}, delay(500*time.Millisecond)...)
			assertExecutions(t, up, key, 1)
			fresh := 0
			for i, r := range replies {
				switch {
				case r.isNew() && r.execution() == 1:
					fresh++
				case r.isReplayOf(1):
				default:
					t.Errorf("request %d (instance %d): %s, want the first response", i, i%2, r)
				}
			}
			if fresh != 1 {
				t.Fatalf("%d requests ran the upstream, want exactly 1", fresh)
			}
		})
	}
}

// Not guaranteed: the memory store is per instance and dies with it.
func TestMemoryStoreIsPerInstanceAndLostOnRestart(t *testing.T) {
	up := newUpstream(t)
	s := site{routes: route(up, "storage memory")}
	a, b := startCaddy(t, "a", s), startCaddy(t, "b", s)

	const key = "order-memory"
	if r := post(a.URL(), "/orders", key, `{"amount":1}`); !r.isNew() || r.execution() != 1 {
		t.Fatalf("first request on a: %s", r)
	}
	if r := post(a.URL(), "/orders", key, `{"amount":1}`); !r.isReplayOf(1) {
		t.Fatalf("retry on a: %s, want a replay", r)
	}
	if r := post(b.URL(), "/orders", key, `{"amount":1}`); !r.isNew() || r.execution() != 2 {
		t.Fatalf("retry on b: %s, want a second execution (memory is not shared)", r)
	}

	port := a.Port
	a.Stop()
	restarted := startCaddyOn(t, "a-restarted", port, s)
	if r := post(restarted.URL(), "/orders", key, `{"amount":1}`); !r.isNew() || r.execution() != 3 {
		t.Fatalf("retry on restarted a: %s, want a third execution (memory is lost on restart)", r)
	}
	assertExecutions(t, up, key, 3)
	if r := post(restarted.URL(), "/orders", key, `{"amount":1}`); !r.isReplayOf(3) {
		t.Fatalf("retry on restarted a: %s, want a replay of execution 3", r)
	}
}
