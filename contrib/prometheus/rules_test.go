package prometheus_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testutil"
)

// TestRulesPassPromtool checks the rules and runs their unit tests with
// promtool: Debian's, from PATH, or else taken out of Debian's prometheus
// package into the test's own directory (downloaded, never installed: no
// server is set up, nothing of the system's changes).
func TestRulesPassPromtool(t *testing.T) {
	promtool := findPromtool(t)
	for _, args := range [][]string{
		{"check", "rules", "idempotency.rules.yml"},
		{"test", "rules", "idempotency.rules.test.yml"},
	} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		if !strings.Contains(string(out), "SUCCESS") {
			t.Fatalf("promtool %s said no SUCCESS:\n%s", strings.Join(args, " "), out)
		}
	}
}

// findPromtool returns promtool from PATH, or from Debian's prometheus
// package unpacked into a temporary directory.
func findPromtool(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	for _, tool := range []string{"apt-get", "dpkg-deb"} {
		if _, err := exec.LookPath(tool); err != nil {
			testutil.Unavailable(t, "promtool is not on PATH, and there is no %s to take it from Debian's prometheus package", tool)
		}
	}
	dir := t.TempDir()
	download := func() ([]byte, error) {
		cmd := exec.Command("apt-get", "download", "-qq", "prometheus")
		cmd.Dir = dir
		return cmd.CombinedOutput()
	}
	out, err := download()
	if err != nil && os.Geteuid() == 0 {
		// Package lists missing (a fresh container): fetch them, as the
		// test servers' packages are (internal/servers).
		if upd, uerr := exec.Command("apt-get", "update", "-qq").CombinedOutput(); uerr != nil {
			testutil.Unavailable(t, "apt-get update: %v\n%s", uerr, upd)
		}
		out, err = download()
	}
	if err != nil {
		testutil.Unavailable(t, "apt-get download prometheus (for promtool): %v\n%s", err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(dir, "prometheus_*.deb"))
	if len(debs) != 1 {
		t.Fatalf("apt-get download prometheus left %v", debs)
	}
	root := filepath.Join(dir, "root")
	if out, err := exec.Command("dpkg-deb", "-x", debs[0], root).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -x %s: %v\n%s", debs[0], err, out)
	}
	p := filepath.Join(root, "usr", "bin", "promtool")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("Debian's prometheus package holds no promtool: %v", err)
	}
	return p
}
