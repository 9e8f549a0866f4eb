package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/soak/history"
)

// route is a path prefix of every instance's site: an idempotency handler
// on one store.
type route struct {
	path     string // "/redis/"
	store    string
	failOpen bool
}

// routes are the sites' routes; the fail_open ones share their store
// (and its key namespace) with /redis/ and /postgres/. /memory/ has a
// store of its own in each instance, with a small max_keys (-fill): its
// intents are pinned to one instance.
var routes = []route{
	{"/redis/", history.Redis, false},
	{"/postgres/", history.Postgres, false},
	{"/open/", history.Redis, true},
	{"/pgopen/", history.Postgres, true},
	{"/memory/", history.Memory, false},
}

// routeAt returns the route of path.
func routeAt(path string) route {
	for _, r := range routes {
		if r.path == path {
			return r
		}
	}
	panic("no route " + path)
}

// on puts in on route r.
func (in *intentSpec) on(r route) {
	in.Path, in.Store, in.FailOpen = r.path+"orders", r.store, r.failOpen
}

// intentSpec is an intent and its request body.
type intentSpec struct {
	history.Intent
	body []byte
	// lag is when each sender after the first starts, after the first.
	lag []time.Duration
	// size, when > 0, is the streamed answer every attempt asks for;
	// status, when > 0, the status every attempt asks for (a made-up
	// credential's 404).
	size, status int
	// silence and silentAt, with size, are the silence every attempt
	// asks of the upstream (see behaviour).
	silence  time.Duration
	silentAt int
}

// shape makes b ask what every attempt of in asks: its answer's size and
// silence or status, never a break-off or a failure then.
func (in *intentSpec) shape(b *behaviour) {
	if in.size > 0 {
		b.size, b.breakOff, b.fail = in.size, false, ""
		b.silence, b.silentAt = in.silence, in.silentAt
	}
	if in.status > 0 {
		b.status, b.breakOff, b.fail = in.status, false, ""
	}
}

// rngFor is a random source of its own for one part of the workload
// (a worker's n-th intent, one of its senders, the sweep of an intent),
// so that what each part draws depends on the seed alone, not on how
// the parts interleave in time.
func rngFor(seed int64, parts ...int) *rand.Rand {
	var s uint64 = 0x9e3779b97f4a7c15
	for _, p := range parts {
		s = s*0x100000001b3 ^ uint64(p)
	}
	return rand.New(rand.NewPCG(uint64(seed), s))
}

// newIntent draws worker's n-th intent. A tenth of the keys are shared
// between clients (each in its own scope), so that an answer crossing
// scopes would show.
func newIntent(seed int64, worker, n, id int, lockTimeout time.Duration) intentSpec {
	rng := rngFor(seed, 1, worker, n)
	in := intentSpec{Intent: history.Intent{ID: id, Scope: fmt.Sprintf("Bearer soak-client-%d", worker)}}
	in.Key = fmt.Sprintf("k-%d-%d", worker, n)
	if rng.IntN(10) == 0 {
		in.Key = fmt.Sprintf("shared-%d", n)
	}
	switch p := rng.IntN(100); {
	case p < 43:
		in.on(routeAt("/redis/"))
	case p < 86:
		in.on(routeAt("/postgres/"))
	case p < 93:
		in.on(routeAt("/open/"))
	default:
		in.on(routeAt("/pgopen/"))
	}
	in.body = fmt.Appendf(nil, `{"order":"%d-%d","amount":%d,"currency":"EUR"}`, worker, n, 1+rng.IntN(100000))
	in.BodyDigest = digest(in.body)
	// Some intents are sent by several clients at once (a double submit,
	// a redelivery): the retries that meet a running request.
	switch p := rng.IntN(100); {
	case p < 30:
		in.Senders = 1
	case p < 75:
		in.Senders = 2
	default:
		in.Senders = 3
	}
	for range in.Senders - 1 {
		in.lag = append(in.lag, time.Duration(rng.Int64N(int64(lockTimeout*6/10))))
	}
	return in
}

// behaviour is what one attempt asks of the upstream and how the client
// behaves.
type behaviour struct {
	delay    time.Duration // the upstream works this long
	status   int           // 0: the upstream's default (201)
	breakOff bool          // the upstream breaks off mid-body
	hangUp   time.Duration // > 0: the client hangs up after this long
	timeout  time.Duration // the client gives up after this long
	size     int           // > 0: a body of this many bytes, streamed
	// fail is how the upstream, or the proxy in front of it, fails
	// (history.Fail*): "" for not at all.
	fail string
	// silence, with size, is how long the upstream sends nothing once
	// silentAt bytes of the answer are out (0: its headers, the answer
	// then unsized, so that Caddy hands the headers on at once).
	silence  time.Duration
	silentAt int
}

// drawBehaviour draws an attempt's behaviour. Slow executions outlast a
// renewal period (a third of lock_timeout) or the whole lease, so that
// renewals matter.
func drawBehaviour(rng *rand.Rand, L time.Duration) behaviour {
	frac := func(lo, hi float64) time.Duration { return time.Duration((lo + rng.Float64()*(hi-lo)) * float64(L)) }
	var b behaviour
	switch p := rng.IntN(100); {
	case p < 45:
		b.delay = time.Duration(rng.Int64N(int64(100 * time.Millisecond)))
	case p < 65:
		b.delay = frac(0.4, 0.95)
	default:
		// Several renewals: a lease is lost to an outage only if the
		// request still runs when it lapses.
		b.delay = frac(1.0, 2.0)
	}
	switch p := rng.IntN(100); {
	case p < 4:
		b.status = 500
	case p < 7:
		b.status = 503
	case p < 10:
		b.status = 404 // recorded like a success
	case p < 15:
		b.breakOff = true
	}
	// The ways an upstream fails: before its status once it read the
	// request (the key is kept, its outcome unknown), a refused dial (the
	// key is freed), a reset mid-body (recorded without the body).
	switch p := rng.IntN(200); {
	case p < 3:
		b.fail, b.delay, b.status, b.breakOff = history.FailTimeout, timeoutWork, 0, false
	case p < 6:
		b.fail, b.status, b.breakOff = history.FailReset, 0, false
	case p < 8:
		b.fail, b.status, b.breakOff = history.FailEOF, 0, false
	case p < 10:
		b.fail = history.FailRefused
	case p < 12:
		b.fail, b.breakOff = history.FailResetBody, false
	}
	if rng.IntN(100) < 4 {
		b.hangUp = time.Duration(rng.Int64N(int64(b.delay + 100*time.Millisecond)))
	}
	b.timeout = patience(L)
	if rng.IntN(100) < 20 { // an impatient client retries while its request runs
		b.timeout = frac(0.3, 1.5)
	}
	return b
}

// waitTimeout is the handlers' wait_timeout (the default): a request
// that meets its key in flight may wait that long before its 409.
const waitTimeout = 10 * time.Second

// patience is how long a client waits for an answer: a wait_timeout and
// two lock_timeouts, never less than four lock_timeouts.
func patience(L time.Duration) time.Duration { return max(4*L, waitTimeout+2*L) }

// digest is a short hex digest of b, for comparing bodies in a history.
func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}
