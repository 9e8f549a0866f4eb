package idempotency

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// waitFor returns how long a request that found its key in flight waits
// for the first request to finish: what it asks with `Prefer: wait=<s>`
// (RFC 7240), capped at wait_timeout, or wait_timeout with in_flight wait
// when it asks nothing; asked says whether it asked.
func (h *Handler) waitFor(r *http.Request) (wait time.Duration, asked bool) {
	maxWait := time.Duration(h.policy.waitTimeout)
	if asked, ok := preferredWait(r.Header); ok {
		return min(asked, maxWait), true
	}
	if h.policy.inFlight == inFlightWait {
		return maxWait, false
	}
	return 0, false
}

// maxWaiters bounds the requests one handler keeps waiting at once for
// an in-flight first request: past it, a request that would wait gets
// 409 at once. Waiting costs the store work (a poll or a subscription per
// waiter and key), and a burst of retries must not turn into a burst of
// store load.
var maxWaiters int32 = 1000 // a variable for the tests

// enterWait takes a waiter's place, if one is free; leaveWait gives it
// back.
func (h *Handler) enterWait() bool {
	if atomic.AddInt32(&h.waiting, 1) > maxWaiters {
		atomic.AddInt32(&h.waiting, -1)
		return false
	}
	return true
}

func (h *Handler) leaveWait() { atomic.AddInt32(&h.waiting, -1) }

// preferredWait reads the wait preference of the Prefer header fields:
// `wait=<delta-seconds>`, possibly quoted, with or without parameters.
func preferredWait(h http.Header) (time.Duration, bool) {
	for _, field := range h.Values("Prefer") {
		for pref := range strings.SplitSeq(field, ",") {
			pref, _, _ = strings.Cut(pref, ";")
			name, value, hasValue := strings.Cut(strings.TrimSpace(pref), "=")
			if !hasValue || !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			value = strings.Trim(strings.TrimSpace(value), `"`)
			if value == "" || strings.Trim(value, "0123456789") != "" {
				return 0, false // a malformed preference is ignored
			}
			// Any number of digits: a wait longer than wait_timeout is
			// wait_timeout (waitFor caps it).
			secs, err := strconv.ParseUint(value, 10, 32)
			if err != nil {
				secs = math.MaxInt32 // out of range: as long as allowed
			}
			return time.Duration(min(secs, math.MaxInt32)) * time.Second, true
		}
	}
	return 0, false
}

// preferenceApplied is the Preference-Applied value for a wait of d.
func preferenceApplied(d time.Duration) string {
	return "wait=" + strconv.FormatInt(int64(math.Ceil(d.Seconds())), 10)
}
