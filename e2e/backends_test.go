package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
)

// allBackends are sharedBackends and the memory store: for behaviour
// that must hold whichever store keeps the records.
var allBackends = append([]struct {
	name string
	open func(t *testing.T) backend
}{{"memory", onMemory}}, sharedBackends...)

// onMemory is the memory store of the instance. Only its storage block is
// set: nothing outside Caddy can look into it.
func onMemory(*testing.T) backend {
	return backend{storage: "storage memory"}
}

// omittedReplay fails unless r replays a recorded response of status
// whose body was not kept: Idempotent-Replayed and
// Idempotent-Body-Omitted, and no body.
func omittedReplay(t *testing.T, what string, r reply, status int) {
	t.Helper()
	if r.err != nil || r.status != status || !r.replayed() || r.header.Get("Idempotent-Body-Omitted") != "true" || len(r.body) != 0 {
		t.Fatalf("%s: %s, want a replay of the recorded %d with Idempotent-Body-Omitted: true and no body", what, describe(r), status)
	}
}

// describe shows a reply with the headers that tell its story, and the
// error even when a status came first (a body broken off).
func describe(r reply) string {
	var b strings.Builder
	if r.status != 0 {
		fmt.Fprintf(&b, "%d", r.status)
		for _, h := range []string{"Idempotent-Replayed", "Idempotent-Body-Omitted", "X-Key-Execution", "Retry-After"} {
			if v := r.header.Values(h); len(v) > 0 {
				fmt.Fprintf(&b, " %s=%q", h, v)
			}
		}
		if p := r.problem(); p != "" {
			fmt.Fprintf(&b, " problem %s", p)
		} else {
			body := r.body
			if len(body) > 200 {
				body = append(body[:200:200], "..."...)
			}
			fmt.Fprintf(&b, " body(%d bytes)=%q", len(r.body), body)
		}
	}
	if r.err != nil {
		fmt.Fprintf(&b, " error: %v", r.err)
	}
	return strings.TrimSpace(b.String())
}

// retryPast409 sends key until the answer is not a 409, for within at
// most: a retry sent the moment the first request's client saw its
// answer end may still find the record being written.
func retryPast409(inst *caddyproc.Instance, key, body string, within time.Duration, header ...string) reply {
	deadline := time.Now().Add(within)
	for {
		r := post(inst.URL(), "/orders", key, body, header...)
		if !r.isConflict() || time.Now().After(deadline) {
			return r
		}
		time.Sleep(50 * time.Millisecond)
	}
}
