package e2e

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
)

// The features beyond the draft: observe mode, keys from the body,
// ignored fingerprint members, Prefer: wait, and 422s that name what
// differs. Each runs on every store.

// observedCount is caddy_http_idempotency_observed_total{outcome}, summed
// over the instance's servers.
func observedCount(t *testing.T, inst *caddyproc.Instance, outcome string) int {
	t.Helper()
	status, body := adminGet(t, inst, "/metrics")
	if status != 200 {
		t.Fatalf("admin /metrics: %d", status)
	}
	series := `caddy_http_idempotency_observed_total{outcome="` + outcome + `",`
	total, found := 0.0, false
	for line := range strings.SplitSeq(string(body), "\n") {
		if !strings.HasPrefix(line, series) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		n, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		total, found = total+n, true
	}
	if !found {
		t.Fatalf("no series %s...} in /metrics", series)
	}
	return int(total)
}

// untouched fails unless r is the upstream's own answer, with nothing
// added by the idempotency handler.
func untouched(t *testing.T, what string, r reply, execution int) {
	t.Helper()
	if !r.isNew() || r.execution() != execution || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("%s: %s, want the upstream's answer (execution %d) with nothing added", what, describe(r), execution)
	}
}

func TestObserveModeChangesNothingAndCountsWhatItWouldHaveDone(t *testing.T) {
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			store := b.open(t)
			up := newUpstream(t)
			inst := startCaddy(t, "caddy", site{
				globals: "metrics",
				routes: fmt.Sprintf("\thandle /required/* {\n\t\tidempotency {\n\t\t\tmode observe\n\t\t\trequired\n\t\t\t%s\n\t\t}\n\t\treverse_proxy %s\n\t}\n", store.storage, up.Addr) +
					fmt.Sprintf("\thandle {\n\t\tidempotency {\n\t\t\tmode observe\n\t\t\tmax_body_size 64\n\t\t\t%s\n\t\t}\n\t\treverse_proxy %s\n\t}\n", store.storage, up.Addr),
			})
			body := `{"amount":10}`
			untouched(t, "first", post(inst.URL(), "/orders", "obs-1", body), 1)
			untouched(t, "retry (a replay in enforce mode)", post(inst.URL(), "/orders", "obs-1", body), 2)
			untouched(t, "reuse with another body (a 422 in enforce mode)", post(inst.URL(), "/orders", "obs-1", `{"amount":11}`), 3)
			untouched(t, "keyless POST on a required route (a 400 in enforce mode)", post(inst.URL(), "/required/x", "", body), 1)
			untouched(t, "malformed key (a 400 in enforce mode)", post(inst.URL(), "/orders", "a b", body), 1)
			big := `{"pad":"` + strings.Repeat("x", 200) + `"}`
			if r := post(inst.URL(), "/orders", "obs-big", big); !r.isNew() || !strings.Contains(string(r.body), `"request_bytes":`+strconv.Itoa(len(big))) {
				t.Fatalf("body over max_body_size (a 413 in enforce mode): %s, want the upstream to get the whole body", describe(r))
			}
			// The first record was never overwritten: a later identical
			// request is still classified as a replay of it.
			untouched(t, "another retry", post(inst.URL(), "/orders", "obs-1", body), 4)
			for outcome, want := range map[string]int{"new": 1, "replayed": 2, "mismatch": 1, "missing": 1, "invalid": 1, "too_large": 1} {
				if got := observedCount(t, inst, outcome); got != want {
					t.Errorf("observed_total{outcome=%q} = %d, want %d", outcome, got, want)
				}
			}
		})
	}
}

func TestObserveModeIgnoresAStoreThatIsDown(t *testing.T) {
	for _, tc := range []struct{ name, storage string }{
		{"redis", "storage redis {\n\turl redis://127.0.0.1:1/0\n\ttimeout 300ms\n\tdial_timeout 300ms\n}"},
		{"postgres", "storage postgres {\n\tdsn \"postgres://postgres@127.0.0.1:1/test?connect_timeout=1\"\n\ttimeout 300ms\n}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t)
			inst := startCaddy(t, "caddy", site{globals: "metrics", routes: route(up, "mode observe\n"+tc.storage)})
			for i := 1; i <= 2; i++ {
				untouched(t, fmt.Sprintf("request %d with the store down", i), post(inst.URL(), "/orders", "down", `{}`), i)
			}
			if got := observedCount(t, inst, "store_error"); got != 2 {
				t.Errorf("observed_total{outcome=store_error} = %d, want 2", got)
			}
		})
	}
}

func TestKeysFromTheJSONBodyDeduplicateWebhooks(t *testing.T) {
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			store := b.open(t)
			up := newUpstream(t)
			inst := startCaddy(t, "caddy", site{routes: route(up, "key_json /id\nrequired\n"+store.storage)})
			event := `{"id":"evt_1","type":"payment_intent.succeeded","data":{"amount":10}}`
			// The counting upstream counts by Idempotency-Key: none here.
			if r := post(inst.URL(), "/orders", "", event); !r.isNew() || r.execution() != 1 {
				t.Fatalf("first delivery: %s", describe(r))
			}
			if r := post(inst.URL(), "/orders", "", event); !r.isReplayOf(1) {
				t.Fatalf("redelivery: %s, want the replay", describe(r))
			}
			if r := post(inst.URL(), "/orders", "", `{"id":"evt_1","type":"charge.failed"}`); r.status != 422 || r.problem() != "urn:caddy-idempotency:key-reused" {
				t.Fatalf("another body with the same /id: %s, want 422", describe(r))
			}
			// The header wins: this is another key, whatever the body says.
			if r := post(inst.URL(), "/orders", "header-key", event); !r.isNew() {
				t.Fatalf("the same body with a key header: %s, want a run under the header's key", describe(r))
			}
			if r := post(inst.URL(), "/orders", "", `{"type":"no id"}`); r.status != 400 || r.problem() != "urn:caddy-idempotency:key-missing" || !strings.Contains(string(r.body), "/id") {
				t.Fatalf("a body without /id on a required route: %s, want 400 naming /id", describe(r))
			}
			if r := post(inst.URL(), "/orders", "", `{"id":12345}`); !r.isNew() {
				t.Fatalf("an integer id: %s", describe(r))
			}
			if r := post(inst.URL(), "/orders", "", `{"id":12345}`); !r.replayed() {
				t.Fatalf("an integer id again: %s, want a replay", describe(r))
			}
			if r := post(inst.URL(), "/orders", "", `{"id":"has space"}`); r.status != 400 || r.problem() != "urn:caddy-idempotency:key-invalid" {
				t.Fatalf("an id outside the key syntax: %s, want 400", describe(r))
			}
			if got := up.Total(); got != 3 {
				t.Fatalf("upstream ran %d times, want 3 (evt_1, header-key, 12345)", got)
			}
		})
	}
}

func TestIgnoredMembersDoNotMakeRetriesMismatch(t *testing.T) {
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			store := b.open(t)
			up := newUpstream(t)
			inst := startCaddy(t, "caddy", site{routes: route(up, "fingerprint {\n\tignore /sent_at /meta/nonce\n}\n"+store.storage)})
			if r := post(inst.URL(), "/orders", "ig", `{"amount":10,"sent_at":"12:00:00","meta":{"nonce":"a","k":1}}`); !r.isNew() {
				t.Fatalf("first: %s", describe(r))
			}
			if r := post(inst.URL(), "/orders", "ig", `{"meta":{"k":1,"nonce":"b"},"sent_at":"12:00:05","amount":10}`); !r.isReplayOf(1) {
				t.Fatalf("retry with a new sent_at and nonce: %s, want the replay", describe(r))
			}
			if r := post(inst.URL(), "/orders", "ig", `{"amount":11,"sent_at":"12:00:09","meta":{"nonce":"c","k":1}}`); r.status != 422 {
				t.Fatalf("retry with another amount: %s, want 422", describe(r))
			}
			assertExecutions(t, up, "ig", 1)
		})
	}
}

// TestARetryWaitsForTheFirstRequestByDefault: with default options, a
// retry sent while the first request runs waits for it and gets its
// answer (real SDKs give up on a 409 within a second or two and then send
// the intent again under a new key); one whose first request outlasts
// wait_timeout gets 409 with Retry-After once it has waited that long.
func TestARetryWaitsForTheFirstRequestByDefault(t *testing.T) {
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			store := b.open(t)
			up := newUpstream(t)
			inst := startCaddy(t, "caddy", site{routes: route(up, store.storage+"\nwait_timeout 2s")})
			first := running(t, up, inst, "dw", `{"amount":10}`, 1500*time.Millisecond)
			if r := post(inst.URL(), "/orders", "dw", `{"amount":10}`); !r.isReplayOf(1) {
				t.Fatalf("retry while the first runs: %s, want it to wait and get the first's answer", describe(r))
			}
			if f := <-first; !f.isNew() {
				t.Fatalf("first: %s", describe(f))
			}
			assertExecutions(t, up, "dw", 1)

			long := running(t, up, inst, "dl", `{"amount":10}`, 5*time.Second)
			sent := time.Now()
			r := post(inst.URL(), "/orders", "dl", `{"amount":10}`)
			if !r.isConflict() || r.header.Get("Retry-After") == "" || time.Since(sent) < 2*time.Second {
				t.Fatalf("retry while a first request of 5s runs, wait_timeout 2s: %s after %s, want 409 with Retry-After after waiting 2s", describe(r), time.Since(sent).Round(time.Millisecond))
			}
			<-long
			assertExecutions(t, up, "dl", 1)
		})
	}
}

func TestPreferWaitWaitsForTheFirstRequestOnARejectRoute(t *testing.T) {
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			store := b.open(t)
			up := newUpstream(t)
			inst := startCaddy(t, "caddy", site{routes: route(up, "in_flight reject\n"+store.storage)})
			first := running(t, up, inst, "pw", `{"amount":10}`, 1500*time.Millisecond)
			if r := post(inst.URL(), "/orders", "pw", `{"amount":10}`); !r.isConflict() || r.header.Get("Preference-Applied") != "" {
				t.Fatalf("retry without a preference while the first runs: %s, want 409", describe(r))
			}
			r := post(inst.URL(), "/orders", "pw", `{"amount":10}`, "Prefer", "respond-async, wait=5")
			if !r.isReplayOf(1) || r.header.Get("Preference-Applied") != "wait=5" {
				t.Fatalf("retry with Prefer: wait=5 while the first runs: %s Preference-Applied=%q, want the replay and wait=5", describe(r), r.header.Get("Preference-Applied"))
			}
			if f := <-first; !f.isNew() {
				t.Fatalf("first: %s", describe(f))
			}
			assertExecutions(t, up, "pw", 1)
		})
	}
}

func TestMismatchNamesWhatDiffersWithoutValues(t *testing.T) {
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			store := b.open(t)
			up := newUpstream(t)
			inst := startCaddy(t, "caddy", site{routes: route(up, store.storage)})
			if r := post(inst.URL(), "/orders", "df", `{"amount":731904,"currency":"EUR"}`); !r.isNew() {
				t.Fatalf("first: %s", describe(r))
			}
			r := post(inst.URL(), "/orders", "df", `{"amount":582216,"currency":"EUR","memo":"qzx-private"}`)
			if r.status != 422 {
				t.Fatalf("reuse with another amount: %s, want 422", describe(r))
			}
			var p struct {
				Detail  string   `json:"detail"`
				Differs []string `json:"differs"`
			}
			if err := json.Unmarshal(r.body, &p); err != nil {
				t.Fatalf("problem %q: %v", r.body, err)
			}
			if want := []string{"body", "/amount", "/memo"}; !slices.Equal(p.Differs, want) {
				t.Errorf("differs %q, want %q", p.Differs, want)
			}
			if !strings.Contains(p.Detail, "/amount") {
				t.Errorf("detail %q does not name /amount", p.Detail)
			}
			all := string(r.body) + fmt.Sprint(r.header)
			for _, v := range []string{"731904", "582216", "EUR", "qzx-private"} {
				if strings.Contains(all, v) {
					t.Errorf("the 422 carries the value %q: %s %v", v, r.body, r.header)
				}
			}
		})
	}
}
