// Command getpromtool puts a promtool at the path it is given, for make
// test's unit tests of the Prometheus rules (contrib/prometheus), and
// says where it comes from:
//
//	getpromtool bin/promtool
//
// It links the promtool on PATH; without one, it downloads Debian's
// prometheus package with apt-get download (nothing is installed; as root,
// after apt-get update when the package lists are missing) and unpacks
// promtool from it (internal/testkit/promtool). A promtool left there by an
// earlier run is used again. When none can be had, it says why and exits
// 0, leaving the path absent: the rules' test then skips locally and
// fails in CI, as tests without their servers do.
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/promtool"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: getpromtool <path>")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		logf("%v", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "getpromtool: "+format+"\n", args...)
}

func run(dst string) error {
	if _, err := os.Stat(dst); err == nil {
		logf("using %s, from an earlier run (remove it to look again)", dst)
		return nil
	}
	dir, err := filepath.Abs(filepath.Dir(dst))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	fetch, err := os.MkdirTemp(dir, "promtool-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(fetch)
	p, err := promtool.Find(fetch, logf)
	if errors.Is(err, promtool.ErrUnavailable) {
		logf("%v\nthe Prometheus rules' unit tests (contrib/prometheus) will be skipped (they fail under CI=true)", err)
		return nil
	}
	if err != nil {
		return err
	}
	if filepath.Dir(p) == filepath.Join(fetch, "root", "usr", "bin") {
		// Unpacked into fetch, which goes: keep the program.
		if err := os.Rename(p, dst); err != nil {
			return err
		}
		logf("promtool from Debian's prometheus package: %s", dst)
		return nil
	}
	logf("promtool: %s", p)
	return os.Symlink(p, dst)
}
