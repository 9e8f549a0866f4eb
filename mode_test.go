package idempotency

import "testing"

func TestObserveModeCountsOnlyObserved(t *testing.T) {
	h := isolated(t, &Handler{Mode: "observe"})
	initMetrics()
	requests, observed := testCounter(outcomeNew), testObserved(outcomeNew)
	serve(h, &upstream{}, request("o", "{}"))
	if got := testCounter(outcomeNew) - requests; got != 0 {
		t.Errorf("requests_total{new} grew by %v in observe mode", got)
	}
	if got := testObserved(outcomeNew) - observed; got != 1 {
		t.Errorf("observed_total{new} grew by %v, want 1", got)
	}
}
