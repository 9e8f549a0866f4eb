package redis

import (
	"bytes"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
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

// TestPackedReplayRoundTrip: a replay through the packed reply, with the
// script cache flushed before each write and read (the EVAL fallback),
// keeps head, body, detail and times whole, whatever bytes they hold.
func TestPackedReplayRoundTrip(t *testing.T) {
	addr := redistest.Addr()
	s := newTestStore(t, addr, Options{})
	admin := adminClient(t, addr)
	ctx := t.Context()
	for i, c := range []struct{ body, detail string }{
		{"a b  c \x00 12 34 ", "d e"}, {"", "detail"}, {"body", ""}, {" ", " "},
	} {
		key := storage.Key{Scope: "packed", ID: strconv.Itoa(i)}
		admin.ScriptFlush(ctx)
		tok := acquire(t, s, key, time.Minute)
		resp := &storage.Response{Status: http.StatusCreated, Header: http.Header{"X": {"1 2"}}, Body: []byte(c.body), Detail: []byte(c.detail)}
		if err := s.Complete(ctx, key, tok, resp, time.Hour); err != nil {
			t.Fatal(err)
		}
		admin.ScriptFlush(ctx)
		res, err := s.Reserve(ctx, key, fp, time.Minute)
		if err != nil || res.Outcome != storage.Replay {
			t.Fatalf("%d: %v %v, want a replay", i, res.Outcome, err)
		}
		r := res.Record
		if !bytes.Equal(r.Response.Body, []byte(c.body)) || string(r.Detail) != c.detail || r.Response.Status != http.StatusCreated || r.Response.Header.Get("X") != "1 2" {
			t.Fatalf("%d: %+v", i, r)
		}
		if d := r.ExpiresAt.Sub(r.CreatedAt); d < 59*time.Minute || d > 61*time.Minute {
			t.Fatalf("%d: created %v, expires %v: want an hour apart", i, r.CreatedAt, r.ExpiresAt)
		}
	}
}
