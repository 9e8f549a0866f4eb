package e2e

import (
	"fmt"
	"testing"
	"time"
)

// Thousands of requests in flight at once, each holding a lease, must all
// keep their leases: docs/guarantees.md, "The guarantee holds at
// production scale and timing: thousands of concurrent leases". Guards
// the review's finding A: on PostgreSQL with lock_timeout 2s, 1,500
// concurrent 12 s requests with distinct keys, each retried after more
// than lock_timeout while it still ran, ran the upstream twice for 508
// keys. Each lease was renewed on its own, every tenth of lock_timeout,
// with a deadline of a twentieth: thousands of renewals a second queued
// for the pool's connections (PostgreSQL) or the store's two pipeline
// workers (Redis), behind reservations and completions, missed their
// deadlines, and leases lapsed under requests that were still running.
//
// The review's figures (2,000 leases per instance, 12 s, lock_timeout 2s,
// PostgreSQL's default pool of 16) are sized for a larger machine than
// make test's (two CPUs, shared with the race-instrumented test binary
// that drives the load, and with whatever else runs). These are scaled to
// fail there every time on the code of the finding, by the same
// mechanism, and to run in under a minute each:
//
//   - scaleLease is lock_timeout 2s, the review's: five renewals a second
//     per lease, each with a 100 ms deadline on the code of the finding.
//     (At the floor, 1s, the fixed code's batch of 2,500 renewals must
//     land within half a second ten times a second on one CPU: a machine
//     loaded with other test packages once kept it from doing so for 11
//     leases, which is the bound of docs/guarantees.md, not a bug);
//   - Caddy runs with GOMAXPROCS=1, as in a container limited to one CPU
//     (Go sizes GOMAXPROCS by the CPU quota): what it can spend on
//     renewals is then about the same whether the machine is otherwise
//     idle or busy with other tests. Without it, today's code kept all
//     but 9 and 17 of 2,500 Redis leases on an idle machine, and lost
//     most of them on a busy one;
//   - PostgreSQL: 1,000 leases on a pool of 4 connections (max_conns 4,
//     also kind to a test server the other packages share): 5,000
//     renewals a second for 4 connections;
//   - Redis: 2,500 leases (12,500 renewals a second, each sent on its
//     own through the store's two pipeline workers).
//
// The first requests are held at the upstream until every retry has been
// answered, and the retries go 3 lock_timeouts after the last first
// request started, so that the test does not depend on how long the load
// takes to start (2 to 15 s here, depending on what else ran).
//
// Measured on the code of the finding: at lock_timeout 1s (3 runs) the
// upstream ran 2,500, 1,109 and 1,146 of 2,500 keys twice on Redis, and
// 988, 982 and 979 of 1,000 on PostgreSQL; at 2s, 2,019 of 2,500 and 913
// of 1,000. With renewals batched per store and tick, every retry gets
// 409 and every key runs once, in about 25 s for both stores.
func TestThousandsOfConcurrentLeasesAreKeptAlive(t *testing.T) {
	for _, tc := range []struct {
		name string
		keys int
		open func(t *testing.T) backend
	}{
		{"redis", scaleLeasesRedis, func(t *testing.T) backend { return onRedis(t, sharedRedisAddr(t), "") }},
		{"postgres", scaleLeasesPostgres, func(t *testing.T) backend {
			return onPostgresWith(t, fmt.Sprintf("\tmax_conns %d", scalePostgresConns))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := tc.open(t)
			// A request holds a connection to Caddy and one from Caddy to
			// the upstream, its retry another: this process opens about
			// three per key, Caddy (which raises its own limit) two.
			needFiles(t, uint64(3*tc.keys+256))
			t.Setenv("GOMAXPROCS", "1") // for Caddy, started below
			up := newHoldingUpstream(t)
			inst := startCaddy(t, "caddy", site{routes: leaseLoadRoute(up, store.storage, scaleLease)})
			leaseLoad{prefix: "scale", keys: tc.keys, lease: scaleLease, retryAfter: 3 * scaleLease}.run(t, up, inst).check(t)
		})
	}
}

// The scale of TestThousandsOfConcurrentLeasesAreKeptAlive, and why, in
// its comment: lock_timeout, leases in flight at once per store, and the
// PostgreSQL pool.
const (
	scaleLease          = 2 * time.Second
	scaleLeasesRedis    = 2500
	scaleLeasesPostgres = 1000
	scalePostgresConns  = 4
)
