//go:build unix

package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	srv "github.com/caddy-idempotency/caddy-idempotency/internal/testkit/servers"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

func TestServersNamedInTheEnvironmentAreNotStarted(t *testing.T) {
	tests := []struct {
		env                     map[string]string
		wantRedis, wantPostgres bool
	}{
		{env: nil, wantRedis: true, wantPostgres: true},
		{env: map[string]string{envRedisURL: "redis://r:6379/0"}, wantPostgres: true},
		{env: map[string]string{envRedisAddr: "r:6379"}, wantPostgres: true},
		{env: map[string]string{envPostgresDSN: "postgres://p/test"}, wantRedis: true},
		{env: map[string]string{envRedisURL: "redis://r", envPostgresDSN: "postgres://p/test"}},
	}
	for _, tt := range tests {
		redis, postgres := wanted(func(name string) string { return tt.env[name] })
		if redis != tt.wantRedis || postgres != tt.wantPostgres {
			t.Errorf("%v: starts redis %v, postgres %v; want %v, %v", tt.env, redis, postgres, tt.wantRedis, tt.wantPostgres)
		}
	}
}

// noServers names servers in the environment, so that run starts none.
func noServers(t *testing.T) {
	t.Setenv(envRedisURL, "redis://127.0.0.1:1/0")
	t.Setenv(envPostgresDSN, "postgres://postgres@127.0.0.1:1/test")
}

func TestRunExitsWithTheCommandsStatus(t *testing.T) {
	noServers(t)
	for cmd, want := range map[string]int{
		"exit 0":        0,
		"exit 3":        3,
		"kill -TERM $$": 128 + 15,
	} {
		if got := run([]string{"--", "sh", "-c", cmd}); got != want {
			t.Errorf("%s: status %d, want %d", cmd, got, want)
		}
	}
	if got := run([]string{"/nonexistent/command"}); got != 127 {
		t.Errorf("a command that cannot start: status %d, want 127", got)
	}
}

func TestRunStartsPrivateServersAndLeavesNothingBehind(t *testing.T) {
	for _, name := range []string{envRedisURL, envRedisAddr, envPostgresDSN} {
		t.Setenv(name, "")
	}
	if _, missing := srv.Look(true, true); len(missing) > 0 {
		testutil.Unavailable(t, "not installed: %s", srv.MissingPrograms(missing))
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
	out := filepath.Join(tmp, "env")

	if code := run([]string{"sh", "-c", `env | grep ^IDEMPOTENCY_ > "$0"`, out}); code != 0 {
		t.Fatalf("status %d", code)
	}

	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		k, v, _ := strings.Cut(line, "=")
		env[k] = v
	}
	addr := env[envRedisAddr]
	if !strings.HasPrefix(addr, "127.0.0.1:") || env[envRedisURL] != "redis://"+addr+"/0" {
		t.Errorf("the command saw %s=%q, %s=%q", envRedisURL, env[envRedisURL], envRedisAddr, addr)
	}
	dsn := env[envPostgresDSN]
	if !strings.HasPrefix(dsn, "postgres://postgres@127.0.0.1:") || !strings.HasSuffix(dsn, "/test?sslmode=disable") {
		t.Errorf("the command saw %s=%q", envPostgresDSN, dsn)
	}
	// Gone: the servers and their directory.
	if err := srv.PingRedis(addr); err == nil {
		t.Errorf("redis-server on %s still answers", addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(ctx, dsn); err == nil {
		conn.Close(ctx)
		t.Errorf("postgres at %s still answers", dsn)
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, dirPrefix+"*")); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}
