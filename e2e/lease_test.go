package e2e

import (
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
)

// An upstream that works three times lock_timeout keeps its lease by
// renewal: retries on the same and on another instance get 409 all along,
// never a takeover, and the upstream runs once.
func TestLongRequestKeepsItsLeaseAndRunsOnce(t *testing.T) {
	for _, b := range sharedBackends {
		t.Run(b.name, func(t *testing.T) {
			up, a, bb := twoInstances(t, b.open(t))

			const key = "order-long"
			work := 3 * lockTimeout
			started := time.Now()
			first := running(t, up, a, key, `{"amount":10}`, work)

			var lastConflict time.Duration
			conflicts := 0
			instances := []*caddyproc.Instance{a, bb}
		retrying:
			for i := 0; ; i++ {
				select {
				case r := <-first:
					if !r.isNew() || r.execution() != 1 {
						t.Fatalf("first request: %s", r)
					}
					break retrying
				case <-time.After(300 * time.Millisecond):
				}
				inst := instances[i%2]
				switch r := post(inst.URL(), "/orders", key, `{"amount":10}`); {
				case r.isConflict():
					conflicts++
					lastConflict = time.Since(started)
				case r.isReplayOf(1): // the first request finished meanwhile
				default:
					t.Fatalf("retry %d on %s at %s: %s, want 409 while the first runs", i, inst.Name, time.Since(started).Round(time.Millisecond), r)
				}
			}
			t.Logf("%d retries got 409, the last %s after the first request started (lock_timeout %s)", conflicts, lastConflict.Round(time.Millisecond), lockTimeout)
			if lastConflict < work-lockTimeout {
				t.Fatalf("last 409 came %s after the start, want one after %s: the lease was not shown to outlive lock_timeout", lastConflict, work-lockTimeout)
			}
			for _, inst := range instances {
				if r := post(inst.URL(), "/orders", key, `{"amount":10}`); !r.isReplayOf(1) {
					t.Fatalf("retry on %s after completion: %s, want a replay", inst.Name, r)
				}
			}
			assertExecutions(t, up, key, 1)
		})
	}
}
