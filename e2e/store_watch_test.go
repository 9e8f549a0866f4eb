package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// storeHealth reads caddy_http_idempotency_store_up and the last
// successful ping's time from /metrics, by backend.
func storeHealth(t *testing.T, inst *caddyproc.Instance) (up, lastPing map[string]float64) {
	t.Helper()
	status, body := adminGet(t, inst, "/metrics")
	if status != 200 {
		t.Fatalf("admin /metrics: %d", status)
	}
	up, lastPing = map[string]float64{}, map[string]float64{}
	for line := range strings.SplitSeq(string(body), "\n") {
		var into map[string]float64
		switch {
		case strings.HasPrefix(line, "caddy_http_idempotency_store_up{"):
			into = up
		case strings.HasPrefix(line, "caddy_http_idempotency_store_last_ping_success_timestamp_seconds{"):
			into = lastPing
		default:
			continue
		}
		_, rest, _ := strings.Cut(line, `backend="`)
		backend, _, _ := strings.Cut(rest, `"`)
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		into[backend] = v
	}
	return up, lastPing
}

// A store's health follows its pings with no request sent: store_up reads
// 1 while a private Redis and a private PostgreSQL answer, 0 within the
// ping interval after both are killed (their last successful ping's time
// staying where it was), and 1 again once they are back; the log says
// when each stopped answering and when it answered again.
func TestStoreHealthFollowsPingsWithoutTraffic(t *testing.T) {
	redis := redistest.StartServer(t)
	_, pg := pgtest.Private(t)
	up := newUpstream(t)
	block := func(path, storage string) string {
		return fmt.Sprintf("\thandle /%s/* {\n\t\tidempotency {\n\t\t\t%s\n\t\t}\n\t\treverse_proxy %s\n\t}\n", path, storage, up.Addr)
	}
	inst := startCaddy(t, "caddy", site{routes: block("r", "storage redis {\n\t\t\t\turl redis://"+redis.Addr+"/0\n\t\t\t}") +
		block("p", "storage postgres {\n\t\t\t\tdsn \""+pg.DSN+"\"\n\t\t\t}")})
	both := func(want float64) func() bool {
		return func() bool {
			h, _ := storeHealth(t, inst)
			return len(h) == 2 && h["redis"] == want && h["postgres"] == want
		}
	}
	testutil.Eventually(t, 30*time.Second, "store_up 1 for both stores", both(1))

	redis.Kill()
	pg.Kill()
	testutil.Eventually(t, 30*time.Second, "store_up 0 for both stores, with no request sent", both(0))
	_, before := storeHealth(t, inst)
	testutil.Eventually(t, 30*time.Second, "another ping while the stores are down", func() bool {
		return strings.Count(inst.Log(), "idempotency store stopped answering its pings") == 2
	})
	if h, after := storeHealth(t, inst); h["redis"] != 0 || h["postgres"] != 0 ||
		after["redis"] != before["redis"] || after["postgres"] != before["postgres"] || before["redis"] == 0 {
		t.Fatalf("while down: store_up %v, last successful ping %v then %v; want 0 and unchanged", h, before, after)
	}

	redis.Restart(t)
	if err := pg.Restart(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "store_up 1 again for both stores", both(1))
	testutil.Eventually(t, 10*time.Second, "the log to say both answer again", func() bool {
		return strings.Count(inst.Log(), "idempotency store answers its pings again") == 2
	})
	if _, again := storeHealth(t, inst); again["redis"] <= before["redis"] || again["postgres"] <= before["postgres"] {
		t.Fatalf("the last successful ping's time did not move on: %v then %v", before, again)
	}
}

// A Redis that evicts keys when full drops live records: the start-up
// log warns, naming the policy and the fix, and GET /idempotency/stores
// shows the policy.
func TestAnEvictingRedisIsWarnedOfAtStart(t *testing.T) {
	redis := redistest.StartServerArgs(t, "--maxmemory-policy", "allkeys-lru", "--maxmemory", "64mb")
	up := newUpstream(t)
	inst := startCaddy(t, "caddy", site{routes: route(up, "storage redis {\n\t\turl redis://"+redis.Addr+"/0\n\t}")})
	testutil.Eventually(t, 20*time.Second, "the start-up warning", func() bool {
		return strings.Contains(inst.Log(), `"msg":"idempotency store may lose records where it is connected`)
	})
	for _, want := range []string{"maxmemory-policy allkeys-lru", "set maxmemory-policy noeviction"} {
		if !strings.Contains(inst.Log(), want) {
			t.Errorf("the warning does not say %q:\n%s", want, tail(inst.Log(), 10))
		}
	}
	status, body := adminGet(t, inst, "/idempotency/stores")
	if status != 200 || !strings.Contains(string(body), `"maxmemory_policy":"allkeys-lru"`) || !strings.Contains(string(body), "noeviction") {
		t.Fatalf("GET /idempotency/stores: %d %s", status, body)
	}
}
