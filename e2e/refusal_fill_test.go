package e2e

import (
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Refused answers that are recorded cannot let one source fill the store
// (docs: "Refusals cannot fill the store"). Made-up credentials are each
// a scope of their own, so the per-client share never binds them; the
// upstream refuses every one of them (404, which is recorded: it is not in
// release_on), and none of those refusals may cost a real client its
// request.

func TestRefusalsCannotFillTheStore(t *testing.T) {
	const maxKeys = 100
	up := newUpstream(t)
	inst := startCaddy(t, "refusals", site{routes: route(up, fmt.Sprintf("\t\tstorage memory {\n\t\t\tmax_keys %d\n\t\t}", maxKeys))})

	// One source, twice as many made-up tokens as the store holds keys,
	// each with a new key; the upstream refuses them all.
	got := make(map[string]int)
	for i := range 2 * maxKeys {
		key := fmt.Sprintf("guess-%d", i)
		r := post(inst.URL(), "/orders", key, `{"amount":10}`,
			"Authorization", fmt.Sprintf("Bearer made-up-%d", i), "X-Upstream-Status", "404")
		if r.err != nil {
			t.Fatalf("made-up token %d: %v", i, r.err)
		}
		if i == 0 && (r.status != http.StatusNotFound || r.execution() != 1) {
			t.Fatalf("the first made-up token got %s, want the upstream's refusal (404)", r)
		}
		got[fmt.Sprintf("%d %s", r.status, r.problem())]++
	}
	t.Logf("the made-up tokens got: %s", tally(got))

	// A real client's new key runs, once.
	const key = "order-1"
	real := post(inst.URL(), "/orders", key, `{"amount":10}`, "Authorization", "Bearer real-client")
	if !real.isNew() {
		t.Fatalf("a real client's new key, after %d refusals to made-up tokens: %s (problem %q), want the upstream's 201",
			2*maxKeys, real, real.problem())
	}
	if again := post(inst.URL(), "/orders", key, `{"amount":10}`, "Authorization", "Bearer real-client"); !again.isReplayOf(1) {
		t.Fatalf("the real client's retry: %s (replayed %v), want the replay of execution 1", again, again.replayed())
	}
	assertExecutions(t, up, key, 1)
}

// tally prints counts by name, sorted.
func tally(m map[string]int) string {
	var parts []string
	for k, n := range m {
		parts = append(parts, fmt.Sprintf("%s: %d", strings.TrimSpace(k), n))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// A store that is full of live records has room again only once the first
// of them expires: a 503 store-full that says when to retry must not name
// a moment before that, or every client that obeys it retries into the
// same 503 (RFC 9110: Retry-After is how long the client ought to wait).
// The store is filled the documented way (many scopes the upstream
// accepts); nothing is in flight, and nothing else frees a record.
func TestAFullStoreNeverAsksForARetryBeforeItCanHaveRoom(t *testing.T) {
	const maxKeys = 20
	const ttl = time.Hour
	up := newUpstream(t)
	inst := startCaddy(t, "full", site{routes: route(up, fmt.Sprintf("\t\tttl %s\n\t\tstorage memory {\n\t\t\tmax_keys %d\n\t\t}", ttl, maxKeys))})

	filledFrom := time.Now() // no record can expire before filledFrom + ttl
	for i := range maxKeys {
		if r := post(inst.URL(), "/orders", fmt.Sprintf("fill-%d", i), `{}`, "Authorization", fmt.Sprintf("Bearer client-%d", i)); !r.isNew() {
			t.Fatalf("filling the store, request %d: %s, want the upstream's 201", i, r)
		}
	}
	full := post(inst.URL(), "/orders", "one-too-many", `{}`, "Authorization", "Bearer client-late")
	asked := time.Now()
	if full.status != http.StatusServiceUnavailable || full.problem() != "urn:caddy-idempotency:store-full" {
		t.Fatalf("a new key in a full store: %s (problem %q), want 503 store-full", full, full.problem())
	}
	retryAfter := full.header.Get("Retry-After")
	if retryAfter == "" {
		return // saying nothing is no lie
	}
	var retryAt time.Time
	if secs, err := strconv.Atoi(retryAfter); err == nil {
		retryAt = asked.Add(time.Duration(secs) * time.Second)
	} else if at, err := http.ParseTime(retryAfter); err == nil {
		retryAt = at
	} else {
		t.Fatalf("Retry-After %q is neither seconds nor an HTTP date", retryAfter)
	}
	if room := filledFrom.Add(ttl); retryAt.Before(room.Add(-time.Second)) {
		t.Fatalf("Retry-After %q asks for a retry %s from now, but the first record of the full store expires no sooner than %s from now: the retry meets the same 503",
			retryAfter, retryAt.Sub(asked).Round(time.Second), room.Sub(asked).Round(time.Second))
	}
}
