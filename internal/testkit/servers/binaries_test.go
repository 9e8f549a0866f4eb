//go:build unix

package servers

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

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

// TestInstallSaysEachCommandBeforeItRuns: what testservers installs as
// root is in its output before it happens, command by command.
func TestInstallSaysEachCommandBeforeItRuns(t *testing.T) {
	var events []string
	logf := func(format string, args ...any) { events = append(events, "log: "+fmt.Sprintf(format, args...)) }
	run := func(args ...string) error { events = append(events, "run: "+strings.Join(args, " ")); return nil }
	if err := install([]string{"redis-server", "postgresql"}, logf, run); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"log: running: apt-get update -qq",
		"run: update -qq",
		"log: running: apt-get install -y -qq --no-install-recommends redis-server postgresql",
		"run: install -y -qq --no-install-recommends redis-server postgresql",
	}
	if !slices.Equal(events, want) {
		t.Fatalf("install did %q, want %q", events, want)
	}
}
