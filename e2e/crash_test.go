package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// lockTimeout is the lease of the crash, stall and long-request tests:
// short, so that the tests are quick, and still ten renewal periods.
const lockTimeout = time.Second

// twoInstances starts instances a and b on one shared store, with a short
// lock_timeout, in front of one counting upstream.
func twoInstances(t *testing.T, store backend) (up *caddyproc.Upstream, a, b *caddyproc.Instance) {
	t.Helper()
	up = newUpstream(t)
	s := site{routes: route(up, store.storage+"\nlock_timeout "+lockTimeout.String()+"\nin_flight reject")}
	return up, startCaddy(t, "a", s), startCaddy(t, "b", s)
}

// takeOver retries key on inst every 100ms while the answer is a 409, and
// returns the first other answer and when it came. After within it gives
// up and returns the last 409.
func takeOver(inst *caddyproc.Instance, key string, within time.Duration, header ...string) (reply, time.Time) {
	deadline := time.Now().Add(within)
	for {
		r := post(inst.URL(), "/orders", key, `{"amount":10}`, header...)
		if !r.isConflict() || time.Now().After(deadline) {
			return r, time.Now()
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestKilledInstanceKeyIsTakenOverAfterLockTimeoutAndRunsOnceMore(t *testing.T) {
	for _, b := range sharedBackends {
		t.Run(b.name, func(t *testing.T) {
			up, a, bb := twoInstances(t, b.open(t))

			const key = "order-crash"
			crashed := running(t, up, a, key, `{"amount":10}`, 3*lockTimeout)

			a.Kill()
			killed := time.Now()
			if r := post(bb.URL(), "/orders", key, `{"amount":10}`); !r.isConflict() {
				t.Fatalf("retry on b right after a died: %s, want 409 while a's lease is live", r)
			}
			r, at := takeOver(bb, key, lockTimeout+5*time.Second)
			if !r.isNew() || r.execution() != 2 {
				t.Fatalf("retry on b after the lease lapsed: %s, want b's own execution (2)", r)
			}
			t.Logf("b took the key over %s after a was killed (lock_timeout %s)", at.Sub(killed).Round(time.Millisecond), lockTimeout)
			if after := at.Sub(killed); after > lockTimeout+2*time.Second {
				t.Errorf("takeover took %s, want about lock_timeout (%s)", after, lockTimeout)
			}
			if cr := <-crashed; cr.err == nil {
				t.Errorf("the client of the killed instance got %s, want a broken connection", cr)
			}
			for range 3 {
				if r := post(bb.URL(), "/orders", key, `{"amount":10}`); !r.isReplayOf(2) {
					t.Fatalf("replay on b: %s, want b's record (execution 2)", r)
				}
			}
			assertExecutions(t, up, key, 2)
		})
	}
}

// A stalled owner (SIGSTOP: a long GC pause, a frozen VM) loses its lease
// while its upstream works; another instance takes the key over. When the
// stalled one wakes up with its upstream's answer, its write is refused
// (fencing) and the record stays the new owner's. The upstream did run
// twice: that is the documented cost of a lease lost while a request runs.
func TestStalledOwnerCannotOverwriteTheNewOwnersRecord(t *testing.T) {
	for _, b := range sharedBackends {
		t.Run(b.name, func(t *testing.T) {
			up, a, bb := twoInstances(t, b.open(t))

			const key = "order-stall"
			work := 2 * lockTimeout
			stalled := running(t, up, a, key, `{"amount":10}`, work)
			started := time.Now() // a little after the upstream started
			if err := a.Pause(); err != nil {
				t.Fatal(err)
			}

			// b takes the key over once a's lease lapses and runs it for
			// as long, so that a wakes up while b is still running.
			owner := make(chan reply, 1)
			go func() {
				r, _ := takeOver(bb, key, lockTimeout+5*time.Second, delay(work)...)
				owner <- r
			}()
			testutil.Eventually(t, lockTimeout+5*time.Second, "b to take the key over", func() bool { return up.Executions(key) == 2 })
			// a's upstream has answered by now; a has not read it yet.
			time.Sleep(time.Until(started.Add(work + 200*time.Millisecond)))
			if err := a.Resume(); err != nil {
				t.Fatal(err)
			}

			if r := <-stalled; r.status != 201 || r.execution() != 1 {
				t.Fatalf("client of the stalled instance: %s, want its own upstream answer (execution 1)", r)
			}
			const refused = "idempotency lease was lost before the response could be recorded"
			testutil.Eventually(t, 5*time.Second, "a to log that its completion was refused", func() bool {
				return strings.Contains(a.Log(), refused)
			})
			if r := <-owner; !r.isNew() || r.execution() != 2 {
				t.Fatalf("b's request: %s, want b's own execution (2)", r)
			}
			for _, inst := range []*caddyproc.Instance{a, bb, a, bb} {
				if r := post(inst.URL(), "/orders", key, `{"amount":10}`); !r.isReplayOf(2) {
					t.Fatalf("replay on %s: %s, want the new owner's record (execution 2)", inst.Name, r)
				}
			}
			assertExecutions(t, up, key, 2)
		})
	}
}

// Not guaranteed: an owner cut off from the store for longer than
// lock_timeout loses its lease while its upstream runs, and a retry on
// another instance runs the upstream again. Fencing still holds: the cut
// off owner's late completion is refused and the record stays the new
// owner's.
func TestPartitionedOwnerLosesTheKeyAndTheUpstreamRunsTwice(t *testing.T) {
	for _, b := range sharedBackends {
		t.Run(b.name, func(t *testing.T) {
			store := b.open(t)
			p := proxyTo(t, store.addr)
			up := newUpstream(t)
			lease := "\nlock_timeout " + lockTimeout.String()
			a := startCaddy(t, "a", site{routes: route(up, store.storageAt(p.Addr)+lease)})
			bb := startCaddy(t, "b", site{routes: route(up, store.storage+lease)})

			const key = "order-partition"
			cutOff := running(t, up, a, key, `{"amount":10}`, 4*lockTimeout)
			p.Cut()

			r, _ := takeOver(bb, key, lockTimeout+5*time.Second)
			if !r.isNew() || r.execution() != 2 {
				t.Fatalf("retry on b while a is cut off: %s, want b to take the key over and run it", r)
			}
			mustRestore(t, p)

			if r := <-cutOff; r.status != 201 || r.execution() != 1 {
				t.Fatalf("client of the cut off instance: %s, want its own upstream answer (execution 1)", r)
			}
			testutil.Eventually(t, 5*time.Second, "a to log that its completion was refused", func() bool {
				return strings.Contains(a.Log(), "idempotency lease was lost before the response could be recorded")
			})
			for _, inst := range []*caddyproc.Instance{a, bb} {
				if r := post(inst.URL(), "/orders", key, `{"amount":10}`); !r.isReplayOf(2) {
					t.Fatalf("replay on %s: %s, want the new owner's record (execution 2)", inst.Name, r)
				}
			}
			assertExecutions(t, up, key, 2)
		})
	}
}
