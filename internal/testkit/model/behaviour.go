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
}

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
		if err != nil && k != "p" {
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
		}
	}
	return b, nil
}

// ValidFinal reports whether the behaviour's final status is one a record
// can hold (storage.ValidStatus).
func (b Behaviour) ValidFinal() bool { return b.Status >= 200 && b.Status <= 999 }

// FailsBeforeStatus reports whether no final status reaches the handler
// in front of the upstream: the key must then be freed.
func (b Behaviour) FailsBeforeStatus() bool {
	return b.CloseBeforeStatus || b.Panic == "before" || !b.ValidFinal()
}

// BreaksAfterStatus reports whether the answer fails once its status was
// sent: the key is kept, the body is not recorded.
func (b Behaviour) BreaksAfterStatus() bool {
	return !b.FailsBeforeStatus() && (b.BreakAfter >= 0 || b.Panic == "after")
}

func sortedKeys[M ~map[string]V, V any](m M) []string {
	return slices.Sorted(maps.Keys(m))
}
