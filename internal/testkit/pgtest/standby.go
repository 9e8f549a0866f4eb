//go:build unix

package pgtest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/servers"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// Replicated starts a private PostgreSQL primary with a streaming
// standby (internal/servers), in a temporary directory of the test's own,
// for failover tests: never the shared test server, which other tests
// use. Both are stopped and their files removed when the test ends. The
// servers' programs missing skip the test (fail it under CI=true).
func Replicated(t testing.TB) (set *servers.Set, primary, standby *servers.Postgres) {
	t.Helper()
	bins, missing := servers.Look(false, true)
	if len(missing) > 0 {
		testutil.Unavailable(t, "not installed: %s", servers.MissingPrograms(missing))
	}
	as, err := servers.ServerAccount()
	if err != nil {
		t.Fatal(err)
	}
	// Under root PostgreSQL runs as another user, who must reach the
	// directory.
	tmp := t.TempDir()
	for _, d := range []string{tmp, filepath.Dir(tmp)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("TMPDIR", tmp)
	set, err = servers.NewSet("pgtest-replicated-", t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := set.Close(); err != nil {
			t.Error(err)
		}
	})
	if primary, err = set.StartPostgres(bins, as); err != nil {
		t.Fatal(err)
	}
	if standby, err = set.StartStandby(primary, ""); err != nil {
		t.Fatal(err)
	}
	return set, primary, standby
}
