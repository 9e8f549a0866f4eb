package redis

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// TestUnpackReplayTakesThePartsByTheirLengths: head, body and detail come
// back whole whatever bytes they hold (spaces included: only the four
// numbers are cut at spaces), and an empty body or detail is nil.
func TestUnpackReplayTakesThePartsByTheirLengths(t *testing.T) {
	for _, c := range []struct{ head, body, detail string }{
		{"h", "a body with spaces ", "d e t"},
		{" \x00 ", "", ""},
		{"head", "", "detail"},
		{"head", "body", ""},
	} {
		packed := "1733300000000 1733303600000 " + strconv.Itoa(len(c.head)) + " " + strconv.Itoa(len(c.body)) + " " + c.head + c.body + c.detail
		created, expiry, head, body, detail, err := unpackReplay(packed)
		if err != nil {
			t.Fatalf("%q: %v", packed, err)
		}
		if created != 1733300000000 || expiry != 1733303600000 || string(head) != c.head || string(body) != c.body || string(detail) != c.detail {
			t.Fatalf("%q: %d %d %q %q %q", packed, created, expiry, head, body, detail)
		}
		if (c.body == "") != (body == nil) || (c.detail == "") != (detail == nil) {
			t.Fatalf("%q: an empty part is not nil, or a part is nil", packed)
		}
	}
}

// TestUnpackReplayRefusesWhatNoScriptWrites: a malformed packed replay is
// a corruption error, never a panic or a part cut short.
func TestUnpackReplayRefusesWhatNoScriptWrites(t *testing.T) {
	for _, packed := range []string{
		"", "1", "1 2 3", "1 2 3 4", "1 2 3 4 ab", "1 2 2 4 abc", "x 2 1 0 h", "1 2 -1 0 h", "1 2 1 -1 h",
		"1 2 1 9223372036854775807 hb", "1 2 99999999999999999999 0 h", strings.Repeat(" ", 8),
	} {
		if _, _, _, _, _, err := unpackReplay(packed); !errors.Is(err, storage.ErrCorrupt) {
			t.Errorf("%q: %v, want a corruption error", packed, err)
		}
	}
}
