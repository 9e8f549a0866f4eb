package idempotency

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// runCommand runs cmd with args and returns what it printed.
var runCommand = testutil.RunCommand

// TestHashCommandGivesTheHashesTheHandlerLogs: `caddy idempotency hash`
// with a key and a client's host and Authorization prints the key_hash
// the handler put on that client's request.
func TestHashCommandGivesTheHashesTheHandlerLogs(t *testing.T) {
	h := isolated(t, &Handler{})
	r := request("order-77", "{}")
	r.Header.Set("Authorization", "Bearer alice")
	_, repl := servePlaceholders(h, &upstream{}, r)
	logged, _ := repl.GetString(placeholderKeyHash)

	out, err := runCommand(t, hashCommand(), "--key", "order-77", "--scope", "example.com", "--scope", "Bearer alice")
	if err != nil {
		t.Fatal(err)
	}
	if logged == "" || !strings.Contains(out, "key_hash "+logged+"\n") {
		t.Fatalf("hash printed %q, want key_hash %s as the handler has it", out, logged)
	}
	// The scope hash it printed names the same key.
	var scopeHash string
	fmt.Sscanf(out, "scope_hash %s", &scopeHash)
	if out2, err := runCommand(t, hashCommand(), "--key", "order-77", "--scope-hash", scopeHash); err != nil || out2 != out {
		t.Fatalf("with --scope-hash: %q %v, want %q", out2, err, out)
	}

	for _, args := range [][]string{
		{"--scope", "example.com"},               // no key
		{"--key", "k"},                           // no scope
		{"--key", "k", "--scope-hash", "00"},     // a short scope hash
		{"--key", "k", "--scope", "example.com"}, // one value of the default template without a space
		{"--key", "k", "--scope", "a b", "--scope-hash", strings.Repeat("0", 64)}, // both
	} {
		if out, err := runCommand(t, hashCommand(), args...); err == nil {
			t.Errorf("hash %q: %q, want an error", args, out)
		} else if strings.Contains(err.Error(), "query parameter") {
			t.Errorf("hash %q: %v: the error speaks of the admin API, not of flags", args, err)
		}
	}
}

// TestRecordCommandsRefuseKeyHashWithAScope: --key-hash names the record
// alone; a scope beside it is refused, as the admin API refuses it,
// rather than dropped without a word.
func TestRecordCommandsRefuseKeyHashWithAScope(t *testing.T) {
	kh := strings.Repeat("0", 16)
	for _, extra := range [][]string{
		{"--key", "k"},
		{"--scope", "example.com"},
		{"--scope-template", "{http.request.host}"},
		{"--scope-hash", strings.Repeat("0", 64)},
	} {
		for _, verb := range []string{"get", "delete", "release"} {
			// An address nothing listens on: the command must fail before
			// it asks.
			args := append([]string{"--key-hash", kh, "--address", "127.0.0.1:1"}, extra...)
			cmd := releaseCommand()
			if verb != "release" {
				cmd = recordCommand(verb)
			}
			out, err := runCommand(t, cmd, args...)
			if err == nil || !strings.Contains(err.Error(), "--key-hash alone") {
				t.Errorf("%s %q: %q %v, want --key-hash refused with %s", verb, args, out, err, extra[0])
			}
		}
	}
}

// TestHashCommandWarnsOfAHostWithAPort: {http.request.host}, the first
// value of the default template, is the host without its port, so a
// --scope of localhost:8080 there names no client: hash says so (on
// stderr, the hashes still printed), and says nothing of a host without
// port, nor of a value with a colon that another placeholder takes.
func TestHashCommandWarnsOfAHostWithAPort(t *testing.T) {
	for _, tc := range []struct {
		args []string
		warn bool
	}{
		{[]string{"--scope", "localhost:8080", "--scope", ""}, true},
		{[]string{"--scope", "[::1]:8443", "--scope", "Bearer a"}, true},
		{[]string{"--scope", "api.example.com:443 Bearer a"}, true}, // host and Authorization in one
		{[]string{"--scope", "localhost", "--scope", ""}, false},
		{[]string{"--scope", "localhost", "--scope", "Basic YTpi:c"}, false},
		{[]string{"--scope-template", "{http.request.header.X-Tenant} {http.request.host}", "--scope", "a:1", "--scope", "example.com:80"}, true},
		{[]string{"--scope-template", "{http.request.header.X-Tenant}", "--scope", "acme:1"}, false},
	} {
		var stdout, stderr bytes.Buffer
		cmd := hashCommand()
		cmd.SetOut(&stdout)
		cmd.SetErr(&stderr)
		cmd.SetArgs(append([]string{"--key", "k"}, tc.args...))
		if err := cmd.Execute(); err != nil {
			t.Fatalf("hash %q: %v", tc.args, err)
		}
		if !strings.Contains(stdout.String(), "key_hash ") {
			t.Errorf("hash %q printed %q, want the hashes", tc.args, stdout.String())
		}
		warned := strings.Contains(stderr.String(), "looks like host:port")
		if warned != tc.warn {
			t.Errorf("hash %q: stderr %q; want a host:port warning: %v", tc.args, stderr.String(), tc.warn)
		}
	}
}

// TestTheCommandHasTheBackendsSubcommands: `caddy idempotency` has its
// own subcommands and those the backends registered (storage postgres:
// schema), without the host importing a backend's store for them.
func TestTheCommandHasTheBackendsSubcommands(t *testing.T) {
	c, ok := caddycmd.Commands()["idempotency"]
	if !ok {
		t.Fatal("no idempotency command")
	}
	root := &cobra.Command{Use: "idempotency"}
	c.CobraFunc(root)
	var names []string
	for _, sub := range root.Commands() {
		names = append(names, sub.Name())
	}
	for _, want := range []string{"hash", "schema", "get", "delete", "list", "release"} {
		if !slices.Contains(names, want) {
			t.Errorf("subcommands %v lack %s", names, want)
		}
	}
}
