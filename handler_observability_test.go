package idempotency

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// What inprocess/observability_test.go cannot see from outside Caddy: the in-flight
// gauge while a request is held, and the handler's own log entries.

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
	if err := serverMetricsNamed(unknownServer).inFlight.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
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
