package idempotency_test

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	idempotency "github.com/caddy-idempotency/caddy-idempotency"
	"github.com/caddy-idempotency/caddy-idempotency/backend/backendtest"
)

// block wraps body lines in an idempotency block whose first option line
// is line 3 of "Testfile" (line 2 holds a harmless option), so that errors
// have a line number worth checking.
func block(body ...string) string {
	return "idempotency {\n\theader Idempotency-Key\n\t" + strings.Join(body, "\n\t") + "\n}\n"
}

// parse parses input (starting with the directive name, as the directive
// helper hands it over) into a fresh Handler.
func parse(input string) (*idempotency.Handler, error) {
	h := new(idempotency.Handler)
	err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input))
	return h, err
}

// asJSON renders h for failure messages (pointers would print as
// addresses).
func asJSON(h *idempotency.Handler) string {
	b, err := json.Marshal(h)
	if err != nil {
		return fmt.Sprintf("%+v (%v)", *h, err)
	}
	return string(b)
}

func TestCaddyfileOptions(t *testing.T) {
	tests := []struct {
		name  string
		input string
		want  idempotency.Handler
	}{
		{
			name:  "bare directive",
			input: "idempotency",
			want:  idempotency.Handler{},
		},
		{
			name:  "empty block",
			input: "idempotency {\n}",
			want:  idempotency.Handler{},
		},
		{
			name:  "storage memory without block",
			input: "idempotency {\n\tstorage memory\n}",
			want:  idempotency.Handler{StorageRaw: json.RawMessage(`{"backend":"memory"}`)},
		},
		{
			name:  "storage memory with empty block",
			input: "idempotency {\n\tstorage memory {\n\t}\n}",
			want:  idempotency.Handler{StorageRaw: json.RawMessage(`{"backend":"memory"}`)},
		},
		{
			name:  "storage memory max_keys",
			input: "idempotency {\n\tstorage memory {\n\t\tmax_keys 1000\n\t}\n}",
			want:  idempotency.Handler{StorageRaw: json.RawMessage(`{"backend":"memory","max_keys":1000}`)},
		},
		{
			name:  "storage memory max_bytes",
			input: "idempotency {\n\tstorage memory {\n\t\tmax_bytes 256MiB\n\t\tmax_keys 1000\n\t}\n}",
			want:  idempotency.Handler{StorageRaw: json.RawMessage(`{"backend":"memory","max_bytes":268435456,"max_keys":1000}`)},
		},
		{
			name:  "storage memory max_keys_per_scope",
			input: "idempotency {\n\tstorage memory {\n\t\tmax_keys 1000\n\t\tmax_keys_per_scope 50\n\t}\n}",
			want:  idempotency.Handler{StorageRaw: json.RawMessage(`{"backend":"memory","max_keys":1000,"max_keys_per_scope":50}`)},
		},
		{
			name:  "storage then more options",
			input: "idempotency {\n\tstorage memory {\n\t\tmax_keys 5\n\t}\n\tttl 1h\n}",
			want: idempotency.Handler{
				StorageRaw: json.RawMessage(`{"backend":"memory","max_keys":5}`),
				TTL:        caddy.Duration(time.Hour),
			},
		},
		// The redis and postgres blocks are tested beside their backends
		// (backend/*/caddyfile_test.go); here, that the directive hands
		// them over and goes on after them.
		{
			name:  "storage redis then more options",
			input: "idempotency {\n\tstorage redis redis://r:6379 {\n\t\tkey_prefix app:\n\t}\n\tttl 1h\n}",
			want: idempotency.Handler{
				StorageRaw: json.RawMessage(`{"backend":"redis","key_prefix":"app:","url":"redis://r:6379"}`),
				TTL:        caddy.Duration(time.Hour),
			},
		},
		{
			name:  "storage postgres then more options",
			input: "idempotency {\n\tstorage postgres {\n\t\tdsn host=db\n\t}\n\tttl 1h\n}",
			want: idempotency.Handler{
				StorageRaw: json.RawMessage(`{"backend":"postgres","dsn":"host=db"}`),
				TTL:        caddy.Duration(time.Hour),
			},
		},
		{
			name:  "ttl",
			input: block("ttl 48h"),
			want:  idempotency.Handler{Header: "Idempotency-Key", TTL: caddy.Duration(48 * time.Hour)},
		},
		{
			name:  "ttl in days",
			input: block("ttl 1d"),
			want:  idempotency.Handler{Header: "Idempotency-Key", TTL: caddy.Duration(24 * time.Hour)},
		},
		{
			name:  "ttl compound",
			input: block("ttl 1h30m"),
			want:  idempotency.Handler{Header: "Idempotency-Key", TTL: caddy.Duration(90 * time.Minute)},
		},
		{
			name:  "lock_timeout",
			input: block("lock_timeout 45s"),
			want:  idempotency.Handler{Header: "Idempotency-Key", LockTimeout: caddy.Duration(45 * time.Second)},
		},
		{
			name:  "lock_timeout in days",
			input: block("lock_timeout 1d"),
			want:  idempotency.Handler{Header: "Idempotency-Key", LockTimeout: caddy.Duration(24 * time.Hour)},
		},
		{
			name:  "methods are upper-cased",
			input: block("methods post Put PATCH"),
			want:  idempotency.Handler{Header: "Idempotency-Key", Methods: []string{"POST", "PUT", "PATCH"}},
		},
		{
			name:  "header",
			input: "idempotency {\n\theader X-Request-Key\n}",
			want:  idempotency.Handler{Header: "X-Request-Key"},
		},
		{
			name:  "required",
			input: block("required"),
			want:  idempotency.Handler{Header: "Idempotency-Key", Required: true},
		},
		{
			name:  "scope single placeholder",
			input: block("scope {http.request.header.X-Tenant}"),
			want:  idempotency.Handler{Header: "Idempotency-Key", Scope: "{http.request.header.X-Tenant}"},
		},
		{
			name:  "scope arguments joined with a space",
			input: block("scope {http.request.host}   {http.request.header.X-Tenant} v2"),
			want:  idempotency.Handler{Header: "Idempotency-Key", Scope: "{http.request.host} {http.request.header.X-Tenant} v2"},
		},
		{
			name:  "scope quoted template",
			input: block(`scope "{http.request.header.Authorization}  {http.request.header.X-Tenant}"`),
			want:  idempotency.Handler{Header: "Idempotency-Key", Scope: "{http.request.header.Authorization}  {http.request.header.X-Tenant}"},
		},
		{
			name:  "max_key_length",
			input: block("max_key_length 64"),
			want:  idempotency.Handler{Header: "Idempotency-Key", MaxKeyLength: 64},
		},
		{
			name:  "max_body_size MiB",
			input: block("max_body_size 1MiB"),
			want:  idempotency.Handler{Header: "Idempotency-Key", MaxBodySize: 1 << 20},
		},
		{
			name:  "max_body_size KB",
			input: block("max_body_size 512KB"),
			want:  idempotency.Handler{Header: "Idempotency-Key", MaxBodySize: 512_000},
		},
		{
			name:  "max_body_size bytes",
			input: block("max_body_size 2048"),
			want:  idempotency.Handler{Header: "Idempotency-Key", MaxBodySize: 2048},
		},
		{
			name:  "max_response_size MiB",
			input: block("max_response_size 4MiB"),
			want:  idempotency.Handler{Header: "Idempotency-Key", MaxResponseSize: 4 << 20},
		},
		{
			name:  "max_response_size KB",
			input: block("max_response_size 512KB"),
			want:  idempotency.Handler{Header: "Idempotency-Key", MaxResponseSize: 512_000},
		},
		{
			name:  "max_response_size bytes",
			input: block("max_response_size 2048"),
			want:  idempotency.Handler{Header: "Idempotency-Key", MaxResponseSize: 2048},
		},
		{
			name:  "fingerprint headers and canonical_json false",
			input: block("fingerprint {", "\theaders Content-Type X-Tenant", "\tcanonical_json false", "}"),
			want: idempotency.Handler{Header: "Idempotency-Key", Fingerprint: &idempotency.FingerprintConfig{
				Headers:       []string{"Content-Type", "X-Tenant"},
				CanonicalJSON: new(false),
			}},
		},
		{
			name:  "fingerprint canonical_json true",
			input: block("fingerprint {", "\tcanonical_json true", "}"),
			want:  idempotency.Handler{Header: "Idempotency-Key", Fingerprint: &idempotency.FingerprintConfig{CanonicalJSON: new(true)}},
		},
		{
			name:  "fingerprint headers only",
			input: block("fingerprint {", "\theaders X-Tenant", "}"),
			want:  idempotency.Handler{Header: "Idempotency-Key", Fingerprint: &idempotency.FingerprintConfig{Headers: []string{"X-Tenant"}}},
		},
		{
			name:  "fingerprint then more options",
			input: block("fingerprint {", "\theaders X-Tenant", "}", "ttl 2h"),
			want: idempotency.Handler{
				Header:      "Idempotency-Key",
				Fingerprint: &idempotency.FingerprintConfig{Headers: []string{"X-Tenant"}},
				TTL:         caddy.Duration(2 * time.Hour),
			},
		},
		{
			name:  "release_on codes and classes",
			input: block("release_on 5xx 429 409"),
			want:  idempotency.Handler{Header: "Idempotency-Key", ReleaseOn: []string{"5xx", "429", "409"}},
		},
		{
			name:  "release_on upper-case class",
			input: block("release_on 4XX"),
			want:  idempotency.Handler{Header: "Idempotency-Key", ReleaseOn: []string{"4XX"}},
		},
		{
			name:  "in_flight reject",
			input: block("in_flight reject"),
			want:  idempotency.Handler{Header: "Idempotency-Key", InFlight: "reject"},
		},
		{
			name:  "in_flight wait",
			input: block("in_flight wait"),
			want:  idempotency.Handler{Header: "Idempotency-Key", InFlight: "wait"},
		},
		{
			name:  "in_flight wait with timeout",
			input: block("in_flight wait 5s"),
			want:  idempotency.Handler{Header: "Idempotency-Key", InFlight: "wait", WaitTimeout: caddy.Duration(5 * time.Second)},
		},
		{
			name:  "on_storage_error fail_open",
			input: block("on_storage_error fail_open"),
			want:  idempotency.Handler{Header: "Idempotency-Key", OnStorageError: "fail_open"},
		},
		{
			name:  "on_storage_error fail_closed",
			input: block("on_storage_error fail_closed"),
			want:  idempotency.Handler{Header: "Idempotency-Key", OnStorageError: "fail_closed"},
		},
		{
			name:  "on_unknown_outcome release",
			input: block("on_unknown_outcome release"),
			want:  idempotency.Handler{Header: "Idempotency-Key", OnUnknownOutcome: "release"},
		},
		{
			name:  "on_unknown_outcome keep",
			input: block("on_unknown_outcome keep"),
			want:  idempotency.Handler{Header: "Idempotency-Key", OnUnknownOutcome: "keep"},
		},
		{
			name:  "replay_header name",
			input: block("replay_header X-Replayed"),
			want:  idempotency.Handler{Header: "Idempotency-Key", ReplayHeader: "X-Replayed"},
		},
		{
			name:  "replay_header off",
			input: block("replay_header off"),
			want:  idempotency.Handler{Header: "Idempotency-Key", ReplayHeader: "off"},
		},
		{
			name:  "docs_url",
			input: block("docs_url https://api.example.com/docs/idempotency"),
			want:  idempotency.Handler{Header: "Idempotency-Key", DocsURL: "https://api.example.com/docs/idempotency"},
		},
		{
			name: "every option",
			input: `idempotency {
	storage memory {
		max_keys 1000
	}
	ttl 1d
	lock_timeout 10s
	methods post put
	header X-Idem
	required
	scope {http.request.host} {http.request.header.X-Tenant}
	max_key_length 128
	max_body_size 2MiB
	max_response_size 512KB
	fingerprint {
		headers Content-Type X-Tenant
		canonical_json false
	}
	release_on 5xx 429
	in_flight wait 3s
	on_storage_error fail_open
	replay_header X-Replayed
	docs_url https://example.com/docs
}`,
			want: idempotency.Handler{
				StorageRaw:      json.RawMessage(`{"backend":"memory","max_keys":1000}`),
				TTL:             caddy.Duration(24 * time.Hour),
				LockTimeout:     caddy.Duration(10 * time.Second),
				Methods:         []string{"POST", "PUT"},
				Header:          "X-Idem",
				Required:        true,
				Scope:           "{http.request.host} {http.request.header.X-Tenant}",
				MaxKeyLength:    128,
				MaxBodySize:     2 << 20,
				MaxResponseSize: 512_000,
				Fingerprint: &idempotency.FingerprintConfig{
					Headers:       []string{"Content-Type", "X-Tenant"},
					CanonicalJSON: new(false),
				},
				ReleaseOn:      []string{"5xx", "429"},
				InFlight:       "wait",
				WaitTimeout:    caddy.Duration(3 * time.Second),
				OnStorageError: "fail_open",
				ReplayHeader:   "X-Replayed",
				DocsURL:        "https://example.com/docs",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parse(tt.input)
			if err != nil {
				t.Fatalf("UnmarshalCaddyfile(%q): %v", tt.input, err)
			}
			if !reflect.DeepEqual(*got, tt.want) {
				t.Errorf("UnmarshalCaddyfile(%q)\n got %s\nwant %s", tt.input, asJSON(got), asJSON(&tt.want))
			}
		})
	}
}

// TestCaddyfileStopsAtItsBlock checks that the parser consumes its own
// block and nothing after it (the next directive is not its business).
func TestCaddyfileStopsAtItsBlock(t *testing.T) {
	d := caddyfile.NewTestDispenser("idempotency {\n\tttl 1h\n}\nreverse_proxy localhost:8080\n")
	h := new(idempotency.Handler)
	if err := h.UnmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	if h.TTL != caddy.Duration(time.Hour) {
		t.Errorf("TTL = %v, want 1h", time.Duration(h.TTL))
	}
	if !d.Next() || d.Val() != "reverse_proxy" {
		t.Errorf("after the block the dispenser is at %q, want reverse_proxy", d.Val())
	}
}

// optionLines is one valid spelling of every option, for the duplicate
// tests; multi-line options are several entries joined by "\n".
var optionLines = map[string][]string{
	"storage":            {"storage memory {", "\tmax_keys 10", "}"},
	"ttl":                {"ttl 1h"},
	"lock_timeout":       {"lock_timeout 1s"},
	"methods":            {"methods POST"},
	"required":           {"required"},
	"scope":              {"scope {http.request.host}"},
	"max_key_length":     {"max_key_length 10"},
	"max_body_size":      {"max_body_size 1KB"},
	"max_response_size":  {"max_response_size 1KB"},
	"fingerprint":        {"fingerprint {", "\theaders X-A", "}"},
	"release_on":         {"release_on 5xx"},
	"in_flight":          {"in_flight reject"},
	"on_storage_error":   {"on_storage_error fail_open"},
	"on_unknown_outcome": {"on_unknown_outcome release"},
	"replay_header":      {"replay_header X-R"},
	"docs_url":           {"docs_url https://example.com/"},
}

func TestCaddyfileDuplicateOptions(t *testing.T) {
	for opt, lines := range optionLines {
		t.Run(opt, func(t *testing.T) {
			body := append(append([]string{}, lines...), lines...)
			// The first spelling starts on line 3; the duplicate right
			// after it.
			wantLine := 3 + len(lines)
			_, err := parse(block(body...))
			wantParseError(t, err, wantLine, opt, "already specified")
		})
	}
	// header is on line 2 of every block.
	t.Run("header", func(t *testing.T) {
		_, err := parse(block("header X-Other"))
		wantParseError(t, err, 3, "header", "already specified")
	})
	// in_flight with another mode is still a duplicate.
	t.Run("in_flight other mode", func(t *testing.T) {
		_, err := parse(block("in_flight reject", "in_flight wait 1s"))
		wantParseError(t, err, 4, "in_flight", "already specified")
	})
	// A duplicate after other options is still found.
	t.Run("ttl far apart", func(t *testing.T) {
		_, err := parse(block("ttl 1h", "required", "methods POST", "ttl 2h"))
		wantParseError(t, err, 6, "ttl", "already specified")
	})
}

// wantParseError asserts err is a parse error at Testfile:line whose message
// mentions every one of want; the backends' Caddyfile tests share it.
var wantParseError = backendtest.WantParseError

func TestCaddyfileErrors(t *testing.T) {
	tests := []struct {
		name  string
		input string // a full Caddyfile; else body is wrapped by cfBlock
		body  []string
		line  int
		want  []string
	}{
		// Unknown options.
		{name: "unknown option", body: []string{"colour red"}, line: 3, want: []string{"unrecognized", "'colour'"}},
		{name: "unknown option without args", body: []string{"ttl 1h", "strict"}, line: 4, want: []string{"unrecognized", "'strict'"}},
		{name: "option name is case sensitive", body: []string{"TTL 1h"}, line: 3, want: []string{"unrecognized", "'TTL'"}},
		{name: "unknown fingerprint option", body: []string{"fingerprint {", "\tcookies session", "}"}, line: 4, want: []string{"unrecognized fingerprint option", "'cookies'"}},
		{name: "unknown memory storage option", body: []string{"storage memory {", "\tshards 4", "}"}, line: 4, want: []string{"unrecognized memory storage option", "'shards'"}},

		// Duplicates inside nested blocks (top-level ones: TestCaddyfileDuplicateOptions).
		{name: "duplicate fingerprint headers", body: []string{"fingerprint {", "\theaders X-A", "\theaders X-B", "}"}, line: 5, want: []string{"headers", "already specified"}},
		{name: "duplicate fingerprint canonical_json", body: []string{"fingerprint {", "\tcanonical_json true", "\tcanonical_json false", "}"}, line: 5, want: []string{"canonical_json", "already specified"}},
		{name: "duplicate memory max_keys", body: []string{"storage memory {", "\tmax_keys 10", "\tmax_keys 20", "}"}, line: 5, want: []string{"max_keys", "already specified"}},

		// Missing arguments.
		{name: "storage without backend", body: []string{"storage"}, line: 3, want: []string{"wrong argument count", "'storage'"}},
		{name: "ttl without value", body: []string{"ttl"}, line: 3, want: []string{"wrong argument count", "'ttl'"}},
		{name: "lock_timeout without value", body: []string{"lock_timeout"}, line: 3, want: []string{"wrong argument count", "'lock_timeout'"}},
		{name: "methods without value", body: []string{"methods"}, line: 3, want: []string{"wrong argument count", "'methods'"}},
		{name: "header without value", input: "idempotency {\n\tttl 1h\n\theader\n}", line: 3, want: []string{"wrong argument count", "'header'"}},
		{name: "scope without value", body: []string{"scope"}, line: 3, want: []string{"wrong argument count", "'scope'"}},
		{name: "max_key_length without value", body: []string{"max_key_length"}, line: 3, want: []string{"wrong argument count", "'max_key_length'"}},
		{name: "max_body_size without value", body: []string{"max_body_size"}, line: 3, want: []string{"wrong argument count", "'max_body_size'"}},
		{name: "max_response_size without value", body: []string{"max_response_size"}, line: 3, want: []string{"wrong argument count", "'max_response_size'"}},
		{name: "release_on without value", body: []string{"release_on"}, line: 3, want: []string{"wrong argument count", "'release_on'"}},
		{name: "in_flight without value", body: []string{"in_flight"}, line: 3, want: []string{"wrong argument count", "'in_flight'"}},
		{name: "on_storage_error without value", body: []string{"on_storage_error"}, line: 3, want: []string{"wrong argument count", "'on_storage_error'"}},
		{name: "replay_header without value", body: []string{"replay_header"}, line: 3, want: []string{"wrong argument count", "'replay_header'"}},
		{name: "docs_url without value", body: []string{"docs_url"}, line: 3, want: []string{"wrong argument count", "'docs_url'"}},
		{name: "fingerprint headers without value", body: []string{"fingerprint {", "\theaders", "}"}, line: 4, want: []string{"wrong argument count", "'headers'"}},
		{name: "fingerprint canonical_json without value", body: []string{"fingerprint {", "\tcanonical_json", "}"}, line: 4, want: []string{"wrong argument count", "'canonical_json'"}},
		{name: "memory max_keys without value", body: []string{"storage memory {", "\tmax_keys", "}"}, line: 4, want: []string{"wrong argument count", "'max_keys'"}},

		// Extra arguments.
		{name: "argument on the directive line", input: "idempotency extra {\n\tttl 1h\n}", line: 1, want: []string{"wrong argument count", "'extra'"}},
		{name: "argument on the bare directive line", input: "idempotency extra", line: 1, want: []string{"wrong argument count", "'extra'"}},
		{name: "ttl with two values", body: []string{"ttl 1s 2s"}, line: 3, want: []string{"wrong argument count", "'2s'"}},
		{name: "lock_timeout with two values", body: []string{"lock_timeout 1s 2s"}, line: 3, want: []string{"wrong argument count", "'2s'"}},
		{name: "required with a value", body: []string{"required yes"}, line: 3, want: []string{"wrong argument count", "'yes'"}},
		{name: "header with two values", input: "idempotency {\n\tttl 1h\n\theader X-A X-B\n}", line: 3, want: []string{"wrong argument count", "'X-B'"}},
		{name: "max_key_length with two values", body: []string{"max_key_length 1 2"}, line: 3, want: []string{"wrong argument count", "'2'"}},
		{name: "max_body_size with two values", body: []string{"max_body_size 1 MiB"}, line: 3, want: []string{"wrong argument count", "'MiB'"}},
		{name: "max_response_size with two values", body: []string{"max_response_size 1KB 2KB"}, line: 3, want: []string{"wrong argument count", "'2KB'"}},
		{name: "in_flight reject with a timeout", body: []string{"in_flight reject 5s"}, line: 3, want: []string{"wrong argument count", "'5s'"}},
		{name: "in_flight wait with two timeouts", body: []string{"in_flight wait 5s 6s"}, line: 3, want: []string{"wrong argument count", "'6s'"}},
		{name: "on_storage_error with two values", body: []string{"on_storage_error fail_open fail_closed"}, line: 3, want: []string{"wrong argument count", "'fail_closed'"}},
		{name: "replay_header with two values", body: []string{"replay_header X-A X-B"}, line: 3, want: []string{"wrong argument count", "'X-B'"}},
		{name: "docs_url with two values", body: []string{"docs_url https://a.example/ https://b.example/"}, line: 3, want: []string{"wrong argument count", "'https://b.example/'"}},
		{name: "fingerprint with an argument", body: []string{"fingerprint extra {", "\theaders X-A", "}"}, line: 3, want: []string{"wrong argument count", "'extra'"}},
		{name: "fingerprint canonical_json with two values", body: []string{"fingerprint {", "\tcanonical_json true false", "}"}, line: 4, want: []string{"wrong argument count", "'false'"}},
		{name: "storage memory with an argument", body: []string{"storage memory extra"}, line: 3, want: []string{"wrong argument count", "'extra'"}},
		{name: "memory max_keys with two values", body: []string{"storage memory {", "\tmax_keys 1 2", "}"}, line: 4, want: []string{"wrong argument count", "'2'"}},

		// A block after an option that takes none is refused (the message
		// names the brace, on the option's line).
		{name: "block after ttl", body: []string{"ttl 1h {", "\tfoo bar", "}"}, line: 3, want: []string{"'{'"}},
		{name: "block after required", body: []string{"required {", "}"}, line: 3, want: []string{"'{'"}},
		{name: "block after in_flight wait", body: []string{"in_flight wait {", "\ttimeout 5s", "}"}, line: 3, want: []string{"'{'"}},
		{name: "block after fingerprint headers", body: []string{"fingerprint {", "\theaders A {", "\t\tB", "\t}", "}"}, line: 4, want: []string{"'{'"}},
		{name: "block after memory max_keys", body: []string{"storage memory {", "\tmax_keys 5 {", "\t}", "}"}, line: 4, want: []string{"'{'"}},

		// Durations.
		{name: "invalid ttl", body: []string{"ttl soon"}, line: 3, want: []string{"ttl", "invalid duration", "'soon'"}},
		{name: "ttl without unit", body: []string{"ttl 5"}, line: 3, want: []string{"ttl", "invalid duration", "'5'"}},
		{name: "invalid lock_timeout", body: []string{"lock_timeout 1x"}, line: 3, want: []string{"lock_timeout", "invalid duration", "'1x'"}},
		{name: "invalid in_flight wait timeout", body: []string{"in_flight wait forever"}, line: 3, want: []string{"in_flight wait", "invalid duration", "'forever'"}},
		{name: "zero ttl", body: []string{"ttl 0s"}, line: 3, want: []string{"ttl", "must be positive", "'0s'"}},
		{name: "negative ttl", body: []string{"ttl -1h"}, line: 3, want: []string{"ttl", "must be positive", "'-1h'"}},
		{name: "zero lock_timeout", body: []string{"lock_timeout 0"}, line: 3, want: []string{"lock_timeout", "must be positive", "'0'"}},
		{name: "negative lock_timeout", body: []string{"lock_timeout -5s"}, line: 3, want: []string{"lock_timeout", "must be positive", "'-5s'"}},
		{name: "zero in_flight wait timeout", body: []string{"in_flight wait 0s"}, line: 3, want: []string{"in_flight wait", "must be positive", "'0s'"}},
		{name: "negative in_flight wait timeout", body: []string{"in_flight wait -1s"}, line: 3, want: []string{"in_flight wait", "must be positive", "'-1s'"}},

		// Integers.
		{name: "max_key_length not a number", body: []string{"max_key_length abc"}, line: 3, want: []string{"max_key_length", "positive integer", "'abc'"}},
		{name: "max_key_length fraction", body: []string{"max_key_length 1.5"}, line: 3, want: []string{"max_key_length", "positive integer", "'1.5'"}},
		{name: "max_key_length zero", body: []string{"max_key_length 0"}, line: 3, want: []string{"max_key_length", "positive integer", "'0'"}},
		{name: "max_key_length negative", body: []string{"max_key_length -5"}, line: 3, want: []string{"max_key_length", "positive integer", "'-5'"}},
		{name: "memory max_keys not a number", body: []string{"storage memory {", "\tmax_keys many", "}"}, line: 4, want: []string{"max_keys", "positive integer", "'many'"}},
		{name: "memory max_keys zero", body: []string{"storage memory {", "\tmax_keys 0", "}"}, line: 4, want: []string{"max_keys", "positive integer", "'0'"}},
		{name: "memory max_keys negative", body: []string{"storage memory {", "\tmax_keys -1", "}"}, line: 4, want: []string{"max_keys", "positive integer", "'-1'"}},

		// Sizes.
		{name: "max_body_size not a size", body: []string{"max_body_size lots"}, line: 3, want: []string{"max_body_size", "size", "'lots'"}},
		{name: "max_body_size unknown unit", body: []string{"max_body_size 1MX"}, line: 3, want: []string{"max_body_size", "size", "'1MX'"}},
		{name: "max_body_size zero", body: []string{"max_body_size 0"}, line: 3, want: []string{"max_body_size", "positive size", "'0'"}},
		{name: "max_body_size negative", body: []string{"max_body_size -1"}, line: 3, want: []string{"max_body_size", "size", "'-1'"}},
		{name: "max_response_size not a size", body: []string{"max_response_size big"}, line: 3, want: []string{"max_response_size", "size", "'big'"}},
		{name: "max_response_size zero", body: []string{"max_response_size 0KB"}, line: 3, want: []string{"max_response_size", "positive size", "'0KB'"}},
		{name: "max_response_size absurd", body: []string{"max_response_size 2TiB"}, line: 3, want: []string{"max_response_size", "size", "'2TiB'"}},

		// Floors.
		{name: "lock_timeout below a second", body: []string{"ttl 1h", "lock_timeout 1ns"}, line: 4, want: []string{"lock_timeout", "at least 1s", "1ns"}},
		{name: "ttl below a second", body: []string{"ttl 1ns"}, line: 3, want: []string{"ttl", "at least 1s", "1ns"}},
		{name: "ttl 999ms", body: []string{"lock_timeout 5s", "ttl 999ms"}, line: 4, want: []string{"ttl", "at least 1s", "999ms"}},
		{name: "in_flight wait timeout below the floor", body: []string{"in_flight wait 1ms", "ttl 1h"}, line: 3, want: []string{"wait_timeout must be at least 10ms, got 1ms"}},
		{name: "ttl below a second, options after", body: []string{"ttl 1ns", "required", "methods POST"}, line: 3, want: []string{"ttl", "at least 1s", "1ns"}},
		{name: "memory max_bytes below a megabyte, max_keys after", body: []string{"storage memory {", "\tmax_bytes 64KiB", "\tmax_keys 10", "}", "ttl 1h"}, line: 4, want: []string{"memory storage: max_bytes must be at least 1.0 MiB"}},
		{name: "scope blank", body: []string{"scope \" \""}, line: 3, want: []string{"scope", "blank"}},
		{name: "memory max_keys_per_scope zero", body: []string{"storage memory {", "\tmax_keys_per_scope 0", "}"}, line: 4, want: []string{"max_keys_per_scope", "positive integer", "'0'"}},
		{name: "memory max_bytes not a size", body: []string{"storage memory {", "\tmax_bytes lots", "}"}, line: 4, want: []string{"max_bytes", "size", "'lots'"}},
		{name: "memory max_bytes below a megabyte", body: []string{"storage memory {", "\tmax_keys 10", "\tmax_bytes 64KiB", "}"}, line: 5, want: []string{"memory storage: max_bytes must be at least 1.0 MiB, got 65536"}},
		{name: "duplicate memory max_bytes", body: []string{"storage memory {", "\tmax_bytes 1GiB", "\tmax_bytes 2GiB", "}"}, line: 5, want: []string{"max_bytes", "already specified"}},

		// release_on.
		{name: "release_on 6xx", body: []string{"release_on 6xx"}, line: 3, want: []string{"release_on", `"6xx"`}},
		{name: "release_on 99", body: []string{"release_on 99"}, line: 3, want: []string{"release_on", `"99"`}},
		{name: "release_on abc", body: []string{"release_on abc"}, line: 3, want: []string{"release_on", `"abc"`}},
		{name: "release_on 1xx", body: []string{"release_on 1xx"}, line: 3, want: []string{"release_on", `"1xx"`}},
		{name: "release_on informational code", body: []string{"release_on 103"}, line: 3, want: []string{"release_on", `"103"`}},
		{name: "release_on 600", body: []string{"release_on 600"}, line: 3, want: []string{"release_on", `"600"`}},
		{name: "release_on bad after good", body: []string{"release_on 5xx 429 4x"}, line: 3, want: []string{"release_on", `"4x"`}},

		// Enumerations.
		{name: "bad in_flight mode", body: []string{"in_flight sometimes"}, line: 3, want: []string{"in_flight", "reject", "wait", "'sometimes'"}},
		{name: "in_flight mode is case sensitive", body: []string{"in_flight Wait"}, line: 3, want: []string{"in_flight", "'Wait'"}},
		{name: "bad on_storage_error", body: []string{"on_storage_error maybe"}, line: 3, want: []string{"on_storage_error", "fail_closed", "fail_open", "'maybe'"}},
		{name: "bad on_unknown_outcome", body: []string{"on_unknown_outcome retry"}, line: 3, want: []string{"on_unknown_outcome", "keep", "release", "'retry'"}},
		{name: "on_unknown_outcome without value", body: []string{"on_unknown_outcome"}, line: 3, want: []string{"wrong argument count", "'on_unknown_outcome'"}},
		{name: "bad canonical_json", body: []string{"fingerprint {", "\tcanonical_json yes", "}"}, line: 4, want: []string{"canonical_json", "true", "false", "'yes'"}},

		// Storage backends.
		{name: "unknown storage backend", body: []string{"storage nosuch"}, line: 3, want: []string{"unknown storage backend 'nosuch'", "available: memory"}},
		{name: "unknown storage backend with block", body: []string{"storage nosuch {", "\tfoo bar", "}"}, line: 3, want: []string{"nosuch"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			input := tt.input
			if input == "" {
				input = block(tt.body...)
			}
			_, err := parse(input)
			wantParseError(t, err, tt.line, tt.want...)
		})
	}
}

func TestCaddyfileRejectsEmptyValues(t *testing.T) {
	for _, opt := range []string{`scope ""`, `header ""`, `replay_header ""`, `docs_url ""`} {
		d := caddyfile.NewTestDispenser("idempotency {\n" + opt + "\n}")
		err := new(idempotency.Handler).UnmarshalCaddyfile(d)
		if err == nil || !strings.Contains(err.Error(), strings.Fields(opt)[0]+" must not be empty") {
			t.Errorf("%s: err %v, want a 'must not be empty' error", opt, err)
		}
	}
}

// TestCaddyfileOptionListsMatchTheParsers: the lists of options that an
// unknown option's error suggests from are the options each parser's
// switch knows, no more and no fewer (read from the source).
func TestCaddyfileOptionListsMatchTheParsers(t *testing.T) {
	for _, tc := range []struct{ file, fn, list string }{
		{"caddyfile.go", "parseOption", "handlerOptions"},
		{"caddyfile.go", "parseFingerprint", "fingerprintOptions"},
		{"caddyfile.go", "parseGlobalOption", "globalOptionNames"},
		{"backend/memory/memory.go", "UnmarshalCaddyfile", "options"},
		{"backend/redis/redis.go", "UnmarshalCaddyfile", "options"},
		{"backend/postgres/postgres.go", "UnmarshalCaddyfile", "options"},
	} {
		f, err := parser.ParseFile(token.NewFileSet(), tc.file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		var cases, listed []string
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				if n.Name.Name == tc.fn {
					ast.Inspect(n.Body, func(n ast.Node) bool {
						if cc, ok := n.(*ast.CaseClause); ok {
							cases = append(cases, stringLits(cc.List)...)
						}
						return true
					})
				}
				return false
			case *ast.ValueSpec:
				if len(n.Names) == 1 && n.Names[0].Name == tc.list && len(n.Values) == 1 {
					if cl, ok := n.Values[0].(*ast.CompositeLit); ok {
						listed = stringLits(cl.Elts)
					}
				}
			}
			return true
		})
		slices.Sort(cases)
		slices.Sort(listed)
		if len(cases) == 0 || !slices.Equal(cases, listed) {
			t.Errorf("%s: %s's options %q, %s lists %q", tc.file, tc.fn, cases, tc.list, listed)
		}
	}
}

func stringLits(exprs []ast.Expr) []string {
	var out []string
	for _, e := range exprs {
		if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
			s, _ := strconv.Unquote(lit.Value)
			out = append(out, s)
		}
	}
	return out
}

// TestCaddyfileUnknownOptionsSuggestTheNearest: an unknown option, a
// storage backend or an enumeration value a typo away from a known one
// gets "did you mean", at its line; one far from any gets none.
func TestCaddyfileUnknownOptionsSuggestTheNearest(t *testing.T) {
	for _, tc := range []struct {
		name string
		body []string
		line int
		want string // "" for no suggestion
	}{
		{"ttl", []string{"tll 1h"}, 3, "did you mean 'ttl'?)"},
		{"lock_timeout", []string{"ttl 1h", "lock_timout 5s"}, 4, "did you mean 'lock_timeout'?)"},
		{"swapped letters", []string{"requierd"}, 3, "did you mean 'required'?)"},
		{"a dash for an underscore", []string{"in-flight wait"}, 3, "did you mean 'in_flight'?)"},
		{"case", []string{"TTL 1h"}, 3, "did you mean 'ttl'?)"},
		{"fingerprint", []string{"fingerprint {", "\theader Content-Type", "}"}, 4, "unrecognized fingerprint option 'header' (did you mean 'headers'?)"},
		{"memory", []string{"storage memory {", "\tmax_key 10", "}"}, 4, "unrecognized memory storage option 'max_key' (did you mean 'max_keys'?)"},
		{"redis", []string{"storage redis {", "\tkey_prefx a:", "}"}, 4, "unrecognized redis storage option 'key_prefx' (did you mean 'key_prefix'?)"},
		{"postgres", []string{"storage postgres {", "\tdsn x", "\tcleanup_intreval 5m", "}"}, 5, "unrecognized postgres storage option 'cleanup_intreval' (did you mean 'cleanup_interval'?)"},
		{"backend", []string{"storage reddis"}, 3, "unknown storage backend 'reddis' (did you mean 'redis'?)"},
		{"value", []string{"on_storage_error fail_opne"}, 3, "did you mean 'fail_open'?)"},
		{"far from any", []string{"colour red"}, 3, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(block(tc.body...))
			wantParseError(t, err, tc.line)
			if tc.want == "" {
				if strings.Contains(err.Error(), "did you mean") {
					t.Errorf("error %q suggests an option", err)
				}
			} else if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
	// The global block.
	_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte("{\n\tidempotency {\n\t\tstrikt\n\t}\n}\n\n:80 {\n\trespond 200\n}\n"), nil)
	if err == nil || !strings.Contains(err.Error(), "did you mean 'strict'?") || !strings.Contains(err.Error(), "Caddyfile:3") {
		t.Errorf("global option strikt: %v, want did you mean 'strict'", err)
	}
}

// TestCaddyfileDurationWithoutAUnitShowsAnExample: ttl 30 (seconds
// meant, Go's durations need a unit) is an error at its line that shows
// 30s, for every duration option.
func TestCaddyfileDurationWithoutAUnitShowsAnExample(t *testing.T) {
	for _, tc := range []struct {
		body []string
		line int
		want string
	}{
		{[]string{"ttl 30"}, 3, "ttl: invalid duration '30': a duration needs a unit, such as 30s"},
		{[]string{"lock_timeout 10"}, 3, "lock_timeout: invalid duration '10': a duration needs a unit, such as 10s"},
		{[]string{"wait_timeout 2.5"}, 3, "such as 2.5s"},
		{[]string{"in_flight wait 5"}, 3, "in_flight wait: invalid duration '5': a duration needs a unit, such as 5s"},
		{[]string{"storage redis {", "\ttimeout 2", "}"}, 4, "timeout: invalid duration '2': a duration needs a unit, such as 2s"},
		{[]string{"storage postgres {", "\tdsn x", "\tcleanup_interval 300", "}"}, 5, "such as 300s"},
		{[]string{"storage redis {", "\treplay_cache 1000 60", "}"}, 4, "replay_cache ttl: invalid duration '60': a duration needs a unit, such as 60s"},
		{[]string{"ttl soon"}, 3, "such as 30s, 5m, 24h or 2d"},
	} {
		_, err := parse(block(tc.body...))
		wantParseError(t, err, tc.line, tc.want)
	}
}
