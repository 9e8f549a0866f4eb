package idempotency

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/backend/backendtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
)

// These Redis-specific tests run the handler on a private redis-server or
// a Sentinel setup; the scenarios every store shares run on the backend
// matrix (matrix_test.go).

// onRedis provisions h on the Redis at addr under a fresh key prefix;
// extra adds members to the storage object (`,"timeout":"1s"`).
func onRedis(t *testing.T, h *Handler, addr, extra string) *Handler {
	t.Helper()
	h.StorageRaw = json.RawMessage(fmt.Sprintf(`{"backend":"redis","url":"redis://%s/0","key_prefix":%q%s}`, addr, backendtest.RedisPrefix(), extra))
	return provision(t, h)
}

// TestRedisRoundTripsThroughHandler counts, on a private server, what one
// request costs in Redis commands: a new key two, a replay one.
func TestRedisRoundTripsThroughHandler(t *testing.T) {
	srv := redistest.StartServer(t)
	h := onRedis(t, &Handler{}, srv.Addr, "")
	mon := redistest.NewMonitor(t, srv.Addr)
	up := &upstream{}

	// Warm up: connection handshake, and the NOSCRIPT/EVAL of each script
	// on a fresh server.
	serve(h, up, request("warm-up", "{}"))
	serve(h, up, request("warm-up", "{}"))

	for _, step := range []struct {
		name     string
		want     int
		replayed string
	}{
		{"new key", 2, ""},
		{"replay", 1, "true"},
	} {
		var w *httptest.ResponseRecorder
		before := mon.CommandStats()
		cmds := mon.Commands(func() { w = serve(h, up, request("counted", `{"n":1}`)) })
		after := mon.CommandStats()
		if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != step.replayed {
			t.Fatalf("%s: %d replayed=%q", step.name, w.Code, w.Header().Get("Idempotent-Replayed"))
		}
		// The store's health watch pings every few seconds (INFO, PING):
		// not the request's, though one may fall within it.
		cmds = slices.DeleteFunc(cmds, func(c redistest.Command) bool { return c.Name == "info" || c.Name == "ping" })
		var names []string
		for _, c := range cmds {
			names = append(names, c.Name+"["+strings.Join(c.Script, " ")+"]")
		}
		if len(cmds) != step.want {
			t.Errorf("%s: %d Redis commands (%s), want %d", step.name, len(cmds), strings.Join(names, ", "), step.want)
		}
		if d := after["evalsha"] - before["evalsha"]; d != step.want {
			t.Errorf("%s: commandstats evalsha +%d, want +%d", step.name, d, step.want)
		}
		t.Logf("%s: %d round trip(s): %s", step.name, len(cmds), strings.Join(names, ", "))
	}
}

// TestRedisSentinelFromConfig configures the handler for a Sentinel-managed
// primary whose Sentinel requires a password given as an {env.*}
// placeholder: the handler runs, replays and isolates requests there, and
// with the wrong Sentinel password it fails closed without running.
func TestRedisSentinelFromConfig(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a primary, a replica and a Sentinel")
	}
	sentinel := redistest.StartSentinel(t, "s3ntinel-pass")
	t.Setenv("IDEM_TEST_SENTINEL_PASSWORD", sentinel.Password)
	storage := func(password string) json.RawMessage {
		return json.RawMessage(fmt.Sprintf(`{"backend":"redis","addresses":[%q],"master_name":%q,"sentinel_password":%q,"key_prefix":%q,"timeout":"1s"}`,
			sentinel.Addr, sentinel.MasterName, password, backendtest.RedisPrefix()))
	}

	h := provision(t, &Handler{StorageRaw: storage("{env.IDEM_TEST_SENTINEL_PASSWORD}")})
	up := &upstream{}
	first := serve(h, up, request("k", `{"a":1}`))
	again := serve(h, up, request("k", `{"a":1}`))
	if first.Code != http.StatusCreated || again.Header().Get("Idempotent-Replayed") != "true" || again.Body.String() != first.Body.String() {
		t.Fatalf("first %d, retry %d replayed=%q", first.Code, again.Code, again.Header().Get("Idempotent-Replayed"))
	}
	if up.Calls.Load() != 1 {
		t.Fatalf("upstream ran %d times, want 1", up.Calls.Load())
	}

	wrong := provision(t, &Handler{StorageRaw: storage("not-the-password")})
	if w := serve(wrong, up, request("other", `{}`)); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("wrong Sentinel password: %d, want 503 (fail_closed)", w.Code)
	}
	if up.Calls.Load() != 1 {
		t.Fatalf("upstream ran %d times, want 1", up.Calls.Load())
	}
}

// TestFailOpenRunsOnAShortReservation: with durability replicas 1 on a
// primary that has no replica, every reservation falls short. fail_open
// then runs the request on the reservation the primary holds (as
// on_timeout proceed does) rather than passing it on without
// idempotency, where every request of a key would run: 50 requests with
// one key at once run the upstream once.
func TestFailOpenRunsOnAShortReservation(t *testing.T) {
	srv := redistest.StartServer(t)
	h := onRedis(t, &Handler{OnStorageError: "fail_open"}, srv.Addr, `,"durability":{"replicas":1,"timeout":"100ms"}`)
	up := backendtest.SlowUpstream(300 * time.Millisecond)
	responses := backendtest.Fire(h, up, 50, "short-of-replicas", `{"amount":10}`)
	if n := up.Calls.Load(); n != 1 {
		t.Fatalf("the upstream ran %d times for 50 requests with one key, want once", n)
	}
	for _, r := range responses {
		if r.Code != http.StatusCreated && r.Code != http.StatusConflict {
			t.Fatalf("status %d, want 201 or 409", r.Code)
		}
	}
	// A later retry is a replay.
	if w := serve(h, up, request("short-of-replicas", `{"amount":10}`)); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" || up.Calls.Load() != 1 {
		t.Fatalf("retry: %d replayed=%q, upstream ran %d times", w.Code, w.Header().Get("Idempotent-Replayed"), up.Calls.Load())
	}
}
