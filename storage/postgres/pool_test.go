package postgres_test

import (
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

func TestPoolSize(t *testing.T) {
	for _, tc := range []struct {
		name     string
		dsn      string
		maxConns int
		want     int32
	}{
		{"default", "postgres://u@db.internal/app", 0, int32(postgres.DefaultMaxConns())},
		{"keyword default", "host=db.internal user=u dbname=app", 0, int32(postgres.DefaultMaxConns())},
		{"the DSN's pool_max_conns", "postgres://u@db.internal/app?pool_max_conns=7", 0, 7},
		{"the DSN's pool_max_conns, keyword form", "host=db.internal user=u pool_max_conns=5", 0, 5},
		{"max_conns wins over the DSN", "postgres://u@db.internal/app?pool_max_conns=7", 9, 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := postgres.NewPoolConfig(tc.dsn, tc.maxConns)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.MaxConns != tc.want {
				t.Errorf("MaxConns = %d, want %d", cfg.MaxConns, tc.want)
			}
		})
	}
	if postgres.DefaultMaxConns() < 16 {
		t.Errorf("DefaultMaxConns() = %d, want at least 16", postgres.DefaultMaxConns())
	}
}
