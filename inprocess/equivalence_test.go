package inprocess_test

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/klauspost/compress/zstd"
)

// These tests send what HTTP calls one request in its several spellings
// (RFC 9110: a host's case, its trailing dot and default port; a body's
// content codings) through a real Caddy, and count the upstream's
// executions: one per request, however it was spelt.

// recordingUpstream answers 201 and keeps every request it got, its body
// byte for byte.
type recordingUpstream struct {
	*httptest.Server
	mu   sync.Mutex
	got  []recorded
	body string
}

type recorded struct {
	host, encoding string
	body           []byte
}

func newRecordingUpstream(t *testing.T) *recordingUpstream {
	u := &recordingUpstream{body: `{"id":"pay_1","status":"captured"}`}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.got = append(u.got, recorded{host: r.Host, encoding: r.Header.Get("Content-Encoding"), body: b})
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, u.body)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *recordingUpstream) requests() []recorded {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.got)
}

// loadAnyHost runs a Caddyfile site that serves every host on a fresh
// port (no host matcher: the Host header is the client's to spell) and
// returns its base URL.
func loadAnyHost(t *testing.T, site string) string {
	t.Helper()
	port := freePort(t)
	cfg := fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n\thttp_port %d\n\tlog {\n\t\tlevel ERROR\n\t}\n}\n\nhttp://:%d {\n%s\n}\n", port, port, site)
	js, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(caddyfile.Format([]byte(cfg)), map[string]any{"filename": "Caddyfile"})
	if err != nil || len(warnings) > 0 {
		t.Fatalf("adapt: %v %v\n%s", err, warnings, cfg)
	}
	if err := caddy.Load(js, true); err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	return fmt.Sprintf("http://127.0.0.1:%d", port)
}

// send posts body to url with the Host and header lines given.
func send(t *testing.T, url, host string, body []byte, header ...string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Host = host
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// encodeBody applies codings to b in order, as a client does.
func encodeBody(t *testing.T, b []byte, codings ...string) []byte {
	t.Helper()
	for _, c := range codings {
		var buf bytes.Buffer
		var w io.WriteCloser
		switch c {
		case "gzip":
			w = gzip.NewWriter(&buf)
		case "deflate":
			w = zlib.NewWriter(&buf)
		case "raw-deflate":
			w, _ = flate.NewWriter(&buf, flate.DefaultCompression)
		case "zstd":
			w, _ = zstd.NewWriter(&buf, zstd.WithEncoderConcurrency(1))
		}
		_, _ = w.Write(b)
		_ = w.Close()
		b = buf.Bytes()
	}
	return b
}

// TestHostSpellingsShareOneScope: "localhost", "LOCALHOST", "LocalHost",
// "localhost." and "localhost:80" are one site (RFC 9110 4.2.3): one key
// runs once for all of them, with the default scope and with one of
// {http.request.hostport}; another site's request with the same key runs
// on its own (it is another client's key).
func TestHostSpellingsShareOneScope(t *testing.T) {
	for name, scope := range map[string]string{"host": "", "hostport": `scope "{http.request.hostport} {http.request.header.Authorization}"`} {
		t.Run(name, func(t *testing.T) {
			up := newRecordingUpstream(t)
			base := loadAnyHost(t, fmt.Sprintf("\tidempotency {\n\t\tstorage memory {\n\t\t\tmax_keys %d\n\t\t}\n\t\t%s\n\t}\n\treverse_proxy %s",
				uniqueMaxKeys(), scope, up.Listener.Addr()))
			body := []byte(`{"amount":10}`)
			for i, host := range []string{"localhost", "LOCALHOST", "LocalHost", "localhost.", "localhost:80", "LOCALHOST.:80"} {
				resp, got := send(t, base+"/payments", host, body, "Idempotency-Key", "pay-1", "Authorization", "Bearer a")
				if resp.StatusCode != http.StatusCreated || string(got) != up.body || (i > 0) != (resp.Header.Get("Idempotent-Replayed") == "true") {
					t.Errorf("Host %q: %d replayed=%q %s", host, resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), got)
				}
			}
			if n := len(up.requests()); n != 1 {
				t.Fatalf("the upstream ran %d times for one key sent to one site under six spellings of its host, want 1", n)
			}
			for _, host := range []string{"example.test", "localhost.example"} {
				if resp, _ := send(t, base+"/payments", host, body, "Idempotency-Key", "pay-1", "Authorization", "Bearer a"); resp.Header.Get("Idempotent-Replayed") != "" {
					t.Errorf("Host %q got the replay of another site's request", host)
				}
			}
			if n := len(up.requests()); n != 3 {
				t.Fatalf("the upstream ran %d times, want 3: once for each site", n)
			}
		})
	}
}

// TestCodedBodiesAreOneRequest: a JSON body sent as it is, gzipped,
// deflated (zlib's format, or raw as some clients send it), in zstd or in
// codings stacked is one request: one execution, the others replayed. The
// upstream gets the bytes the client sent, coded as they were.
func TestCodedBodiesAreOneRequest(t *testing.T) {
	up := newRecordingUpstream(t)
	base := loadAnyHost(t, fmt.Sprintf("\tidempotency {\n\t\tstorage memory {\n\t\t\tmax_keys %d\n\t\t}\n\t}\n\treverse_proxy %s", uniqueMaxKeys(), up.Listener.Addr()))
	content := []byte(`{"amount":10,"currency":"EUR","note":"` + strings.Repeat("x", 300) + `"}`)
	first := encodeBody(t, content, "gzip")
	resp, got := send(t, base+"/payments", "localhost", first, "Idempotency-Key", "pay-2", "Content-Encoding", "gzip")
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("a gzipped JSON body: %d %s", resp.StatusCode, got)
	}
	for _, c := range []struct {
		header  string
		codings []string
	}{
		{"", nil},
		{"identity", nil},
		{"GZIP", []string{"gzip"}},
		{"x-gzip", []string{"gzip"}},
		{"deflate", []string{"deflate"}},
		{"deflate", []string{"raw-deflate"}},
		{"zstd", []string{"zstd"}},
		{"gzip, zstd", []string{"gzip", "zstd"}},
	} {
		var header []string
		if c.header != "" {
			header = []string{"Content-Encoding", c.header}
		}
		resp, got := send(t, base+"/payments", "localhost", encodeBody(t, content, c.codings...), append(header, "Idempotency-Key", "pay-2")...)
		if resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "true" || string(got) != up.body {
			t.Errorf("the body as %q %v: %d replayed=%q %s; want the replay", c.header, c.codings, resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), got)
		}
	}
	reqs := up.requests()
	if len(reqs) != 1 {
		t.Fatalf("the upstream ran %d times for one body in several codings, want 1", len(reqs))
	}
	if !bytes.Equal(reqs[0].body, first) || reqs[0].encoding != "gzip" {
		t.Fatalf("the upstream got %d bytes of Content-Encoding %q, the client sent %d gzipped", len(reqs[0].body), reqs[0].encoding, len(first))
	}
}

// TestKeyJSONReadsTheKeyOfACodedBody: a webhook whose key is in its body
// (key_json), delivered gzipped, is keyed by it: its redelivery, gzipped
// or not, is replayed, never run again.
func TestKeyJSONReadsTheKeyOfACodedBody(t *testing.T) {
	up := newRecordingUpstream(t)
	base := loadAnyHost(t, fmt.Sprintf("\tidempotency {\n\t\tstorage memory {\n\t\t\tmax_keys %d\n\t\t}\n\t\tkey_json /id\n\t}\n\treverse_proxy %s", uniqueMaxKeys(), up.Listener.Addr()))
	event := []byte(`{"id":"evt_1","type":"payment.succeeded","amount":10}`)
	for i, codings := range [][]string{{"gzip"}, {"gzip"}, nil, {"zstd"}} {
		var header []string
		if codings != nil {
			header = []string{"Content-Encoding", codings[0]}
		}
		resp, got := send(t, base+"/webhooks", "localhost", encodeBody(t, event, codings...), header...)
		if resp.StatusCode != http.StatusCreated || (i > 0) != (resp.Header.Get("Idempotent-Replayed") == "true") {
			t.Errorf("delivery %d (%v): %d replayed=%q %s", i+1, codings, resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), got)
		}
	}
	if n := len(up.requests()); n != 1 {
		t.Fatalf("the webhook ran %d times for one event delivered four times, want 1", n)
	}
}

// problemOf decodes a problem answer.
func problemOf(t *testing.T, b []byte) (p struct {
	Type    string   `json:"type"`
	Status  int      `json:"status"`
	Detail  string   `json:"detail"`
	Differs []string `json:"differs"`
}) {
	t.Helper()
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatalf("not a problem: %q", b)
	}
	return p
}

// TestACodingNotDecodedIsRefusedForKeyJSONAndComparedByteForByte: a body
// of a coding the handler does not decode (br) cannot be searched for
// its key: key_json refuses it with 415, naming the coding and listing
// the codings it decodes in Accept-Encoding (RFC 9110 15.5.16), and never
// passes it on unprotected. With the key in its header, such a body is
// compared byte for byte with its coding: the same bytes as they are are
// another request (422).
func TestACodingNotDecodedIsRefusedForKeyJSONAndComparedByteForByte(t *testing.T) {
	up := newRecordingUpstream(t)
	base := loadAnyHost(t, fmt.Sprintf("\tidempotency {\n\t\tstorage memory {\n\t\t\tmax_keys %d\n\t\t}\n\t\tkey_json /id\n\t}\n\treverse_proxy %s", uniqueMaxKeys(), up.Listener.Addr()))
	body := []byte(`{"id":"evt_2","amount":10}`) // labelled br: the handler cannot know
	for range 2 {
		resp, got := send(t, base+"/webhooks", "localhost", body, "Content-Encoding", "br")
		p := problemOf(t, got)
		if resp.StatusCode != http.StatusUnsupportedMediaType || p.Type != "urn:caddy-idempotency:body-encoding-unsupported" ||
			!strings.Contains(p.Detail, "br") || resp.Header.Get("Accept-Encoding") != "gzip, deflate, zstd" {
			t.Fatalf("a key_json body in br: %d Accept-Encoding %q %s", resp.StatusCode, resp.Header.Get("Accept-Encoding"), got)
		}
	}
	if n := len(up.requests()); n != 0 {
		t.Fatalf("the upstream ran %d times for bodies it was refused, want 0", n)
	}
	resp, _ := send(t, base+"/webhooks", "localhost", body, "Content-Encoding", "br", "Idempotency-Key", "evt-2")
	replay, _ := send(t, base+"/webhooks", "localhost", body, "Content-Encoding", "br", "Idempotency-Key", "evt-2")
	plain, got := send(t, base+"/webhooks", "localhost", body, "Idempotency-Key", "evt-2")
	if resp.StatusCode != http.StatusCreated || replay.Header.Get("Idempotent-Replayed") != "true" || plain.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("with a key header: %d, then %d replayed=%q, then as it is %d %s", resp.StatusCode, replay.StatusCode, replay.Header.Get("Idempotent-Replayed"), plain.StatusCode, got)
	}
	if p := problemOf(t, got); !slices.Contains(p.Differs, "body") {
		t.Errorf("the 422 differs %q, want body", p.Differs)
	}
	if reqs := up.requests(); len(reqs) != 1 || !bytes.Equal(reqs[0].body, body) || reqs[0].encoding != "br" {
		t.Fatalf("the upstream got %d requests, want the br body once as sent", len(reqs))
	}
}

// TestCodedBodiesAreBoundedDecoded: max_body_size bounds the decoded
// content: a gzip bomb of a few KiB that decodes to 64 MiB gets 413 and
// never runs; content within the limit runs however it is coded; a body
// that does not decode as it says gets 400.
func TestCodedBodiesAreBoundedDecoded(t *testing.T) {
	up := newRecordingUpstream(t)
	base := loadAnyHost(t, fmt.Sprintf("\tidempotency {\n\t\tstorage memory {\n\t\t\tmax_keys %d\n\t\t}\n\t\tmax_body_size 64KiB\n\t}\n\treverse_proxy %s", uniqueMaxKeys(), up.Listener.Addr()))
	bomb := encodeBody(t, make([]byte, 64<<20), "gzip")
	for _, c := range []struct {
		coding string
		body   []byte
	}{{"gzip", bomb}, {"zstd", encodeBody(t, make([]byte, 64<<20), "zstd")}, {"gzip, gzip", encodeBody(t, make([]byte, 64<<20), "gzip", "gzip")}} {
		resp, got := send(t, base+"/payments", "localhost", c.body, "Idempotency-Key", "bomb", "Content-Encoding", c.coding, "Content-Type", "application/octet-stream")
		if p := problemOf(t, got); resp.StatusCode != http.StatusRequestEntityTooLarge || p.Type != "urn:caddy-idempotency:body-too-large" {
			t.Errorf("%s bomb of %d bytes: %d %s", c.coding, len(c.body), resp.StatusCode, got)
		}
	}
	// Content of the limit's size, in a coding that makes it larger.
	random := make([]byte, 64<<10)
	_, _ = rand.NewChaCha8([32]byte{1}).Read(random)
	coded := encodeBody(t, random, "gzip")
	resp, got := send(t, base+"/payments", "localhost", coded, "Idempotency-Key", "at-limit", "Content-Encoding", "gzip", "Content-Type", "application/octet-stream")
	if resp.StatusCode != http.StatusCreated || len(coded) <= len(random) {
		t.Errorf("content at the limit, gzipped into %d bytes: %d %s", len(coded), resp.StatusCode, got)
	}
	cut := encodeBody(t, []byte(`{"amount":10}`), "gzip")
	resp, got = send(t, base+"/payments", "localhost", cut[:len(cut)-4], "Idempotency-Key", "cut", "Content-Encoding", "gzip")
	if p := problemOf(t, got); resp.StatusCode != http.StatusBadRequest || p.Type != "urn:caddy-idempotency:body-encoding-invalid" || !strings.Contains(p.Detail, "gzip") {
		t.Errorf("a gzip body cut short: %d %s", resp.StatusCode, got)
	}
	if n := len(up.requests()); n != 1 {
		t.Fatalf("the upstream ran %d times, want 1 (the body within the limit)", n)
	}
}

// TestMismatchOfCodedBodiesNamesTheMembersThatDiffer: a key reused for a
// body of other content, in another coding, gets a 422 naming what
// differs in the decoded JSON.
func TestMismatchOfCodedBodiesNamesTheMembersThatDiffer(t *testing.T) {
	up := newRecordingUpstream(t)
	base := loadAnyHost(t, fmt.Sprintf("\tidempotency {\n\t\tstorage memory {\n\t\t\tmax_keys %d\n\t\t}\n\t}\n\treverse_proxy %s", uniqueMaxKeys(), up.Listener.Addr()))
	send(t, base+"/payments", "localhost", encodeBody(t, []byte(`{"amount":10,"currency":"EUR"}`), "gzip"), "Idempotency-Key", "pay-3", "Content-Encoding", "gzip")
	resp, got := send(t, base+"/payments", "localhost", encodeBody(t, []byte(`{"currency":"EUR","amount":11}`), "zstd"), "Idempotency-Key", "pay-3", "Content-Encoding", "zstd")
	if p := problemOf(t, got); resp.StatusCode != http.StatusUnprocessableEntity || !slices.Equal(p.Differs, []string{"body", "/amount"}) {
		t.Fatalf("another amount, in zstd: %d differs %q", resp.StatusCode, p.Differs)
	}
}

// TestObserveModeHandsCodedBodiesOnUnchanged: in mode observe, a body the
// handler would refuse for its coding (one it does not decode under
// key_json, one that does not decode, one over the limit decoded) reaches
// the upstream as the client sent it, and the client gets the upstream's
// answer.
func TestObserveModeHandsCodedBodiesOnUnchanged(t *testing.T) {
	up := newRecordingUpstream(t)
	base := loadAnyHost(t, fmt.Sprintf("\tidempotency {\n\t\tstorage memory {\n\t\t\tmax_keys %d\n\t\t}\n\t\tmode observe\n\t\tkey_json /id\n\t\tmax_body_size 1KiB\n\t}\n\treverse_proxy %s", uniqueMaxKeys(), up.Listener.Addr()))
	cut := encodeBody(t, []byte(`{"id":"evt_3"}`), "gzip")
	bodies := []struct {
		coding string
		body   []byte
	}{
		{"br", []byte(`{"id":"evt_3"}`)},
		{"gzip", cut[:len(cut)-4]},
		{"gzip", encodeBody(t, make([]byte, 1<<20), "gzip")},
		{"zstd", encodeBody(t, []byte(`{"id":"evt_3"}`), "zstd")},
	}
	for _, b := range bodies {
		resp, got := send(t, base+"/webhooks", "localhost", b.body, "Content-Encoding", b.coding)
		if resp.StatusCode != http.StatusCreated || string(got) != up.body {
			t.Errorf("%s body of %d bytes: %d %s", b.coding, len(b.body), resp.StatusCode, got)
		}
	}
	reqs := up.requests()
	if len(reqs) != len(bodies) {
		t.Fatalf("the upstream got %d requests, want %d", len(reqs), len(bodies))
	}
	for i, r := range reqs {
		if !bytes.Equal(r.body, bodies[i].body) || r.encoding != bodies[i].coding {
			t.Errorf("request %d: the upstream got %d bytes of %q, the client sent %d of %q", i, len(r.body), r.encoding, len(bodies[i].body), bodies[i].coding)
		}
	}
}
