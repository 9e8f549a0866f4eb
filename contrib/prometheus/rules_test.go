package prometheus_test

import (
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/promtool"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// TestRulesPassPromtool checks the rules and runs their unit tests with
// promtool: the one IDEMPOTENCY_PROMTOOL names (make test fetches it
// first, saying how: internal/testkit/cmd/getpromtool), the one on PATH, or else
// Debian's, taken out of its prometheus package into the test's own
// directory (downloaded, never installed: no server is set up, nothing of
// the system's changes but, as root, its package lists).
func TestRulesPassPromtool(t *testing.T) {
	p, err := promtool.Find(t.TempDir(), t.Logf)
	if errors.Is(err, promtool.ErrUnavailable) {
		testutil.Unavailable(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"check", "rules", "idempotency.rules.yml"},
		{"test", "rules", "idempotency.rules.test.yml"},
	} {
		out, err := exec.Command(p, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		if !strings.Contains(string(out), "SUCCESS") {
			t.Fatalf("promtool %s said no SUCCESS:\n%s", strings.Join(args, " "), out)
		}
	}
}
