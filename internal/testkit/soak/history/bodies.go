package history

import (
	"fmt"
	"strings"
)

// checkBodies is invariants 6 and 9: an answer the client took as
// complete (it ended cleanly, no error) is whole, a client that reads
// steadily, however slowly, gets its answer to the end, and so does one
// whose upstream falls silent for longer than the stall timeout.
//
// An answer cut short must reach the client as an error on every
// protocol (HTTP/1.1 close, HTTP/2 RST_STREAM, HTTP/3 stream reset):
// a clean end after part of the body is a corrupted answer the client
// cannot tell from a whole one. And a client is gone only after 10 s
// without taking a byte, so one reading 1-3 KB/s is never cut; one
// whose instance was killed or reloaded under it is excused (a reload
// shuts the old server down, and Caddy closes the connections it takes
// for idle, an answer still in the socket buffers with them).
func (ix *index) checkBodies(r *Report) {
	for i := range ix.h.Intents {
		in := &ix.h.Intents[i]
		for _, a := range ix.attempts[in.ID] {
			if a.Status == 0 || a.HungUp {
				continue
			}
			if x := ix.execs[a.Execution]; x != nil && ix.foreign(in, a, x) == "" {
				if msg := truncated(a, x); msg != "" {
					r.anomaly(TruncatedCleanEnd, in, fmt.Sprintf("%s: %s", a.describe(), msg))
				}
			}
			if a.Read == ReadSlow && a.Err != "" {
				if f := ix.h.restartedUnder(a); f == nil {
					r.anomaly(SlowReaderCut, in, fmt.Sprintf("%s: a client reading %d bytes a second over %s got %d bytes, then %q after %s (%s)",
						a.describe(), a.ReadRate, a.proto(), a.BodyBytes, a.Err, secs(a.End-a.Start), a.outcome()))
				}
			}
			// A silent upstream's reader (its own client, Proto set),
			// not a steady client that gave up on a retry.
			if a.AskSilence > 0 && a.Proto != "" && a.Read == "" && a.Err != "" && !a.Replayed && a.Execution > 0 {
				if f := ix.h.restartedUnder(a); f == nil {
					r.anomaly(SilentUpstreamCut, in, fmt.Sprintf("%s: a client reading over %s as the answer came, from an upstream silent for %s, got %d bytes, then %q after %s (%s)",
						a.describe(), a.proto(), secs(a.AskSilence), a.BodyBytes, a.Err, secs(a.End-a.Start), a.outcome()))
				}
			}
		}
	}
}

// restartedUnder returns a kill or a reload of a's instance while a ran,
// nil if none.
func (h *History) restartedUnder(a *Attempt) *Fault {
	for i := range h.Faults {
		f := &h.Faults[i]
		if (f.Kind == Kill || f.Kind == Reload) && f.Instance == a.Instance && f.Start <= a.End && f.End >= a.Start {
			return f
		}
	}
	return nil
}

// truncated says how a, an answer that names x, ended cleanly short of
// what x sent; "" when it did not (it is whole, or it ended in an
// error, which tells the client).
func truncated(a *Attempt, x *Execution) string {
	if a.Err != "" || a.HungUp {
		return ""
	}
	switch {
	case a.Replayed:
		if a.BodyOmitted || x.BrokeOff || a.BodyBytes >= x.AnswerBytes {
			return ""
		}
		return fmt.Sprintf("a replay of #%d ended cleanly after %d of the %d bytes it sent", x.N, a.BodyBytes, x.AnswerBytes)
	case x.BrokeOff:
		return fmt.Sprintf("#%d broke off mid-body after %d bytes, yet the answer over %s ended cleanly after %d: a cut must reach the client as an error",
			x.N, x.AnswerBytes, a.proto(), a.BodyBytes)
	case a.BodyBytes < x.AnswerBytes:
		what := ""
		if a.Read == ReadStall {
			what = fmt.Sprintf(" (the client stopped reading for %s, then resumed)", secs(a.StallFor))
		}
		return fmt.Sprintf("the answer over %s ended cleanly after %d of the %d bytes #%d sent%s", a.proto(), a.BodyBytes, x.AnswerBytes, x.N, what)
	}
	return ""
}

// shortened reports whether a's body is a clean end short of x's, which
// truncated reports: the answer checks then leave its digest alone.
func shortened(a *Attempt, x *Execution) bool {
	return a.BodyBytes < x.AnswerBytes && a.Err == "" && !a.HungUp && !a.BodyOmitted
}

// proto names the protocol a went over.
func (a *Attempt) proto() string {
	if a.Proto == "" {
		return "h1"
	}
	return a.Proto
}

// mode describes how a client spoke and read, "" for the steady
// workload's HTTP/1.1 client reading at once.
func (a *Attempt) mode() string {
	var parts []string
	if a.Proto != "" {
		parts = append(parts, a.Proto)
	}
	switch a.Read {
	case ReadSlow:
		parts = append(parts, fmt.Sprintf("reads %d B/s", a.ReadRate))
	case ReadStall:
		parts = append(parts, fmt.Sprintf("stops reading for %s", secs(a.StallFor)))
	}
	return strings.Join(parts, ", ")
}
