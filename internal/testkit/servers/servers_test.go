//go:build unix

package servers

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// newSet makes a Set in a temporary directory of the test's own
// (searchable by others: under root PostgreSQL runs as another user) and
// checks when the test ends that closing it leaves nothing behind.
func newSet(t *testing.T, redis, postgres bool) (*Set, Binaries) {
	t.Helper()
	bins, missing := Look(redis, postgres)
	if len(missing) > 0 {
		testutil.Unavailable(t, "not installed: %s", MissingPrograms(missing))
	}
	tmp := t.TempDir()
	for _, d := range []string{tmp, filepath.Dir(tmp)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("TMPDIR", tmp)
	s, err := NewSet("servers-test-", t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(s.Dir); err == nil {
			t.Errorf("%s left behind", s.Dir)
		}
	})
	return s, bins
}

// A persistent Redis keeps every acknowledged write across a clean
// restart and across kill -9, on the same address.
func TestPersistentRedisRestartsOnTheSamePortAndLosesNothing(t *testing.T) {
	s, bins := newSet(t, true, false)
	r, err := s.StartRedis(bins.Redis, RedisOptions{Persistent: true})
	if err != nil {
		t.Fatal(err)
	}
	rdb := goredis.NewClient(&goredis.Options{Addr: r.Addr, MaxRetries: -1})
	defer rdb.Close()
	ctx := context.Background()
	for i, restart := range []func() error{r.Stop, func() error { r.Kill(); return nil }} {
		key := []string{"after-stop", "after-kill"}[i]
		if err := rdb.Set(ctx, key, "kept", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := restart(); err != nil {
			t.Fatal(err)
		}
		if PingRedis(r.Addr) == nil {
			t.Fatalf("%s: the server still answers", key)
		}
		if err := r.Restart(); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"after-stop", "after-kill"}[:i+1] {
			if got, err := rdb.Get(ctx, k).Result(); err != nil || got != "kept" {
				t.Fatalf("after the restart, %s = %q, %v; want kept", k, got, err)
			}
		}
	}
}

// PostgreSQL killed with its backends recovers on the same address with
// every committed row.
func TestPostgresRestartsAfterAKillWithItsCommittedRows(t *testing.T) {
	s, bins := newSet(t, false, true)
	as, err := ServerAccount()
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.StartPostgres(bins, as)
	if err != nil {
		t.Fatal(err)
	}
	exec := func(sql string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, p.DSN)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := exec("CREATE TABLE t (v int); INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	p.Kill()
	if exec("SELECT 1") == nil {
		t.Fatal("the killed server still answers")
	}
	if err := p.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := exec("INSERT INTO t VALUES (2)"); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := p.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := exec("DO $$ BEGIN IF (SELECT count(*) FROM t) <> 2 THEN RAISE 'rows lost'; END IF; END $$"); err != nil {
		t.Fatal(err)
	}
}
