package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"
)

// storeEnv is the Redis and PostgreSQL set-up of a benchmark run.
type storeEnv struct {
	redisAddr, redisPrefix string
	pgDSN, pgTable         string
	pgMaxConns             int // 0: the module's default
	counters               map[string]counter
	versions               map[string]string
	cleanup                []func()
}

func (e *storeEnv) close() {
	for _, f := range slices.Backward(e.cleanup) {
		f()
	}
}

// cachedSuffix names a store with a replay cache in front (it only
// changes replays).
const cachedSuffix = "+cache"

// directive returns the idempotency directive of a site. The benchmark is
// one client, so the memory store's per-client bound is lifted.
func (e *storeEnv) directive(site string) string {
	const ttl = "\t\tttl 24h\n" // replay keys outlive the whole run
	db, table := 0, e.pgTable
	if base, ok := strings.CutSuffix(site, liveSuffix); ok {
		site, db, table = base, liveRedisDB, e.liveTable()
	}
	cache := ""
	if strings.HasSuffix(site, cachedSuffix) {
		cache = "\t\t\treplay_cache 100000 10s\n"
	}
	switch strings.TrimSuffix(site, cachedSuffix) {
	case "memory":
		return "\tidempotency {\n" + ttl + "\t\tstorage memory {\n\t\t\tmax_keys_per_scope 100000000\n\t\t}\n\t}\n"
	case "redis":
		return fmt.Sprintf("\tidempotency {\n%s\t\tstorage redis {\n\t\t\turl redis://%s/%d\n\t\t\tkey_prefix %s\n%s\t\t}\n\t}\n", ttl, e.redisAddr, db, e.redisPrefix, cache)
	case "postgres":
		if e.pgMaxConns > 0 {
			cache += fmt.Sprintf("\t\t\tmax_conns %d\n", e.pgMaxConns)
		}
		if table != e.pgTable {
			cache += "\t\t\tcleanup_interval 1s\n" // for the cleanup run of scale.go
		}
		return fmt.Sprintf("\tidempotency {\n%s\t\tstorage postgres {\n\t\t\tdsn %q\n\t\t\ttable %s\n%s\t\t}\n\t}\n", ttl, e.pgDSN, table, cache)
	}
	return ""
}

const benchDatabase = "idempotency_bench"

// liveTable is the table of the PostgreSQL site with live records.
func (e *storeEnv) liveTable() string { return e.pgTable + "_live" }

func prepareStores(stores []string, pgMaxConns int, live bool) (*storeEnv, error) {
	e := &storeEnv{counters: map[string]counter{}, versions: map[string]string{}, pgMaxConns: pgMaxConns}
	ctx := context.Background()
	for _, s := range stores {
		if strings.HasSuffix(s, cachedSuffix) {
			continue // set below, once the base store is prepared
		}
		switch s {
		case "memory":
		case "redis":
			e.redisAddr = redisAddr()
			e.redisPrefix = "bench:" + randomHex(4) + ":"
			client := goredis.NewClient(&goredis.Options{Addr: e.redisAddr})
			if err := client.Ping(ctx).Err(); err != nil {
				return nil, fmt.Errorf("redis at %s: %w", e.redisAddr, err)
			}
			info, _ := client.Info(ctx, "server").Result()
			e.versions["redis"] = infoField(info, "redis_version")
			e.counters["redis"] = redisScripts{client}
			e.cleanup = append(e.cleanup, func() { deletePrefix(client, e.redisPrefix); client.Close() })
			if live {
				// The live records get a database of their own, so that the
				// empty store's keyspace stays empty; it must be unused.
				liveDB := goredis.NewClient(&goredis.Options{Addr: e.redisAddr, DB: liveRedisDB})
				if n, err := liveDB.DBSize(ctx).Result(); err != nil || n > 0 {
					liveDB.Close()
					return nil, fmt.Errorf("redis at %s: database %d holds %d keys (%v); -live needs it empty", e.redisAddr, liveRedisDB, n, err)
				}
				e.cleanup = append(e.cleanup, func() { liveDB.FlushDBAsync(ctx); liveDB.Close() })
			}
		case "postgres":
			admin := envOr("IDEMPOTENCY_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
			conn, err := pgx.Connect(ctx, admin)
			if err != nil {
				return nil, fmt.Errorf("postgres: %w", err)
			}
			var exists bool
			_ = conn.QueryRow(ctx, `SELECT true FROM pg_database WHERE datname = $1`, benchDatabase).Scan(&exists)
			if !exists {
				if _, err := conn.Exec(ctx, "CREATE DATABASE "+benchDatabase); err != nil {
					return nil, fmt.Errorf("creating the bench database: %w", err)
				}
			}
			var version string
			_ = conn.QueryRow(ctx, `SHOW server_version`).Scan(&version)
			e.versions["postgres"] = version
			conn.Close(ctx)
			e.pgDSN = withDatabase(admin, benchDatabase)
			e.pgTable = "bench_" + randomHex(4)
			e.counters["postgres"] = postgresCommits{dsn: admin, database: benchDatabase}
			e.cleanup = append(e.cleanup, func() { dropTable(e.pgDSN, e.pgTable); dropTable(e.pgDSN, e.liveTable()) })
		default:
			return nil, fmt.Errorf("unknown store %q", s)
		}
	}
	for _, s := range stores {
		if base, ok := strings.CutSuffix(s, cachedSuffix); ok {
			if !slices.Contains(stores, base) {
				return nil, fmt.Errorf("store %q needs %q in -stores", s, base)
			}
			e.counters[s] = e.counters[base]
		}
	}
	return e, nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func infoField(info, name string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return "?"
}

func deletePrefix(client *goredis.Client, prefix string) {
	ctx := context.Background()
	iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		if batch = append(batch, iter.Val()); len(batch) == 1000 {
			client.Del(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		client.Del(ctx, batch...)
	}
}

func withDatabase(dsn, db string) string {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return dsn
	}
	return fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, db)
}

func dropTable(dsn, table string) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	_, _ = conn.Exec(ctx, "DROP TABLE IF EXISTS "+table)
}

// redisAddr is the Redis of the tests: IDEMPOTENCY_REDIS_URL,
// IDEMPOTENCY_REDIS_ADDR, or loopback.
func redisAddr() string {
	if u, err := url.Parse(os.Getenv("IDEMPOTENCY_REDIS_URL")); err == nil && u.Host != "" {
		return u.Host
	}
	return envOr("IDEMPOTENCY_REDIS_ADDR", "127.0.0.1:6379")
}
