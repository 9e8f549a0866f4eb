package history

import (
	"strings"
	"testing"
)

// A sized answer of 900,000 bytes, as the slow clients ask for.
const bigAnswer = 900_000

func TestACleanEndShortOfWhatTheUpstreamSentIsAnAnomaly(t *testing.T) {
	h := newHistory()
	x := h.execOf(0, 1, "a", 1, 40, 201, bigAnswer)
	a := h.gotOf(0, "a", 1, 40, x, false)
	a.Proto, a.Read, a.StallFor = "h3", ReadStall, sec(15)
	a.BodyBytes, a.BodyDigest = 524_288, "part" // a clean end, no error
	r := expect(t, h, "truncated-clean-end")
	if s := r.Anomalies[0].Summary; !strings.Contains(s, "524288 of the 900000 bytes") || !strings.Contains(s, "h3") {
		t.Errorf("summary %q does not say how much of what came over which protocol", s)
	}

	// A replay that ends cleanly short of the record is one too.
	h = newHistory()
	x = h.execOf(0, 1, "a", 1, 2, 201, bigAnswer)
	h.gotOf(0, "a", 1, 2, x, false)
	a = h.gotOf(0, "b", 3, 4, x, true)
	a.BodyBytes, a.BodyDigest = 65_536, "part"
	expect(t, h, "truncated-clean-end")
}

func TestACleanEndAfterTheUpstreamBrokeOffIsAnAnomaly(t *testing.T) {
	h := newHistory()
	x := h.execOf(0, 1, "a", 1, 2, 201, 64)
	x.BrokeOff = true
	a := h.gotOf(0, "a", 1, 2, x, false)
	a.Proto = "h2"
	expect(t, h, "truncated-clean-end")
}

// An answer cut short that reaches the client as an error tells it:
// the promise is kept (the stalled client, the break-off, the hang-up,
// the replay whose body the record omits).
func TestACutThatReachesTheClientAsAnErrorIsNoAnomaly(t *testing.T) {
	h := newHistory()
	x := h.execOf(0, 1, "a", 1, 40, 201, bigAnswer)
	a := h.gotOf(0, "a", 1, 40, x, false)
	a.Proto, a.Read, a.StallFor = "h3", ReadStall, sec(15)
	a.BodyBytes, a.BodyDigest, a.Err = 524_288, "part", "stream reset by the server"
	hung := h.gotOf(0, "b", 2, 5, x, false)
	hung.BodyBytes, hung.BodyDigest, hung.HungUp = 10_000, "part", true
	h.gotOf(0, "c", 50, 51, x, true)
	expect(t, h, "")

	h = newHistory()
	x = h.execOf(0, 1, "a", 1, 2, 201, 64)
	x.BrokeOff = true
	a = h.gotOf(0, "a", 1, 2, x, false)
	a.Err = "unexpected EOF"
	a = h.gotOf(0, "b", 3, 4, x, true)
	a.BodyOmitted, a.BodyBytes, a.BodyDigest = true, 0, "empty"
	expect(t, h, "")
}

func TestASlowReaderWhoseAnswerIsCutIsAnAnomaly(t *testing.T) {
	slow := func(err string) *History {
		h := newHistory()
		x := h.execOf(0, 1, "a", 1, 50, 201, 100_000)
		a := h.gotOf(0, "a", 1, 11, x, false)
		a.Proto, a.Read, a.ReadRate = "h2", ReadSlow, 2500
		if err != "" {
			a.BodyBytes, a.BodyDigest, a.Err = 25_000, "part", err
		}
		return h
	}
	r := expect(t, slow("stream error: stream ID 1; INTERNAL_ERROR; received from peer"), "slow-reader-cut")
	if s := r.Anomalies[0].Summary; !strings.Contains(s, "2500 bytes a second over h2") || !strings.Contains(s, "25000 bytes") {
		t.Errorf("summary %q does not say how fast the client read and how much it got", s)
	}

	// Its instance killed under it: excused.
	h := slow("unexpected EOF")
	h.fault(Kill, "a", "", 8, 9)
	expect(t, h, "")
	// Or reloaded under it.
	h = slow("unexpected EOF")
	h.fault(Reload, "a", "", 8, 8.1)
	expect(t, h, "")
	// Another instance's kill excuses nothing, nor a kill after the
	// answer was cut, nor a stall of its link.
	for _, f := range []Fault{
		{Kind: Kill, Instance: "b", Start: sec(8), End: sec(9)},
		{Kind: Kill, Instance: "a", Start: sec(12), End: sec(13)},
		{Kind: Stall, Instance: "a", Store: Postgres, Start: sec(5), End: sec(6)},
	} {
		h = slow("unexpected EOF")
		h.Faults = []Fault{f}
		expect(t, h, "slow-reader-cut")
	}

	// Read to the end, however slowly: the promise kept.
	expect(t, slow(""), "")
}

func TestAnAnswerCutWhileItsUpstreamWasSilentIsAnAnomaly(t *testing.T) {
	silent := func(err string) *History {
		h := newHistory()
		x := h.execOf(0, 1, "a", 1, 30, 201, 64<<10)
		a := h.gotOf(0, "a", 1, 30, x, false)
		a.Proto, a.AskSize, a.AskSilence = "h2", 64<<10, sec(20)
		if err != "" {
			a.End, a.BodyBytes, a.BodyDigest, a.Err = sec(12), 0, "empty", err
		}
		return h
	}
	r := expect(t, silent("stream error: stream ID 1; INTERNAL_ERROR; received from peer"), "silent-upstream-cut")
	if s := r.Anomalies[0].Summary; !strings.Contains(s, "silent for 20.000s") || !strings.Contains(s, "over h2") {
		t.Errorf("summary %q does not say how long the upstream was silent and over what", s)
	}
	// Its instance killed or reloaded under it: excused.
	h := silent("unexpected EOF")
	h.fault(Kill, "a", "", 8, 9)
	expect(t, h, "")
	h = silent("unexpected EOF")
	h.fault(Reload, "a", "", 8, 8.1)
	expect(t, h, "")
	// A slow reader's cut is slow-reader-cut's; a whole answer keeps the
	// promise.
	h = silent("unexpected EOF")
	h.Attempts[0].Read, h.Attempts[0].ReadRate = ReadSlow, 2000
	expect(t, h, "slow-reader-cut")
	// A steady client's retry that gave up (no client of its own) is not
	// judged here.
	h = silent("context deadline exceeded")
	h.Attempts[0].Proto = ""
	expect(t, h, "")
	expect(t, silent(""), "")
}
