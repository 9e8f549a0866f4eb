package placement

import (
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }
