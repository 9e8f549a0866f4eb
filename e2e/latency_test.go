package e2e

import (
	"testing"
	"time"
)

// A store a network hop away (another zone, a managed service) must not
// cost leases: docs/guarantees.md, "The guarantee holds at production
// scale and timing: ... a store tens of milliseconds away". Guards the
// review's finding B: with the store 30 ms away each way and lock_timeout
// 2s, 400 concurrent 8 s requests, each retried after more than
// lock_timeout while it still ran, ran twice for 49 of 50 keys on Redis
// and 6 of 50 on PostgreSQL. A renewal had a deadline of a twentieth of
// lock_timeout (100 ms) for a round trip of 60 ms or more, and queued for
// a pool connection (PostgreSQL: each renewal holds one for a whole round
// trip) or for one of the two pipeline workers (Redis: a worker waits a
// round trip per pipeline), behind reservations and completions; leases
// lapsed under requests that were still running.
//
// Each store is reached through a caddyproc.Proxy that delays every byte
// by storeHopOneWay (plus up to storeHopJitter), both ways. The lease
// counts fail every time here on the code of the finding, and keep the
// test short: PostgreSQL (its default pool of 16) lost 14 of 50 and 34
// to 53 of 100 leases, 400 lose most; Redis kept all of 100, and all of
// 400 in one run of two, and loses most of 600 in every run (600 leases
// make 3,000 renewals a second, more than two pipeline workers carry
// when each pipeline waits a round trip).
//
// As in the scale tests, the first requests are held at the upstream
// until every retry has been answered; the retries go 3 lock_timeouts
// after the last first request started.
//
// Measured on the code of the finding (3 runs): the upstream ran 473, 513
// and 384 of 600 keys twice on Redis, and 342, 310 and 359 of 400 on
// PostgreSQL; about 11 and 13 s. With renewals batched per store and tick
// (a prototype of the fix), every retry got 409, in about 14 and 9 s.
func TestLeasesOfAStoreANetworkHopAwayAreKeptAlive(t *testing.T) {
	for _, tc := range []struct {
		name string
		keys int
		open func(t *testing.T) backend
	}{
		{"redis", storeHopLeasesRedis, func(t *testing.T) backend { return onRedis(t, sharedRedisAddr(t), "") }},
		{"postgres", storeHopLeasesPostgres, onPostgres},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := tc.open(t)
			needFiles(t, uint64(3*tc.keys+256))
			hop := proxyTo(t, store.addr)
			hop.SetLatency(storeHopOneWay, storeHopJitter)
			up := newHoldingUpstream(t)
			inst := startCaddy(t, "caddy", site{routes: leaseLoadRoute(up, store.storageAt(hop.Addr), storeHopLease)})
			leaseLoad{prefix: "hop", keys: tc.keys, lease: storeHopLease, retryAfter: 3 * storeHopLease}.run(t, up, inst).check(t)
		})
	}
}

// The store hop of TestLeasesOfAStoreANetworkHopAwayAreKeptAlive: the
// review's 30 ms each way, a few milliseconds of jitter, lock_timeout 2s;
// and the leases in flight at once per store (why these, in the test's
// comment).
const (
	storeHopOneWay         = 30 * time.Millisecond
	storeHopJitter         = 5 * time.Millisecond
	storeHopLease          = 2 * time.Second
	storeHopLeasesRedis    = 600
	storeHopLeasesPostgres = 400
)
