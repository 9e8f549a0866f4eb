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
	return ReplicatedVia(t, nil)
}

// ReplicatedVia is Replicated with the standby streaming from the address
// via returns for the primary's (a proxy in front of it, which the test
// can cut); nil: the primary's own.
func ReplicatedVia(t testing.TB, via func(primary string) string) (set *servers.Set, primary, standby *servers.Postgres) {
	t.Helper()
	set, primary = Private(t)
	link := ""
	if via != nil {
		link = via(primary.Addr)
	}
	standby, err := set.StartStandby(primary, link)
	if err != nil {
		t.Fatal(err)
	}
	return set, primary, standby
}

// Private starts a private PostgreSQL server as Replicated does, without
// a standby: for a test that stops, kills or restarts it.
func Private(t testing.TB) (set *servers.Set, primary *servers.Postgres) {
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
	set, err = servers.NewSet("pgtest-private-", t.Logf)
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
	return set, primary
}
