package backendtest

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
)

// ParseStorage parses input, a `storage <name> [...] [{ ... }]` block
// whose first line is line 1 of "Testfile", as the idempotency directive
// parses its storage option (backend.ParseCaddyfile): a backend's
// Caddyfile tests so cover what users get without the root.
func ParseStorage(input string) (json.RawMessage, error) {
	d := caddyfile.NewTestDispenser(input)
	d.Next() // "storage"
	return backend.ParseCaddyfile(d)
}

// WantParseError fails t unless err is a Caddyfile error at
// Testfile:line whose message mentions every one of want.
func WantParseError(t testing.TB, err error, line int, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one at Testfile:%d mentioning %q", line, want)
	}
	msg := err.Error()
	// Testfile:<line> not followed by another digit.
	if !regexp.MustCompile(fmt.Sprintf(`\bTestfile:%d\b`, line)).MatchString(msg) {
		t.Errorf("error %q does not point at Testfile:%d", msg, line)
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("error %q does not mention %q", msg, w)
		}
	}
}
