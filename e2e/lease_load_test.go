package e2e

import (
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// The leases of many long requests at once (scale_test.go), and of
// requests whose store is a network hop away (latency_test.go): n first
// requests with distinct keys, held at the upstream for as long as the
// test needs, and a retry of every key once its first request has run
// for more than lock_timeout, while it still runs. A lease kept alive
// answers the retry 409 (the routes say in_flight reject); a lease that
// lapsed lets the retry take the key over, and the upstream runs that
// key twice. The tests count executions per key at the upstream, which
// is what the guarantee is about.

// leaseLoad is one such load.
type leaseLoad struct {
	prefix string        // of the keys: prefix-0000, prefix-0001, ...
	keys   int           // distinct keys, all sent at once
	lease  time.Duration // the route's lock_timeout
	// retryAfter is how long after every first request runs the retries
	// go: more than lease, so that a lease not renewed has lapsed by then.
	retryAfter time.Duration
}

// leaseLoadRoute is the handler of these tests on storage: lock_timeout
// lease, and in_flight reject, so that a retry of a key in flight gets its
// 409 at once instead of waiting (waiters would add load of their own).
func leaseLoadRoute(up *holdingUpstream, storage string, lease time.Duration) string {
	return fmt.Sprintf("\tidempotency {\n%s\nlock_timeout %s\nin_flight reject\n\t}\n\treverse_proxy %s\n", storage, lease, up.Addr)
}

// leaseLoadResult is what a load did.
type leaseLoadResult struct {
	keys       int
	ranTwice   []string       // keys the upstream ran more than once, with how often
	refused    []string       // first requests answered before they reached the upstream
	firstsOff  []string       // first requests that did not get their own execution
	retries    map[string]int // the retries' answers, by kind
	retriesOff []string       // retries answered otherwise than 409
	started    time.Duration  // how long until every first request had reached the upstream
	took       time.Duration  // the whole load
}

func (r leaseLoadResult) summary() string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(r.retries)) {
		fmt.Fprintf(&b, " %s %d,", k, r.retries[k])
	}
	return fmt.Sprintf("the upstream ran %d of %d keys twice; retries:%s; %d first requests did not reach the upstream, %d did not get their own execution; all first requests running after %s, the load took %s",
		len(r.ranTwice), r.keys, strings.TrimSuffix(b.String(), ","), len(r.refused), len(r.firstsOff), r.started.Round(time.Millisecond), r.took.Round(time.Millisecond))
}

// check fails the test unless every key ran once, every first request got
// its own execution and every retry 409.
func (r leaseLoadResult) check(t *testing.T) {
	t.Helper()
	t.Log(r.summary())
	examples := func(s []string, n int) string { return strings.Join(s[:min(n, len(s))], "; ") }
	if len(r.ranTwice) > 0 {
		t.Errorf("the upstream ran %d of %d keys twice: their leases lapsed while their first requests ran, and the retries took them over (e.g. %s)",
			len(r.ranTwice), r.keys, examples(r.ranTwice, 5))
	}
	if len(r.retriesOff) > 0 {
		t.Errorf("%d of %d retries were not answered 409 while their first requests ran, e.g. %s", len(r.retriesOff), r.keys, examples(r.retriesOff, 3))
	}
	if len(r.refused) > 0 {
		t.Errorf("%d of %d first requests were answered without reaching the upstream, e.g. %s", len(r.refused), r.keys, examples(r.refused, 3))
	}
	if len(r.firstsOff) > 0 {
		t.Errorf("%d of %d first requests did not get their own execution, e.g. %s", len(r.firstsOff), r.keys, examples(r.firstsOff, 3))
	}
}

// run sends the load to inst in front of up. The first requests are held
// at the upstream until every retry has been answered: however long the
// load takes to start on a slow machine, each retry comes while its first
// request runs, and more than lock_timeout after it started.
func (l leaseLoad) run(t *testing.T, up *holdingUpstream, inst *caddyproc.Instance) leaseLoadResult {
	t.Helper()
	const body = `{"amount":10}`
	res := leaseLoadResult{keys: l.keys, retries: make(map[string]int)}
	keys := make([]string, l.keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%04d", l.prefix, i)
	}
	firsts := make([]reply, l.keys)
	firstDone := make([]chan struct{}, l.keys)
	var firstsWG sync.WaitGroup
	released := false
	defer func() {
		if !released { // a test that failed midway lets its requests end
			up.release()
			firstsWG.Wait()
		}
	}()
	began := time.Now()
	for i, key := range keys {
		firstDone[i] = make(chan struct{})
		firstsWG.Go(func() {
			defer close(firstDone[i])
			firsts[i] = post(inst.URL(), "/orders", key, body, holdHeader, "1")
		})
	}
	ended := func(i int) bool {
		select {
		case <-firstDone[i]:
			return true
		default:
			return false
		}
	}
	// Every first request runs at the upstream, or was answered without
	// (a reservation refused: counted, not waited for).
	testutil.Eventually(t, 2*time.Minute, fmt.Sprintf("all %d requests to reach the upstream", l.keys), func() bool {
		for i, key := range keys {
			if up.executions(key) == 0 && !ended(i) {
				return false
			}
		}
		return true
	})
	res.started = time.Since(began)

	// Once every first request has run for more than lock_timeout, the
	// retries, not held, so that one that took its key over is answered
	// at once.
	if l.retryAfter <= l.lease {
		t.Fatalf("retryAfter %s must be longer than the lease, %s", l.retryAfter, l.lease)
	}
	time.Sleep(l.retryAfter)
	retries := make([]reply, l.keys)
	var retriesWG sync.WaitGroup
	for i, key := range keys {
		retriesWG.Go(func() { retries[i] = post(inst.URL(), "/orders", key, body) })
	}
	retriesWG.Wait()
	up.release()
	released = true
	firstsWG.Wait()
	res.took = time.Since(began)

	for i, key := range keys {
		if n := up.executions(key); n > 1 {
			res.ranTwice = append(res.ranTwice, fmt.Sprintf("%s (%d executions)", key, n))
		}
		f := firsts[i]
		switch {
		case f.err == nil && f.execution() == 0:
			res.refused = append(res.refused, key+": "+describe(f))
		case !f.isNew() || f.execution() != 1:
			res.firstsOff = append(res.firstsOff, key+": "+describe(f))
		}
		r := retries[i]
		kind := "409"
		switch {
		case r.isConflict():
		case r.err != nil:
			kind = "error"
		case r.isNew():
			kind = "ran again"
		case r.problem() != "":
			kind = fmt.Sprintf("%d %s", r.status, strings.TrimPrefix(r.problem(), "urn:caddy-idempotency:"))
		default:
			kind = fmt.Sprint(r.status)
		}
		res.retries[kind]++
		if kind != "409" {
			res.retriesOff = append(res.retriesOff, key+": "+describe(r))
		}
	}
	return res
}

// holdHeader marks a request the holdingUpstream holds until release.
const holdHeader = "X-Hold-Until-Released"

// holdingUpstream answers 201 with the request's execution number for its
// Idempotency-Key (as caddyproc.Upstream does), at once, or, for requests
// with holdHeader, once the test calls release: requests that run for as
// long as the test needs, whatever the machine's speed.
type holdingUpstream struct {
	Addr string

	mu       sync.Mutex
	perKey   map[string]int
	released chan struct{}
	once     sync.Once
	srv      *http.Server
}

func newHoldingUpstream(t *testing.T) *holdingUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &holdingUpstream{Addr: ln.Addr().String(), perKey: make(map[string]int), released: make(chan struct{})}
	u.srv = &http.Server{Handler: u, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = u.srv.Serve(ln) }()
	t.Cleanup(func() {
		u.release()
		u.srv.Close()
	})
	return u
}

func (u *holdingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	key := r.Header.Get("Idempotency-Key")
	u.mu.Lock()
	u.perKey[key]++
	n := u.perKey[key]
	u.mu.Unlock()
	if r.Header.Get(holdHeader) != "" {
		<-u.released
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Key-Execution", strconv.Itoa(n))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"key_execution":%d}`, n)
}

// executions is how many requests with key arrived.
func (u *holdingUpstream) executions(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.perKey[key]
}

// release lets every held request, and every later one, answer.
func (u *holdingUpstream) release() { u.once.Do(func() { close(u.released) }) }

// needFiles makes sure this process may open n files (connections) at
// once, raising its soft limit up to the hard one if need be. Go programs
// raise their own soft limit at start (so does Caddy); this only matters
// on a machine whose hard limit is low, where the test cannot run.
func needFiles(t *testing.T, n uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatalf("getrlimit: %v", err)
	}
	if lim.Cur >= n {
		return
	}
	if lim.Max >= n {
		lim.Cur = n
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			t.Fatalf("setrlimit: %v", err)
		}
		return
	}
	testutil.Unavailable(t, "this test opens about %d connections; the open file limit is %d (raise it with ulimit -n)", n, lim.Max)
}
