//go:build unix

package servers

import "testing"

func TestDebianPostgresVersions(t *testing.T) {
	for path, want := range map[string]int{
		"/usr/lib/postgresql/15/bin/initdb": 15,
		"/usr/lib/postgresql/9/bin/initdb":  9,
		"/usr/local/bin/initdb":             0,
	} {
		if got := pgVersion(path); got != want {
			t.Errorf("pgVersion(%s) = %d, want %d", path, got, want)
		}
	}
}
