package storagetest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// fixture is one subtest's view of the store: a scope nobody else uses and
// helpers that fail the test on unexpected answers. Its helpers call
// t.Fatal, so use them from the test goroutine only.
type fixture struct {
	t     *testing.T
	store storage.Store
	ctx   context.Context
	scope string
	n     int
}

func newFixture(t *testing.T, store storage.Store) *fixture {
	return &fixture{t: t, store: store, ctx: t.Context(), scope: randomHex(16)}
}

// randomHex returns the hex of n random bytes.
func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) // never fails: crypto/rand crashes the program instead
	return hex.EncodeToString(b)
}

// fingerprint returns a SHA-256, the size the Caddy handler uses.
func fingerprint(s string) []byte {
	sum := sha256.Sum256([]byte(s))
	return sum[:]
}

var (
	fpA = fingerprint("request A")
	fpB = fingerprint("request B")
)

// key returns a key not used before in this subtest.
func (f *fixture) key() storage.Key {
	f.n++
	return storage.Key{Scope: f.scope, ID: "key-" + strconv.Itoa(f.n)}
}

func (f *fixture) reserve(key storage.Key, fp []byte, lease time.Duration) storage.Reservation {
	f.t.Helper()
	res, err := f.store.Reserve(f.ctx, key, fp, lease)
	if err != nil {
		f.t.Fatalf("Reserve(%q): %v", key.ID, err)
	}
	return res
}

// want reserves key and fails unless the outcome is want. It also checks
// what every outcome must carry.
func (f *fixture) want(key storage.Key, fp []byte, lease time.Duration, want storage.Outcome) storage.Reservation {
	f.t.Helper()
	res := f.reserve(key, fp, lease)
	if res.Outcome != want {
		f.t.Fatalf("Reserve(%q) = %v, want %v", key.ID, res.Outcome, want)
	}
	if msg := checkReservation(res); msg != "" {
		f.t.Fatalf("Reserve(%q): %s", key.ID, msg)
	}
	return res
}

// checkReservation returns what is wrong with res given its outcome, or "".
// It is safe to call from any goroutine.
func checkReservation(res storage.Reservation) string {
	switch res.Outcome {
	case storage.Acquired:
		if res.Token == 0 {
			return "acquired with token 0"
		}
		return ""
	case storage.Mismatch:
		if r := res.Record; r != nil && (len(r.Detail) == 0 || r.Response != nil || r.Fingerprint != nil || r.State != 0) {
			return fmt.Sprintf("mismatch with record %+v, want none or only a Detail", r)
		}
	case storage.Conflict:
		if res.Record == nil || res.Record.State != storage.InFlight {
			return fmt.Sprintf("conflict record %+v, want an in-flight record", res.Record)
		}
	case storage.Replay:
		if res.Record == nil || res.Record.State != storage.Completed || res.Record.Response == nil {
			return fmt.Sprintf("replay record %+v, want a completed record with a response", res.Record)
		}
	default:
		return fmt.Sprintf("unknown outcome %d", res.Outcome)
	}
	// Only an owner holds a lease.
	if res.Token != 0 {
		return fmt.Sprintf("%v with token %d, want 0", res.Outcome, res.Token)
	}
	return ""
}

// wantBefore is want for an outcome that holds only until a short lease
// or TTL of d, started at start, runs out. When the answer differs and d has
// passed meanwhile, the machine stalled rather than the store failed, so
// the subtest is skipped as inconclusive instead of failed; under CI=true
// it fails like every other skip (testutil.Unavailable).
func (f *fixture) wantBefore(start time.Time, d time.Duration, key storage.Key, fp []byte, want storage.Outcome) storage.Reservation {
	f.t.Helper()
	res := f.reserve(key, fp, longLease)
	if took := time.Since(start); res.Outcome != want && took >= d {
		testutil.Unavailable(f.t, "inconclusive: got %v after %v, past the %v this check relies on (machine overloaded?)", res.Outcome, took, d)
	}
	if res.Outcome != want {
		f.t.Fatalf("Reserve(%q) = %v, want %v", key.ID, res.Outcome, want)
	}
	if msg := checkReservation(res); msg != "" {
		f.t.Fatalf("Reserve(%q): %s", key.ID, msg)
	}
	return res
}

// acquire reserves a new lease on key and returns its token.
func (f *fixture) acquire(key storage.Key, fp []byte, lease time.Duration) storage.Token {
	f.t.Helper()
	return f.want(key, fp, lease, storage.Acquired).Token
}

func (f *fixture) complete(key storage.Key, token storage.Token, resp *storage.Response, ttl time.Duration) {
	f.t.Helper()
	if err := f.store.Complete(f.ctx, key, token, resp, ttl); err != nil {
		f.t.Fatalf("Complete(%q): %v", key.ID, err)
	}
}

// replays fails unless key replays a response equal to want.
func (f *fixture) replays(key storage.Key, fp []byte, want *storage.Response) *storage.Record {
	f.t.Helper()
	rec := f.want(key, fp, longLease, storage.Replay).Record
	if msg := diffResponse(rec.Response, want, true); msg != "" {
		f.t.Fatalf("replay of %q: %s", key.ID, msg)
	}
	return rec
}

// wantErr fails unless err matches want (nil for success).
func (f *fixture) wantErr(op string, err, want error) {
	f.t.Helper()
	if !errors.Is(err, want) { // errors.Is(nil, nil) holds
		f.t.Fatalf("%s: error %v, want %v", op, err, want)
	}
}

// wantTime fails unless got lies in [lo, hi] widened by clockSlack.
func (f *fixture) wantTime(what string, got, lo, hi time.Time) {
	f.t.Helper()
	if got.Before(lo.Add(-clockSlack)) || got.After(hi.Add(clockSlack)) {
		f.t.Fatalf("%s = %v, want between %v and %v (±%v)", what, got, lo, hi, clockSlack)
	}
}

// sampleResponse returns a response exercising what a store must keep
// exactly: multi-valued and empty header values, non-ASCII text, and a body
// with every byte value, NUL at both ends. Each call returns a fresh copy,
// so that stores keeping the caller's pointer cannot make a comparison
// trivially true.
func sampleResponse() *storage.Response {
	body := make([]byte, 0, 3*256+1)
	for range 3 {
		for i := range 256 {
			body = append(body, byte(i))
		}
	}
	body = append(body, 0)
	return &storage.Response{
		Status: http.StatusCreated,
		Header: http.Header{
			"Content-Type": {"application/octet-stream"},
			"Set-Cookie":   {"a=1; Path=/", "b=2", "a=1; Path=/"},
			"X-Empty":      {""},
			"X-Text":       {"café \"quoted\" \\ back"},
		},
		Body: body,
	}
}

// textResponse returns a small response whose body says s.
func textResponse(s string) *storage.Response {
	return &storage.Response{
		Status: http.StatusOK,
		Header: http.Header{"Content-Type": {"text/plain"}},
		Body:   []byte(s),
	}
}

// diffResponse describes how got differs from want, or returns "". A nil
// and an empty header or body are equal: stores need not tell them apart.
func diffResponse(got, want *storage.Response, withBody bool) string {
	switch {
	case got == nil:
		return "no response"
	case got.Status != want.Status:
		return fmt.Sprintf("status %d, want %d", got.Status, want.Status)
	case !maps.EqualFunc(got.Header, want.Header, slices.Equal):
		return fmt.Sprintf("header %q, want %q", got.Header, want.Header)
	case got.BodyOmitted != want.BodyOmitted:
		return fmt.Sprintf("BodyOmitted %v, want %v", got.BodyOmitted, want.BodyOmitted)
	case got.OutcomeUnknown != want.OutcomeUnknown:
		return fmt.Sprintf("OutcomeUnknown %v, want %v", got.OutcomeUnknown, want.OutcomeUnknown)
	case withBody && string(got.Body) != string(want.Body):
		return fmt.Sprintf("body of %d bytes %q, want %d bytes %q", len(got.Body), got.Body, len(want.Body), want.Body)
	case !withBody && len(got.Body) != 0:
		return fmt.Sprintf("body of %d bytes, want none", len(got.Body))
	}
	return ""
}
