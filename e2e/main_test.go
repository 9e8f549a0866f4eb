package e2e

import (
	"fmt"
	"os"
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// caddyBin is the Caddy binary built from this checkout for the run.
var caddyBin string

// TestMain builds Caddy once for every test. A failed build fails the
// package: an end-to-end suite that skips when the product does not build
// proves nothing. A name looked up by a test fails it too
// (testutil.RunWithoutLookups).
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "caddy-idempotency-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	caddyBin, err = caddyproc.Build(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: building Caddy:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := testutil.RunWithoutLookups(m)
	os.RemoveAll(dir)
	os.Exit(code)
}
