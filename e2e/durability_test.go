package e2e

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// durabilityTimeouts is caddy_http_idempotency_store_durability_timeouts_total
// for op, summed over the instance's stores.
func durabilityTimeouts(t *testing.T, inst *caddyproc.Instance, op string) int {
	t.Helper()
	status, body := adminGet(t, inst, "/metrics")
	if status != 200 {
		t.Fatalf("admin /metrics: %d", status)
	}
	total := 0.0
	for line := range strings.SplitSeq(string(body), "\n") {
		if !strings.HasPrefix(line, "caddy_http_idempotency_store_durability_timeouts_total{") || !strings.Contains(line, `op="`+op+`"`) {
			continue
		}
		n, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		total += n
	}
	return int(total)
}

// storeFacts is a Redis store's durability in GET /idempotency/stores.
type storeFacts struct {
	ID         string `json:"id"`
	Durability struct {
		Option map[string]any `json:"option"`
		Nodes  []struct {
			Addr              string `json:"addr"`
			Role              string `json:"role"`
			ConnectedReplicas string `json:"connected_replicas"`
			AppendOnly        string `json:"appendonly"`
		} `json:"nodes"`
	} `json:"durability"`
}

func redisFacts(t *testing.T, inst *caddyproc.Instance) []storeFacts {
	t.Helper()
	status, body := adminGet(t, inst, "/idempotency/stores")
	if status != 200 {
		t.Fatalf("GET /idempotency/stores: %d %s", status, body)
	}
	var stores []storeFacts
	if err := json.Unmarshal(body, &stores); err != nil {
		t.Fatalf("GET /idempotency/stores: %v: %s", err, body)
	}
	return stores
}

// TestRedisDurabilityWaitsForReplicas runs real Caddy on a private
// primary with one replica, with `durability replicas 1` on three
// routes: the default (on_storage_error fail_closed), fail_open, and
// on_timeout proceed. With the replica in sync every route runs and
// replays as without the option, and GET /idempotency/stores shows the
// option and the primary's replica. With the replica killed, WAIT times
// out: fail_closed answers 503 and never runs the upstream (the retry
// runs it once the replica is back), fail_open and proceed run it on the
// reservation the primary holds and record it (a retry is a replay), and
// their completions, short of the replica, are sent again until it is
// back and acknowledges them; each shortfall is counted in
// store_durability_timeouts_total and logged.
func TestRedisDurabilityWaitsForReplicas(t *testing.T) {
	primary := redistest.StartServer(t)
	replica := redistest.StartReplica(t, primary)
	// WAIT's timeout is generous, so that a loaded machine's replica is
	// never late while in sync.
	const durability = "\ttimeout 4s\n\tdurability replicas 1 1s"
	closed := onRedis(t, primary.Addr, durability)
	open := onRedis(t, primary.Addr, durability)
	proceed := onRedis(t, primary.Addr, durability+" on_timeout proceed")
	up := newUpstream(t)
	handle := func(path, options string) string {
		return fmt.Sprintf("\thandle /%s/* {\n\t\tidempotency {\n%s\n\t\t}\n\t\treverse_proxy %s\n\t}\n", path, options, up.Addr)
	}
	inst := startCaddy(t, "caddy", site{globals: "metrics", routes: handle("closed", closed.storage) +
		handle("open", "on_storage_error fail_open\n"+open.storage) + handle("proceed", proceed.storage)})
	base := inst.URL()

	for _, path := range []string{"/closed/x", "/open/x", "/proceed/x"} {
		key := "in-sync" + strings.ReplaceAll(path, "/", "-")
		if r := post(base, path, key, `{"a":1}`); !r.isNew() {
			t.Fatalf("%s in sync: %s, want new", path, r)
		}
		if r := post(base, path, key, `{"a":1}`); !r.isReplayOf(1) {
			t.Fatalf("%s in sync, again: %s, want a replay", path, r)
		}
	}
	if n := durabilityTimeouts(t, inst, "reserve") + durabilityTimeouts(t, inst, "complete"); n != 0 {
		t.Fatalf("%d durability timeouts with the replica in sync", n)
	}
	facts := redisFacts(t, inst)
	if len(facts) != 3 {
		t.Fatalf("stores %+v, want three", facts)
	}
	for _, f := range facts {
		d := f.Durability
		if d.Option["replicas"] != 1.0 || d.Option["timeout"] != "1s" || len(d.Nodes) != 1 ||
			d.Nodes[0].Addr != primary.Addr || d.Nodes[0].Role != "master" || d.Nodes[0].ConnectedReplicas != "1" || d.Nodes[0].AppendOnly != "no" {
			t.Fatalf("store %s durability %+v", f.ID, d)
		}
	}

	replica.Kill()

	key := "no-replica-closed"
	if r := post(base, "/closed/x", key, `{"a":1}`); r.status != 503 || r.problem() != "urn:caddy-idempotency:store-unavailable" {
		t.Fatalf("fail_closed without the replica: %s, want 503 store-unavailable", r)
	}
	assertExecutions(t, up, key, 0)
	if n := durabilityTimeouts(t, inst, "reserve"); n != 1 {
		t.Fatalf("reserve durability timeouts %d, want 1", n)
	}

	openKey := "no-replica-open"
	if r := post(base, "/open/x", openKey, `{"a":1}`); !r.isNew() {
		t.Fatalf("fail_open without the replica: %s, want new (run on its reservation)", r)
	}
	if r := post(base, "/open/x", openKey, `{"a":1}`); !r.isReplayOf(1) {
		t.Fatalf("fail_open without the replica, again: %s, want a replay, not a second run", r)
	}
	assertExecutions(t, up, openKey, 1)

	proceedKey := "no-replica-proceed"
	if r := post(base, "/proceed/x", proceedKey, `{"a":1}`); !r.isNew() {
		t.Fatalf("proceed without the replica: %s, want new", r)
	}
	if r := post(base, "/proceed/x", proceedKey, `{"a":1}`); !r.isReplayOf(1) {
		t.Fatalf("proceed without the replica, again: %s, want a replay", r)
	}
	if n := durabilityTimeouts(t, inst, "reserve"); n != 3 {
		t.Fatalf("reserve durability timeouts %d, want 3 (fail_closed, fail_open, proceed)", n)
	}
	if n := durabilityTimeouts(t, inst, "complete"); n < 2 {
		t.Fatalf("complete durability timeouts %d, want 2 (fail_open, proceed) and those sent again", n)
	}
	if !strings.Contains(inst.Log(), "too few Redis replicas acknowledged idempotency writes in time") {
		t.Fatal("no log line of the durability timeouts")
	}
	for _, f := range redisFacts(t, inst) {
		if n := f.Durability.Nodes; len(n) != 1 || n[0].ConnectedReplicas != "0" {
			t.Fatalf("store %s nodes %+v, want the primary without replicas", f.ID, n)
		}
	}

	// Once the replica is back, the client's retry of the 503 runs, once.
	replica.Restart(t)
	testutil.Eventually(t, 30*time.Second, "the retry of the 503 run with the replica back", func() bool {
		r := post(base, "/closed/x", key, `{"a":1}`)
		return r.isNew()
	})
	assertExecutions(t, up, key, 1)
	// The two completions short of the replica were sent again until it
	// acknowledged them.
	testutil.Eventually(t, 30*time.Second, "the completions sent again acknowledged by the replica", func() bool {
		return strings.Count(inst.Log(), "an idempotent response is on enough replicas now") == 2
	})
}
