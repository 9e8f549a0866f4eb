package opterr

import (
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// TestMain fails the package when a test looks up a name other than
// localhost (testutil.Main).
func TestMain(m *testing.M) { testutil.Main(m) }
