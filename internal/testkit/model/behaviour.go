package model

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Headers the model's requests and answers carry.
const (
	// HeaderReq names an attempt: unique per request sent.
	HeaderReq = "X-Model-Req"
	// HeaderIntent names what the client means: its scope and key. The
	// upstream echoes it in its answer, so a replay shows whose it is.
	HeaderIntent = "X-Model-Intent"
	// HeaderDo tells the upstream (and the fault handler) how to behave.
	HeaderDo = "X-Model-Do"
	// HeaderPath b sends a request through the handlers of path b: the
	// store through its second route, as on another Caddy instance.
	HeaderPath = "X-Model-Path"
	// HeaderSite fill sends a request to the fill site (Store.FillKeys).
	HeaderSite = "X-Model-Site"
)

// Behaviour is what the upstream, and the fault handler in front of it,
// do with one request.
type Behaviour struct {
	Status            int           // the final status, any three digits (042 included)
	Interim           []int         // 1xx answers sent before it
	Delay             time.Duration // before answering
	ChunkDelay        time.Duration // between body chunks (chunked)
	Size              int           // body size
	Gzip              bool          // gzip the body whatever the request accepts
	Trailer           bool          // send trailers (chunked)
	Location          bool          // set a Location header
	BreakAfter        int           // >= 0: close after this many body bytes
	CloseBeforeStatus bool          // close the connection without answering
	Panic             string        // fault handler: "before" or "after" the status
	// Reset closes the connection of CloseBeforeStatus and BreakAfter
	// with a reset (SO_LINGER 0) instead of an EOF (version 3).
	Reset bool
	// Fail routes the request to a reverse_proxy that fails before the
	// upstream's status (version 3): FailRefused dials an address that
	// refuses connections (nothing is sent), FailTimeout waits for the
	// upstream's headers less than it takes (the request was sent).
	Fail string
	// Silence, when set, is how long the upstream sends nothing once
	// SilenceAfter bytes of its body are sent and flushed (0: its status
	// and headers alone, sent chunked, which Caddy hands on at once): an
	// SSE stream, an LLM, a long computation after the headers.
	Silence      time.Duration
	SilenceAfter int
}

// Failures a Behaviour's Fail asks the proxy for.
const (
	FailRefused = "refused"
	FailTimeout = "timeout"
)

// String encodes b for the X-Model-Do header.
func (b Behaviour) String() string {
	var parts []string
	add := func(k string, v any) { parts = append(parts, fmt.Sprintf("%s=%v", k, v)) }
	add("s", b.Status)
	for _, i := range b.Interim {
		add("i", i)
	}
	if b.Delay > 0 {
		add("d", b.Delay.Milliseconds())
	}
	if b.ChunkDelay > 0 {
		add("cd", b.ChunkDelay.Milliseconds())
	}
	add("n", b.Size)
	if b.Gzip {
		add("gz", 1)
	}
	if b.Trailer {
		add("tr", 1)
	}
	if b.Location {
		add("loc", 1)
	}
	if b.BreakAfter >= 0 {
		add("br", b.BreakAfter)
	}
	if b.CloseBeforeStatus {
		add("cl", 1)
	}
	if b.Panic != "" {
		add("p", b.Panic)
	}
	if b.Reset {
		add("rst", 1)
	}
	if b.Fail != "" {
		add("f", b.Fail)
	}
	if b.Silence > 0 {
		add("si", b.Silence.Milliseconds())
		add("sa", b.SilenceAfter)
	}
	return strings.Join(parts, ";")
}

// ParseBehaviour decodes the X-Model-Do header; an empty one is a plain
// 201.
func ParseBehaviour(s string) (Behaviour, error) {
	b := Behaviour{Status: 201, Size: 64, BreakAfter: -1}
	if s == "" {
		return b, nil
	}
	for part := range strings.SplitSeq(s, ";") {
		k, v, _ := strings.Cut(part, "=")
		n, err := strconv.Atoi(v)
		if err != nil && k != "p" && k != "f" {
			return b, fmt.Errorf("behaviour %q: %q", s, part)
		}
		switch k {
		case "s":
			b.Status = n
		case "i":
			b.Interim = append(b.Interim, n)
		case "d":
			b.Delay = time.Duration(n) * time.Millisecond
		case "cd":
			b.ChunkDelay = time.Duration(n) * time.Millisecond
		case "n":
			b.Size = n
		case "gz":
			b.Gzip = true
		case "tr":
			b.Trailer = true
		case "loc":
			b.Location = true
		case "br":
			b.BreakAfter = n
		case "cl":
			b.CloseBeforeStatus = true
		case "p":
			b.Panic = v
		case "rst":
			b.Reset = true
		case "f":
			b.Fail = v
		case "si":
			b.Silence = time.Duration(n) * time.Millisecond
		case "sa":
			b.SilenceAfter = n
		}
	}
	return b, nil
}

// ValidFinal reports whether the behaviour's final status is one a record
// can hold (storage.ValidStatus).
func (b Behaviour) ValidFinal() bool { return b.Status >= 200 && b.Status <= 999 }

// Settles says how an attempt that owns its key ends, by the contract:
// the key freed (nothing reached the upstream, or its status is in
// release_on: see judge.frees), kept as an outcome-unknown record (the
// request reached the upstream, or may have, and no final status came
// back), or recorded with the status (and the body, unless it broke off).
type Settles uint8

const (
	SettlesWithStatus Settles = iota // a final status reached the handler
	SettlesNotSent                   // nothing reached the upstream: the key is freed
	SettlesUnknown                   // the outcome is unknown: the key is kept (on_unknown_outcome keep)
)

// Settles is how the handler in front of the upstream must settle the
// key of an attempt with behaviour b that owns it.
func (b Behaviour) Settles() Settles {
	switch {
	case b.Panic == "before":
		return SettlesUnknown // the handler cannot tell what a panic did
	case b.Fail == FailRefused:
		return SettlesNotSent
	case b.Fail == FailTimeout, b.CloseBeforeStatus, !b.ValidFinal():
		return SettlesUnknown
	}
	return SettlesWithStatus
}

// failure names how b fails before its status, for reports.
func (b Behaviour) failure() string {
	switch {
	case b.Panic == "before":
		return "the handler in front of the upstream panicked before it"
	case b.Fail == FailRefused:
		return "its address refused the connection"
	case b.Fail == FailTimeout:
		return "a response-header timeout"
	case b.CloseBeforeStatus && b.Reset:
		return "the upstream reset the connection after reading the request"
	case b.CloseBeforeStatus:
		return "the upstream closed the connection after reading the request"
	case !b.ValidFinal():
		return fmt.Sprintf("the upstream answered status %03d", b.Status)
	}
	return "no failure"
}

// failureKind names how b fails, in a word ("" when it does not): for
// the model's report of what ran.
func (b Behaviour) failureKind() string {
	switch {
	case b.Panic == "before":
		return "panic-before"
	case b.Fail != "":
		return b.Fail
	case b.CloseBeforeStatus && b.Reset:
		return "reset"
	case b.CloseBeforeStatus:
		return "eof"
	case !b.ValidFinal():
		return "invalid-status"
	case b.BreakAfter >= 0 && b.Reset:
		return "reset-mid-body"
	case b.BreakAfter >= 0 || b.Panic == "after":
		return "mid-body"
	case b.Status >= 500:
		return "5xx"
	}
	return ""
}

// Executes reports whether an attempt with behaviour b that owns its key
// reaches the upstream.
func (b Behaviour) Executes() bool { return b.Panic != "before" && b.Fail != FailRefused }

// FailsBeforeStatus reports whether no final status reaches the handler
// in front of the upstream.
func (b Behaviour) FailsBeforeStatus() bool { return b.Settles() != SettlesWithStatus }

// BreaksAfterStatus reports whether the answer fails once its status was
// sent: the key is kept, the body is not recorded.
func (b Behaviour) BreaksAfterStatus() bool {
	return !b.FailsBeforeStatus() && (b.BreakAfter >= 0 || b.Panic == "after")
}

// ProxyStatus is the status Caddy answers an attempt with behaviour b
// that fails before the upstream's status, 0 when it has none (a panic).
func (b Behaviour) ProxyStatus() int {
	switch {
	case b.Panic == "before":
		return 0
	case b.Fail == FailTimeout:
		return 504
	}
	return 502
}

func sortedKeys[M ~map[string]V, V any](m M) []string {
	return slices.Sorted(maps.Keys(m))
}
