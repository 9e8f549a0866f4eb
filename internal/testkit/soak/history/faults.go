package history

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// settle is how long after a store fault ends, beyond the store timeout
// (and Redis's reconnect allowance), a 503 still counts as caused by it:
// the calls that were waiting on the fault need a moment to come back.
const settle = 500 * time.Millisecond

// trouble is a time an instance could not use a store: its link
// black-holed or cut, the store restarting, or the instance itself
// stopped (its calls time out when it resumes).
type trouble struct {
	start, end time.Duration
	faults     []int // indexes in History.Faults
}

// length is the outage's effective length.
func (t trouble) length() time.Duration { return t.end - t.start }

// troubles returns the times instance could not use store, one per fault,
// in start order. A Redis outage that refused connections (a restart, a
// cut) lasts RedisReconnect longer than the server was away: go-redis
// keeps failing until its next dial probe.
func (h *History) troubles(instance, store string) []trouble {
	var ts []trouble
	for i, f := range h.Faults {
		t := trouble{start: f.Start, end: f.End, faults: []int{i}}
		switch f.Kind {
		case Pause:
			if f.Instance != instance {
				continue
			}
		case Stall, Cut:
			if f.Instance != instance || f.Store != store {
				continue
			}
		case StoreRestart, StoreKill:
			if f.Store != store {
				continue
			}
		default:
			continue
		}
		if store == Redis && f.Kind != Pause && f.Kind != Stall {
			// Dials failed meanwhile; a black hole accepts them.
			t.end += h.Params.RedisReconnect
		}
		ts = append(ts, t)
	}
	slices.SortFunc(ts, func(a, b trouble) int { return int(a.start - b.start) })
	return ts
}

// outages merges the troubles of instance and store that overlap or
// follow each other closely (within a third of lock_timeout, one renewal
// period: too short a gap to count on a renewal) into single outages. A
// stall right after a cut is one outage as far as a lease can tell.
func (h *History) outages(instance, store string) []trouble {
	gap := h.Params.LockTimeout / 3
	var merged []trouble
	for _, t := range h.troubles(instance, store) {
		if n := len(merged); n > 0 && t.start <= merged[n-1].end+gap {
			last := &merged[n-1]
			last.end = max(last.end, t.end)
			last.faults = append(last.faults, t.faults...)
			continue
		}
		merged = append(merged, t)
	}
	return merged
}

// tolerated is the longest outage the promise covers.
func (h *History) tolerated() time.Duration {
	return time.Duration(h.Params.Tolerance * float64(h.Params.LockTimeout))
}

// after is how long after a fault on store its 503s may still come.
func (h *History) after(store string) time.Duration {
	d := h.Params.StoreTimeout + settle
	if store == Redis {
		d += h.Params.RedisReconnect
	}
	return d
}

// troubleNear returns a fault that can explain a store error that
// instance met on store between start and end, or -1.
func (h *History) troubleNear(instance, store string, start, end time.Duration) int {
	for _, t := range h.troubles(instance, store) {
		if t.start <= end && start <= t.end+h.after(store) {
			return t.faults[0]
		}
	}
	return -1
}

// Describe names a fault for a report: "stall b-postgres 1.100s
// [12.000-13.100]".
func (f *Fault) Describe() string {
	var target string
	switch {
	case f.Instance != "" && f.Store != "":
		target = f.Instance + "-" + f.Store
	case f.Instance != "":
		target = f.Instance
	default:
		target = f.Store
	}
	if f.Kind == Lock {
		target += fmt.Sprintf(" row %q of %q", f.Key, f.Scope)
	}
	s := fmt.Sprintf("%s %s %s [%s-%s]", f.Kind, target, secs(f.End-f.Start), secs(f.Start), secs(f.End))
	if f.Note != "" {
		s += " (" + f.Note + ")"
	}
	return s
}

// describeOutage names the faults of an outage and its effective length.
func (h *History) describeOutage(t trouble) string {
	var parts []string
	for _, i := range t.faults {
		parts = append(parts, h.Faults[i].Describe())
	}
	return fmt.Sprintf("%s, an outage of %s", strings.Join(parts, " + "), secs(t.length()))
}

// secs formats an offset or a length in seconds, to the millisecond.
func secs(d time.Duration) string {
	return fmt.Sprintf("%.3fs", d.Seconds())
}
