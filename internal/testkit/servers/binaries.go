//go:build unix

package servers

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Binaries are the server programs a Set runs.
type Binaries struct {
	Redis    string // redis-server
	Initdb   string
	Postgres string // from initdb's directory: the two must match
}

// debianPostgresBins is where Debian's postgresql-<version> packages put
// the server programs; they are not on PATH there.
const debianPostgresBins = "/usr/lib/postgresql/*/bin/initdb"

// Find looks the servers wanted up, and installs missing ones with apt-get
// when running as root (CI, a container), logging what it does. As anyone
// else it stops and says what to run: a test command does not install
// software behind a contributor's back.
func Find(redis, postgres bool, logf func(format string, args ...any)) (Binaries, error) {
	b, missing := Look(redis, postgres)
	if len(missing) == 0 {
		return b, nil
	}
	pkgs := strings.Join(missing, " ")
	what := MissingPrograms(missing)
	if os.Geteuid() != 0 {
		return b, fmt.Errorf("not found: %s. Install with\n\n\tsudo apt-get install %s", what, pkgs)
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return b, fmt.Errorf("not found: %s, and there is no apt-get to install them with", what)
	}
	if logf == nil {
		logf = func(string, ...any) {}
	}
	logf("not found: %s; installing the Debian package(s) %s with apt-get, as this runs as root (the run starts instances of its own; the packages' system services are left as they are)", what, pkgs)
	if err := install(missing, logf, runAptGet); err != nil {
		return b, err
	}
	if b, missing = Look(redis, postgres); len(missing) > 0 {
		return b, fmt.Errorf("installed %s, but still not found: %s", pkgs, MissingPrograms(missing))
	}
	return b, nil
}

// install installs the Debian packages pkgs with run (apt-get), each
// command named in the log before it runs.
func install(pkgs []string, logf func(format string, args ...any), run func(args ...string) error) error {
	for _, args := range [][]string{{"update", "-qq"}, append([]string{"install", "-y", "-qq", "--no-install-recommends"}, pkgs...)} {
		logf("running: apt-get %s", strings.Join(args, " "))
		if err := run(args...); err != nil {
			return fmt.Errorf("apt-get %s: %w", strings.Join(args, " "), err)
		}
	}
	return nil
}

// runAptGet runs apt-get with args, non-interactively, its output on
// stderr.
func runAptGet(args ...string) error {
	cmd := exec.Command("apt-get", args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return cmd.Run()
}

// MissingPrograms names the programs of the Debian packages pkgs.
func MissingPrograms(pkgs []string) string {
	var names []string
	for _, p := range pkgs {
		switch p {
		case "postgresql":
			names = append(names, "PostgreSQL's initdb and postgres (looked for on PATH and in "+filepath.Dir(debianPostgresBins)+")")
		default:
			names = append(names, p)
		}
	}
	return strings.Join(names, ", ")
}

// Look finds the servers wanted and names the Debian packages of those it
// cannot find.
func Look(redis, postgres bool) (b Binaries, missing []string) {
	if redis {
		if p, err := exec.LookPath("redis-server"); err == nil {
			b.Redis = p
		} else {
			missing = append(missing, "redis-server")
		}
	}
	if postgres {
		found := false
		for _, initdb := range postgresCandidates() {
			if b.Initdb, b.Postgres, found = postgresPair(initdb); found {
				break
			}
		}
		if !found {
			missing = append(missing, "postgresql")
		}
	}
	return b, missing
}

// postgresCandidates lists initdb programs to try: the one on PATH, then
// Debian's, newest version first.
func postgresCandidates() []string {
	var c []string
	if p, err := exec.LookPath("initdb"); err == nil {
		c = append(c, p)
	}
	debian, _ := filepath.Glob(debianPostgresBins)
	slices.SortFunc(debian, func(a, b string) int { return pgVersion(b) - pgVersion(a) })
	return append(c, debian...)
}

// pgVersion is the major version in /usr/lib/postgresql/<version>/bin/initdb,
// 0 when there is none.
func pgVersion(initdb string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdb))))
	return v
}

// postgresPair resolves initdb (often a symlink on PATH) and finds the
// postgres program beside it.
func postgresPair(initdb string) (string, string, bool) {
	real, err := filepath.EvalSymlinks(initdb)
	if err != nil {
		return "", "", false
	}
	postgres := filepath.Join(filepath.Dir(real), "postgres")
	if fi, err := os.Stat(postgres); err != nil || fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return "", "", false
	}
	return real, postgres, true
}
