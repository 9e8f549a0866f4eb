// Package promtool finds promtool, Prometheus's rule checker, for the unit
// tests of the rules in contrib/prometheus: the one IDEMPOTENCY_PROMTOOL
// names, the one on PATH, or else the one in Debian's prometheus package,
// downloaded (apt-get download, which installs nothing) and unpacked into
// a directory of the caller's. Each step that fetches something says so
// through logf first.
package promtool

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Env names a promtool to use, as make test sets it (internal/testkit/cmd/getpromtool).
const Env = "IDEMPOTENCY_PROMTOOL"

// ErrUnavailable wraps the reasons promtool cannot be had on this machine
// (no apt-get, no network): a test is then skipped locally and fails in CI.
var ErrUnavailable = errors.New("promtool is unavailable")

// Find returns the path of a promtool: Env's, PATH's, or Debian's, unpacked
// into dir.
func Find(dir string, logf func(format string, args ...any)) (string, error) {
	if p := os.Getenv(Env); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%w: %s=%s: %v", ErrUnavailable, Env, p, err)
		}
		return p, nil
	}
	if p, err := exec.LookPath("promtool"); err == nil {
		return p, nil
	}
	return FromDebian(dir, logf)
}

// FromDebian downloads Debian's prometheus package with apt-get download
// (into dir; nothing is installed, no service set up) and unpacks promtool
// from it into dir/root, whose path it returns. Running as root, when the
// download fails for want of package lists (a fresh container), it runs
// apt-get update first, which refreshes the system's package lists, and
// says so.
func FromDebian(dir string, logf func(format string, args ...any)) (string, error) {
	for _, tool := range []string{"apt-get", "dpkg-deb"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", fmt.Errorf("%w: it is not on PATH, and there is no %s to take it from Debian's prometheus package", ErrUnavailable, tool)
		}
	}
	logf("promtool is not on PATH: downloading Debian's prometheus package with `apt-get download prometheus` into %s, to unpack promtool from it (nothing is installed)", dir)
	download := func() ([]byte, error) {
		cmd := exec.Command("apt-get", "download", "-qq", "prometheus")
		cmd.Dir = dir
		return cmd.CombinedOutput()
	}
	out, err := download()
	if err != nil && os.Geteuid() == 0 {
		logf("apt-get download failed (%v); running `apt-get update` first, as this runs as root (it refreshes the system's package lists)", err)
		if upd, uerr := exec.Command("apt-get", "update", "-qq").CombinedOutput(); uerr != nil {
			return "", fmt.Errorf("%w: apt-get update: %v\n%s", ErrUnavailable, uerr, upd)
		}
		out, err = download()
	}
	if err != nil {
		return "", fmt.Errorf("%w: apt-get download prometheus: %v\n%s", ErrUnavailable, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(dir, "prometheus_*.deb"))
	if len(debs) != 1 {
		return "", fmt.Errorf("apt-get download prometheus left %v", debs)
	}
	root := filepath.Join(dir, "root")
	if out, err := exec.Command("dpkg-deb", "-x", debs[0], root).CombinedOutput(); err != nil {
		return "", fmt.Errorf("dpkg-deb -x %s: %v\n%s", debs[0], err, out)
	}
	p := filepath.Join(root, "usr", "bin", "promtool")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("no promtool in the prometheus package of Debian: %v", err)
	}
	logf("unpacked %s", p)
	return p, nil
}
