package idempotency

import (
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

func TestPreferredWait(t *testing.T) {
	for header, want := range map[string]time.Duration{
		"wait=5":                   5 * time.Second,
		"respond-async, wait=10":   10 * time.Second,
		`WAIT="3"`:                 3 * time.Second,
		"wait=2; foo=bar":          2 * time.Second,
		"handling=lenient, wait=0": 0,
		"return=minimal":           -1,
		"wait":                     -1,
		"wait=soon":                -1,
		"wait=-1":                  -1,
		"waiting=5":                -1,
		// Beyond any wait_timeout: as long as allowed (waitFor caps it).
		"wait=99999999999999999999": math.MaxInt32 * time.Second,
		"wait=4294967296":           math.MaxInt32 * time.Second,
	} {
		got, ok := preferredWait(http.Header{"Prefer": {header}})
		if (want < 0 && ok) || (want >= 0 && (!ok || got != want)) {
			t.Errorf("Prefer: %s = %v, %v; want %v", header, got, ok, want)
		}
	}
}

func TestWaitIsTheLesserOfPreferenceAndWaitTimeout(t *testing.T) {
	h := isolated(t, &Handler{InFlight: inFlightReject, WaitTimeout: caddy.Duration(3 * time.Second)})
	r := request("k", "{}")
	r.Header.Set("Prefer", "wait=30")
	if wait, asked := h.waitFor(r); wait != 3*time.Second || !asked {
		t.Errorf("wait=30 under wait_timeout 3s: %v %v", wait, asked)
	}
	if wait, _ := h.waitFor(request("k", "{}")); wait != 0 {
		t.Errorf("no preference on a reject route: waits %v", wait)
	}
	w := isolated(t, &Handler{WaitTimeout: caddy.Duration(3 * time.Second)}) // wait: the default
	if wait, asked := w.waitFor(request("k", "{}")); wait != 3*time.Second || asked {
		t.Errorf("no preference on a wait route: %v %v", wait, asked)
	}
	r.Header.Set("Prefer", "wait=0")
	if wait, _ := w.waitFor(r); wait != 0 {
		t.Errorf("wait=0 on a wait route: waits %v", wait)
	}
}
