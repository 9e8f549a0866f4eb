package inprocess_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// scrape reads the Prometheus text exposition at url into series -> value.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scraping %s: %v", url, err)
	}
	defer resp.Body.Close()
	out := make(map[string]float64)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// outcomeSeries names the requests counter of outcome on server srv0,
// the name Caddyfile adaptation gives a config's first server.
func outcomeSeries(outcome string) string { return serverOutcomeSeries("srv0", outcome) }

// serverOutcomeSeries names the requests counter of outcome on server.
func serverOutcomeSeries(server, outcome string) string {
	return fmt.Sprintf(`caddy_http_idempotency_requests_total{outcome=%q,server=%q}`, outcome, server)
}

func TestMetricsCountEachOutcomeExactly(t *testing.T) {
	up := newCountingUpstream(t)
	adminPort := freePort(t)
	base := loadCaddyfileGlobals(t, freePort(t), fmt.Sprintf("admin 127.0.0.1:%d\n\tmetrics", adminPort), `
	@strict path /strict
	idempotency @strict {
		required
		max_body_size 8
	}
	idempotency
	reverse_proxy `+up.Listener.Addr().String())
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", adminPort)
	before := scrape(t, metricsURL)

	post(t, base+"/orders", "m1", `{"a":1}`)              // new
	post(t, base+"/orders", "m1", `{"a":1}`)              // replayed
	post(t, base+"/orders", "m1", `{"a":1}`)              // replayed
	post(t, base+"/orders", "m1", `{"a":2}`)              // mismatch
	post(t, base+"/orders", "", `{}`)                     // passed
	post(t, base+"/strict", "", `{}`)                     // missing
	post(t, base+"/orders", "bad key", `{}`)              // invalid (space)
	post(t, base+"/strict", "m2", `{"too":"large body"}`) // too_large
	post(t, base+"/orders", "m3", `{"b":`)                // invalid (not JSON)

	after := scrape(t, metricsURL)
	want := map[string]float64{
		"new": 1, "replayed": 2, "mismatch": 1, "passed": 1,
		"missing": 1, "invalid": 2, "too_large": 1,
		"conflict": 0, "store_error": 0, "waited": 0,
	}
	for o, n := range want {
		s := outcomeSeries(o)
		if _, ok := after[s]; !ok {
			t.Errorf("series %s missing", s)
			continue
		}
		if got := after[s] - before[s]; got != n {
			t.Errorf("%s grew by %v, want %v", s, got, n)
		}
	}
	reserve := `caddy_http_idempotency_store_duration_seconds_count{backend="memory",op="reserve"}`
	complete := `caddy_http_idempotency_store_duration_seconds_count{backend="memory",op="complete"}`
	if got := after[reserve] - before[reserve]; got != 4 {
		t.Errorf("reserve ops grew by %v, want 4 (new, 2 replays, mismatch)", got)
	}
	if got := after[complete] - before[complete]; got != 1 {
		t.Errorf("complete ops grew by %v, want 1", got)
	}
	if v, ok := after[`caddy_http_idempotency_in_flight{server="srv0"}`]; !ok || v != 0 {
		t.Errorf("in_flight = %v (present %v), want 0 at rest", v, ok)
	}
	for series := range after {
		if strings.Contains(series, "idempotency") && (strings.Contains(series, "m1") || strings.Contains(series, "127.0.0.1")) {
			t.Errorf("a metric label carries a key or a host: %s", series)
		}
	}
}

func TestMetricsSurviveReloads(t *testing.T) {
	up := newCountingUpstream(t)
	adminPort := freePort(t)
	port := freePort(t)
	site := `
	idempotency
	reverse_proxy ` + up.Listener.Addr().String()
	globals := fmt.Sprintf("admin 127.0.0.1:%d\n\tmetrics", adminPort)
	base := loadCaddyfileGlobals(t, port, globals, site)
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", adminPort)
	post(t, base+"/orders", "r1", `{}`)
	mid := scrape(t, metricsURL)[outcomeSeries("new")]
	loadCaddyfileGlobals(t, port, globals, site+"\n") // a reload: new registry, same collectors
	post(t, base+"/orders", "r2", `{}`)
	if got := scrape(t, metricsURL)[outcomeSeries("new")]; got != mid+1 {
		t.Fatalf("after a reload the new-key counter is %v, want %v (kept and counting)", got, mid+1)
	}
}

func TestPlaceholdersReachOtherDirectives(t *testing.T) {
	up := newCountingUpstream(t)
	base := loadCaddyfile(t, freePort(t), `
	header >X-Outcome {http.idempotency.outcome}
	header >X-Key-Hash {http.idempotency.key_hash}
	idempotency
	reverse_proxy `+up.Listener.Addr().String())
	for _, c := range []struct {
		body string
		want string
	}{
		{`{}`, "new"},
		{`{}`, "replayed"},
		{`{"other":1}`, "mismatch"},
	} {
		resp, _ := post(t, base+"/orders", "p1", c.body)
		if got := resp.Header.Get("X-Outcome"); got != c.want {
			t.Errorf("X-Outcome = %q, want %q", got, c.want)
		}
		if kh := resp.Header.Get("X-Key-Hash"); len(kh) != 16 {
			t.Errorf("X-Key-Hash = %q, want 16 hex digits", kh)
		}
	}
}

func TestAccessLogCarriesOutcomeAndKeyHash(t *testing.T) {
	up := newCountingUpstream(t)
	logFile := t.TempDir() + "/access.log"
	base := loadCaddyfile(t, freePort(t), `
	log {
		output file `+logFile+`
	}
	idempotency
	reverse_proxy `+up.Listener.Addr().String())
	post(t, base+"/orders", "logged-key", `{}`)
	post(t, base+"/orders", "logged-key", `{}`)
	var data []byte
	testutil.Eventually(t, 5*time.Second, "two lines in the access log", func() bool {
		data, _ = os.ReadFile(logFile)
		return strings.Count(string(data), "\n") >= 2
	})
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) < 2 {
		t.Fatalf("access log has %d lines", len(lines))
	}
	for i, want := range []string{"new", "replayed"} {
		var entry map[string]any
		if err := json.Unmarshal([]byte(lines[i]), &entry); err != nil {
			t.Fatalf("access log line %q: %v", lines[i], err)
		}
		if entry["idempotency_outcome"] != want {
			t.Errorf("line %d: idempotency_outcome = %v, want %s", i, entry["idempotency_outcome"], want)
		}
		if kh, _ := entry["idempotency_key_hash"].(string); len(kh) != 16 {
			t.Errorf("line %d: idempotency_key_hash = %v", i, entry["idempotency_key_hash"])
		}
	}
}

// TestMetricsTellServersApart serves two sites on two ports (two HTTP
// servers, srv0 and srv1): each counts its own requests under its server
// label, as Caddy's own HTTP metrics do.
func TestMetricsTellServersApart(t *testing.T) {
	up := newCountingUpstream(t)
	adminPort, p0, p1 := freePort(t), freePort(t), freePort(t)
	cfg := fmt.Sprintf(`{
	admin 127.0.0.1:%d
	metrics
	auto_https off
	persist_config off
	log {
		level ERROR
	}
}

http://127.0.0.1:%d {
	idempotency
	reverse_proxy %s
}

http://127.0.0.1:%d {
	idempotency
	reverse_proxy %s
}
`, adminPort, p0, up.Listener.Addr(), p1, up.Listener.Addr())
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(js, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", adminPort)
	before := scrape(t, metricsURL)
	post(t, fmt.Sprintf("http://127.0.0.1:%d/orders", p0), "s0", `{}`)
	post(t, fmt.Sprintf("http://127.0.0.1:%d/orders", p1), "s1", `{}`)
	post(t, fmt.Sprintf("http://127.0.0.1:%d/orders", p1), "s1", `{}`)
	after := scrape(t, metricsURL)
	grew := func(server, outcome string) float64 {
		s := serverOutcomeSeries(server, outcome)
		return after[s] - before[s]
	}
	// The adapter names the servers; which port is which is its choice.
	one, two := "srv0", "srv1"
	if grew(one, "replayed") == 1 {
		one, two = two, one
	}
	if grew(one, "new") != 1 || grew(one, "replayed") != 0 || grew(two, "new") != 1 || grew(two, "replayed") != 1 {
		t.Fatalf("new and replayed grew by %v, %v on %s and by %v, %v on %s; want 1, 0 on one server and 1, 1 on the other",
			grew(one, "new"), grew(one, "replayed"), one, grew(two, "new"), grew(two, "replayed"), two)
	}
}

// TestMetricsCountRecordsTheStoreRemoves: refusal records that give way
// in a full memory store are counted in
// caddy_http_idempotency_records_removed_total{backend="memory",reason="evicted"},
// served on Caddy's /metrics (the handler registers the backends'
// collectors); the expired series exists from the start.
func TestMetricsCountRecordsTheStoreRemoves(t *testing.T) {
	adminPort := freePort(t)
	base := loadCaddyfileGlobals(t, freePort(t), fmt.Sprintf("admin 127.0.0.1:%d\n\tmetrics", adminPort), `
	idempotency {
		storage memory {
			max_keys 10
			max_keys_per_scope 10
		}
	}
	respond /refused 404
	respond 201`)
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", adminPort)
	evicted := `caddy_http_idempotency_records_removed_total{backend="memory",reason="evicted"}`
	expired := `caddy_http_idempotency_records_removed_total{backend="memory",reason="expired"}`
	before := scrape(t, metricsURL)
	if _, ok := before[expired]; !ok {
		t.Fatalf("series %s missing", expired)
	}
	for i := range 10 { // fill the store with recorded 404s
		if resp, _ := post(t, base+"/refused", fmt.Sprint("refused-", i), `{}`); resp.StatusCode != http.StatusNotFound {
			t.Fatalf("refused-%d: %d", i, resp.StatusCode)
		}
	}
	for i := range 3 { // each new key evicts one
		if resp, _ := post(t, base+"/orders", fmt.Sprint("new-", i), `{}`); resp.StatusCode != http.StatusCreated {
			t.Fatalf("new-%d: %d, want 201", i, resp.StatusCode)
		}
	}
	after := scrape(t, metricsURL)
	if got := after[evicted] - before[evicted]; got != 3 {
		t.Fatalf("%s grew by %v, want 3", evicted, got)
	}
}

// TestStoreOutageLogsAboutOneLineASecond runs Caddy on a Redis nothing
// listens on, sends requests without pause for 2.5 s, and reads Caddy's
// log: every request got its 503, and the handler wrote about one line a
// second (not one per request), whose requests fields add up to the 503s.
func TestStoreOutageLogsAboutOneLineASecond(t *testing.T) {
	port, redisPort := freePort(t), freePort(t)
	logFile := t.TempDir() + "/caddy.log"
	cfg := fmt.Sprintf(`{
	admin off
	auto_https off
	persist_config off
	http_port %d
	log {
		output file %s
		include http.handlers.idempotency
		level WARN
	}
}

http://127.0.0.1:%d {
	idempotency {
		storage redis redis://127.0.0.1:%d/0
	}
	respond 201
}
`, port, logFile, port, redisPort)
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(js, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	base := fmt.Sprintf("http://127.0.0.1:%d", port)

	var refused atomic.Int64
	stop := time.Now().Add(2500 * time.Millisecond)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				resp, _, err := tryPost(base+"/orders", fmt.Sprint("outage-", i), `{}`)
				if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
					t.Errorf("during the outage: %v %v, want 503", resp, err)
					return
				}
				refused.Add(1)
			}
		})
	}
	wg.Wait()
	const msg = "idempotency store unavailable; rejecting the request (fail_closed)"
	var lines int
	var counted int64
	testutil.Eventually(t, 5*time.Second, "every 503 to be counted in the log", func() bool {
		data, _ := os.ReadFile(logFile)
		lines, counted = 0, 0
		for line := range strings.SplitSeq(strings.TrimSpace(string(data)), "\n") {
			var entry struct {
				Msg      string `json:"msg"`
				Requests int64  `json:"requests"`
			}
			if json.Unmarshal([]byte(line), &entry) == nil && entry.Msg == msg {
				lines++
				counted += entry.Requests
			}
		}
		return counted == refused.Load()
	})
	if lines < 3 || lines > 5 || refused.Load() < 4*int64(lines) {
		t.Fatalf("%d requests refused in 2.5 s logged %d lines, want about one a second (3 to 5)", refused.Load(), lines)
	}
	t.Logf("%d requests refused, %d log lines", refused.Load(), lines)
}
