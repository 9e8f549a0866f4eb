package testutil

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"
)

// A test never touches the user's own files. Caddy keeps its autosaved
// config, certificates and instance id under the user's config and data
// directories, which derive from HOME and XDG_*, and both Caddy in this
// process (caddy.Load) and the caddy processes the tests start would
// write there. isolateHome points them, for this process and every
// process it starts, at a temporary directory of its own; the go
// command's own directories, which derive from HOME too, are pinned
// where they were first, so that the builds tests run (the e2e binary,
// the planted bugs) keep the user's module cache, build cache and
// settings.
//
// The go command's telemetry is off in that home: the go commands the
// tests run would otherwise count into its config directory and start a
// detached sidecar that outlives the tests and writes there after the
// home is removed (a fresh-clone CI run found the home made again, with
// go/telemetry in it, in its temporary directory).
//
// It returns a function that removes the directory. A test process
// started by another (a fuzz worker: its coordinator starts it, and kills
// it when the budget is spent, before any cleanup could run) inherits the
// home of the process that made it (homeEnv), which removes it.
func isolateHome() (cleanup func(), err error) {
	if err := pinGoDirs(); err != nil {
		return nil, err
	}
	if home := os.Getenv(homeEnv); home != "" && os.Getenv("HOME") == home {
		setCaddyDirs()
		return func() {}, nil
	}
	home, err := os.MkdirTemp("", "idempotency-test-home-")
	if err != nil {
		return nil, err
	}
	for name, dir := range map[string]string{
		homeEnv:           home,
		"HOME":            home,
		"XDG_CONFIG_HOME": filepath.Join(home, ".config"),
		"XDG_DATA_HOME":   filepath.Join(home, ".local", "share"),
		"XDG_CACHE_HOME":  filepath.Join(home, ".cache"),
		"XDG_STATE_HOME":  filepath.Join(home, ".local", "state"),
	} {
		if err := os.Setenv(name, dir); err != nil {
			return nil, err
		}
	}
	setCaddyDirs()
	cleanup = func() { _ = os.RemoveAll(home) }
	if err := writeTelemetryOff(); err != nil {
		cleanup()
		return nil, err
	}
	return cleanup, nil
}

// writeTelemetryOff writes the go command's telemetry mode file, in the
// config directory as it is now, as "go telemetry off" would.
func writeTelemetryOff() error {
	config, err := os.UserConfigDir()
	if err != nil {
		return err
	}
	dir := filepath.Join(config, "go", "telemetry")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "mode"), []byte("off"), 0o600)
}

// homeEnv names the home a test process made for itself and the
// processes it starts.
const homeEnv = "IDEMPOTENCY_TEST_HOME"

// setCaddyDirs points Caddy at the directories of HOME and XDG_* as they
// are now: it read them when its package was initialised, before any
// TestMain could run.
func setCaddyDirs() {
	caddy.ConfigAutosavePath = filepath.Join(caddy.AppConfigDir(), "autosave.json")
	caddy.DefaultStorage = &certmagic.FileStorage{Path: caddy.AppDataDir()}
}

// pinGoDirs sets GOPATH, GOMODCACHE, GOCACHE and GOENV to what the go
// command makes of the environment now (a go.env file's settings
// included), when it is on PATH, or else to its defaults.
func pinGoDirs() error {
	names := []string{"GOPATH", "GOMODCACHE", "GOCACHE", "GOENV"}
	values := map[string]string{}
	if gobin, err := exec.LookPath("go"); err == nil {
		out, err := exec.Command(gobin, append([]string{"env", "-json"}, names...)...).Output()
		if err != nil {
			return fmt.Errorf("go env: %w", err)
		}
		if err := json.Unmarshal(out, &values); err != nil {
			return fmt.Errorf("go env: %w", err)
		}
	} else {
		home, _ := os.UserHomeDir()
		config, _ := os.UserConfigDir()
		cache, _ := os.UserCacheDir()
		values["GOPATH"] = filepath.Join(home, "go")
		values["GOMODCACHE"] = filepath.Join(home, "go", "pkg", "mod")
		values["GOCACHE"] = filepath.Join(cache, "go-build")
		values["GOENV"] = filepath.Join(config, "go", "env")
	}
	for _, name := range names {
		if os.Getenv(name) != "" || values[name] == "" {
			continue
		}
		if err := os.Setenv(name, values[name]); err != nil {
			return err
		}
	}
	return nil
}
