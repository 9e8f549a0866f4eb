// Package caddyproc runs real Caddy processes built from this checkout, a
// counting upstream, and a TCP proxy that can cut a store's connections,
// for the end-to-end tests (e2e/) and the load benchmark (bench/). It is
// not part of the module's API.
package caddyproc

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// EnvBinary names a Caddy binary built from this checkout (e.g. by
// `make build` with xcaddy) to use instead of building one.
const EnvBinary = "IDEMPOTENCY_CADDY_BIN"

// Build compiles cmd/caddy (Caddy's standard modules plus this module) from
// the checkout into dir and returns the binary's path; or, when EnvBinary
// names an existing file, returns that.
func Build(dir string) (string, error) {
	if bin := os.Getenv(EnvBinary); bin != "" {
		if _, err := os.Stat(bin); err != nil {
			return "", fmt.Errorf("%s: %w", EnvBinary, err)
		}
		return bin, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "caddy")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/caddy")
	cmd.Dir = root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build ./cmd/caddy: %v\n%s", err, out.String())
	}
	return bin, nil
}

// moduleRoot is the directory holding this module's go.mod.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == "/dev/null" {
		return "", fmt.Errorf("not inside the module")
	}
	return filepath.Dir(gomod), nil
}

// FreePort returns a TCP port on loopback that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
