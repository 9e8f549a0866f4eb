package idempotency

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
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

func outcomeSeries(o outcome) string {
	return fmt.Sprintf(`caddy_http_idempotency_requests_total{outcome=%q}`, o)
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
	want := map[outcome]float64{
		outcomeNew: 1, outcomeReplayed: 2, outcomeMismatch: 1, outcomePassed: 1,
		outcomeMissing: 1, outcomeInvalid: 2, outcomeTooLarge: 1,
		outcomeConflict: 0, outcomeStoreError: 0, outcomeWaited: 0,
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
	if v, ok := after["caddy_http_idempotency_in_flight"]; !ok || v != 0 {
		t.Errorf("in_flight = %v (present %v), want 0 at rest", v, ok)
	}
	for series := range after {
		if strings.Contains(series, "idempotency") && (strings.Contains(series, "m1") || strings.Contains(series, "127.0.0.1")) {
			t.Errorf("a metric label carries a key or a host: %s", series)
		}
	}
}

func TestInFlightGaugeRisesWhileARequestRuns(t *testing.T) {
	h := isolated(t, &Handler{})
	before := gaugeValue(t)
	_, release, done := holdInFlight(h, request("k", "{}"))
	if got := gaugeValue(t) - before; got != 1 {
		t.Errorf("in_flight rose by %v while a request ran, want 1", got)
	}
	release()
	<-done
	if got := gaugeValue(t) - before; got != 0 {
		t.Errorf("in_flight is %v above where it started after the request, want 0", got)
	}
}

func gaugeValue(t *testing.T) float64 {
	t.Helper()
	initMetrics()
	var m dto.Metric
	if err := metrics.inFlight.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
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
	mid := scrape(t, metricsURL)[outcomeSeries(outcomeNew)]
	loadCaddyfileGlobals(t, port, globals, site+"\n") // a reload: new registry, same collectors
	post(t, base+"/orders", "r2", `{}`)
	if got := scrape(t, metricsURL)[outcomeSeries(outcomeNew)]; got != mid+1 {
		t.Fatalf("after a reload the new-key counter is %v, want %v (kept and counting)", got, mid+1)
	}
}

func TestLogsCarryKeyHashButNoSecrets(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	h := isolated(t, &Handler{Required: true})
	h.logger = zap.New(core)
	up := &upstream{}
	secret := "Bearer sk_live_very_secret_token"
	for _, r := range []*http.Request{request("log-key", `{}`), request("log-key", `{}`), request("log-key", `{"x":1}`), request("", "{}")} {
		r.Header.Set("Authorization", secret)
		serve(h, up, r)
	}
	withStore := isolated(t, &Handler{})
	withStore.logger = zap.New(core)
	withFlakyStore(withStore).down.Store(true)
	r := request("log-key", `{}`)
	r.Header.Set("Authorization", secret)
	serve(withStore, up, r)

	if logs.Len() == 0 {
		t.Fatal("nothing was logged at debug level")
	}
	sawHash, sawStoreError := false, false
	for _, e := range logs.All() {
		line, _ := json.Marshal(e.ContextMap())
		text := e.Message + string(line)
		if strings.Contains(text, "sk_live") || strings.Contains(text, "log-key") {
			t.Errorf("log entry leaks a credential or the key: %s", text)
		}
		if e.ContextMap()["key_hash"] != nil {
			sawHash = true
		}
		if e.Level == zapcore.ErrorLevel && strings.Contains(e.Message, "store unavailable") {
			sawStoreError = true
		}
	}
	if !sawHash || !sawStoreError {
		t.Errorf("want key_hash fields and a store error entry; got %d entries", logs.Len())
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
		want outcome
	}{
		{`{}`, outcomeNew},
		{`{}`, outcomeReplayed},
		{`{"other":1}`, outcomeMismatch},
	} {
		resp, _ := post(t, base+"/orders", "p1", c.body)
		if got := resp.Header.Get("X-Outcome"); got != string(c.want) {
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
	eventually(t, 5*time.Second, func() bool {
		data, _ = os.ReadFile(logFile)
		return strings.Count(string(data), "\n") >= 2
	})
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) < 2 {
		t.Fatalf("access log has %d lines", len(lines))
	}
	for i, want := range []outcome{outcomeNew, outcomeReplayed} {
		var entry map[string]any
		if err := json.Unmarshal([]byte(lines[i]), &entry); err != nil {
			t.Fatalf("access log line %q: %v", lines[i], err)
		}
		if entry["idempotency_outcome"] != string(want) {
			t.Errorf("line %d: idempotency_outcome = %v, want %s", i, entry["idempotency_outcome"], want)
		}
		if kh, _ := entry["idempotency_key_hash"].(string); len(kh) != 16 {
			t.Errorf("line %d: idempotency_key_hash = %v", i, entry["idempotency_key_hash"])
		}
	}
}
