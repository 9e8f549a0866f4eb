package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/caddyproc"
)

// A case is one store and key mode, measured against plain Caddy.
type benchCase struct {
	store string
	mode  keyMode
	url   string
	count counter // nil for memory
}

func (c benchCase) name() string {
	if c.mode == uniqueKeys {
		return c.store + " new"
	}
	return c.store + " replay"
}

// outcome is what a case measured.
type outcome struct {
	benchCase
	plain, plugin []result
	ratios        []float64
	roundTrips    float64 // per request; -1 when not measured
}

func run(o options) error {
	dir, err := os.MkdirTemp("", "idempotency-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintln(os.Stderr, "building Caddy from the checkout...")
	bin, err := caddyproc.Build(dir)
	if err != nil {
		return err
	}
	up, err := startUpstream()
	if err != nil {
		return err
	}
	defer up.srv.Close()

	env, err := prepareStores(o.stores)
	if err != nil {
		return err
	}
	defer env.close()

	ports := make(map[string]int)
	var sites strings.Builder
	for _, name := range append([]string{"plain"}, o.stores...) {
		port, err := caddyproc.FreePort()
		if err != nil {
			return err
		}
		ports[name] = port
		fmt.Fprintf(&sites, "http://127.0.0.1:%d {\n%s\treverse_proxy %s\n}\n\n", port, env.directive(name), up.addr)
	}
	inst, err := caddyproc.Start(bin, dir, "bench", ports["plain"], caddyproc.Config{
		Globals: "\tlog {\n\t\tlevel ERROR\n\t}",
		Sites:   sites.String(),
	})
	if err != nil {
		return err
	}
	defer inst.Stop()

	body := jsonBody(o.bodySize)
	plainURL := fmt.Sprintf("http://127.0.0.1:%d/orders", ports["plain"])
	var results []outcome
	for _, store := range o.stores {
		modes := []keyMode{uniqueKeys, repeatedKeys}
		if _, v := splitVariant(store); v != "" {
			modes = variants[v]
		}
		for _, mode := range modes {
			c := benchCase{store: store, mode: mode, url: fmt.Sprintf("http://127.0.0.1:%d/orders", ports[store]), count: env.counters[store]}
			fmt.Fprintf(os.Stderr, "%s: ", c.name())
			res, err := measure(o, c, plainURL, body, inst.AdminAddr)
			if err != nil {
				return fmt.Errorf("%s: %w", c.name(), err)
			}
			fmt.Fprintf(os.Stderr, " ratio %.2fx\n", median(res.ratios))
			results = append(results, res)
		}
	}
	table := report(o, results, env.versions)
	fmt.Print(table)
	if o.write != "" {
		return os.WriteFile(o.write, []byte(markdownPage(o, table, env.versions)), 0o644)
	}
	return nil
}

// measure runs the pairs of one case.
func measure(o options, c benchCase, plainURL string, body []byte, admin string) (outcome, error) {
	out := outcome{benchCase: c, roundTrips: -1}
	spec := loadSpec{conns: o.conns, body: body, mode: c.mode, prefix: randomHex(4)}
	if c.mode == repeatedKeys {
		// Keys completed up front, one per connection and a few more.
		for i := range o.conns * 4 {
			spec.keys = append(spec.keys, fmt.Sprintf("replay-%s-%d", spec.prefix, i))
		}
		client := newWorkerClient()
		for _, k := range spec.keys {
			status, err := post(client, c.url, k, body)
			if err != nil || status != 201 {
				return out, fmt.Errorf("completing replay key: status %d, %v", status, err)
			}
		}
	}
	// Warm both endpoints (connections, store pools, caches).
	warm := spec
	warm.duration = o.warmup
	warm.prefix += "-warm"
	warm.url = plainURL
	runLoad(warm)
	warm.url = c.url
	runLoad(warm)

	ctx := context.Background()
	var trips, reqs int64
	for p := range o.pairs {
		spec.duration = o.duration
		spec.prefix = fmt.Sprintf("%s-%d", randomHex(4), p)
		spec.url = plainURL
		var plainProfiled chan error
		if o.profile != "" && p == o.pairs-1 {
			plainProfiled = make(chan error, 1)
			go func() { plainProfiled <- saveProfile(admin, o.duration, o.profile, c.name()+" plain") }()
		}
		plain := runLoad(spec)
		if plainProfiled != nil {
			if err := <-plainProfiled; err != nil {
				return out, err
			}
		}
		fmt.Fprint(os.Stderr, ".")

		var before int64
		if c.count != nil && p == o.pairs-1 {
			settle(c.count)
			var err error
			if before, err = c.count.read(ctx); err != nil {
				return out, err
			}
		}
		spec.url = c.url
		var profiled chan error
		if o.profile != "" && p == o.pairs-1 {
			profiled = make(chan error, 1)
			go func() { profiled <- saveProfile(admin, o.duration, o.profile, c.name()) }()
		}
		plugin := runLoad(spec)
		if profiled != nil {
			if err := <-profiled; err != nil {
				return out, err
			}
		}
		fmt.Fprint(os.Stderr, ".")
		if c.count != nil && p == o.pairs-1 {
			settle(c.count)
			after, err := c.count.read(ctx)
			if err != nil {
				return out, err
			}
			trips, reqs = after-before, plugin.requests
		}
		if plain.errors > 0 || plugin.errors > 0 {
			return out, fmt.Errorf("transport errors: plain %d, plugin %d", plain.errors, plugin.errors)
		}
		if bad := unexpected(plugin.statuses); bad != "" {
			return out, fmt.Errorf("plugin answered %s", bad)
		}
		out.plain = append(out.plain, plain)
		out.plugin = append(out.plugin, plugin)
		out.ratios = append(out.ratios, plugin.rps()/plain.rps())
	}
	if reqs > 0 {
		out.roundTrips = float64(trips) / float64(reqs)
	}
	return out, nil
}

// settle waits until a counter has seen everything done so far:
// PostgreSQL backends publish their statistics up to ten seconds after they
// go idle. Redis counts at once.
func settle(c counter) {
	if _, ok := c.(postgresCommits); ok {
		time.Sleep(11 * time.Second)
	}
}

// saveProfile fetches a CPU profile of Caddy (admin /debug/pprof) while
// a run goes on.
func saveProfile(admin string, d time.Duration, dir, name string) error {
	secs := max(1, int(d.Seconds())-1)
	resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", admin, secs))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".pprof"))
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

// unexpected names statuses other than 201.
func unexpected(statuses map[int]int64) string {
	var bad []string
	for s, n := range statuses {
		if s != 201 {
			bad = append(bad, fmt.Sprintf("%d x%d", s, n))
		}
	}
	return strings.Join(bad, ", ")
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// storeEnv is the Redis and PostgreSQL set-up of a benchmark run.
type storeEnv struct {
	redisURL, redisPrefix string
	pgDSN, pgTable        string
	counters              map[string]counter
	versions              map[string]string
	cleanup               []func()
}

func (e *storeEnv) close() {
	for _, f := range slices.Backward(e.cleanup) {
		f()
	}
}

// Variants of a store, named by a suffix: "+cache" puts a replay cache in
// front (it only changes replays), "+async" commits PostgreSQL
// transactions without waiting for the WAL flush (it only changes new
// keys).
const cachedSuffix = "+cache"

var variants = map[string][]keyMode{cachedSuffix: {repeatedKeys}, "+async": {uniqueKeys}}

func splitVariant(store string) (base, variant string) {
	if i := strings.IndexByte(store, '+'); i >= 0 {
		return store[:i], store[i:]
	}
	return store, ""
}

// directive returns the idempotency directive of a site.
func (e *storeEnv) directive(store string) string {
	const ttl = "\t\tttl 10m\n"
	switch store {
	case "redis" + cachedSuffix:
		return fmt.Sprintf("\tidempotency {\n%s\t\tstorage redis {\n\t\t\turl %s\n\t\t\tkey_prefix %s\n\t\t\treplay_cache 100000 10s\n\t\t}\n\t}\n", ttl, e.redisURL, e.redisPrefix)
	case "postgres+async":
		return fmt.Sprintf("\tidempotency {\n%s\t\tstorage postgres {\n\t\t\tdsn %q\n\t\t\ttable %s\n\t\t}\n\t}\n", ttl, e.pgDSN+"&synchronous_commit=off", e.pgTable)
	case "postgres" + cachedSuffix:
		return fmt.Sprintf("\tidempotency {\n%s\t\tstorage postgres {\n\t\t\tdsn %q\n\t\t\ttable %s\n\t\t\treplay_cache 100000 10s\n\t\t}\n\t}\n", ttl, e.pgDSN, e.pgTable)
	case "memory":
		return "\tidempotency {\n" + ttl + "\t}\n"
	case "redis":
		return fmt.Sprintf("\tidempotency {\n%s\t\tstorage redis {\n\t\t\turl %s\n\t\t\tkey_prefix %s\n\t\t}\n\t}\n", ttl, e.redisURL, e.redisPrefix)
	case "postgres":
		return fmt.Sprintf("\tidempotency {\n%s\t\tstorage postgres {\n\t\t\tdsn %q\n\t\t\ttable %s\n\t\t}\n\t}\n", ttl, e.pgDSN, e.pgTable)
	}
	return ""
}

const benchDatabase = "idempotency_bench"

func prepareStores(stores []string) (*storeEnv, error) {
	e := &storeEnv{counters: map[string]counter{}, versions: map[string]string{}}
	ctx := context.Background()
	for _, s := range stores {
		if _, v := splitVariant(s); v != "" {
			continue // set below, once the base store is prepared
		}
		switch s {
		case "memory":
		case "redis":
			// IDEMPOTENCY_REDIS_ADDR is the older spelling: host:port.
			e.redisURL = envOr("IDEMPOTENCY_REDIS_URL", "redis://"+envOr("IDEMPOTENCY_REDIS_ADDR", "127.0.0.1:6379")+"/0")
			e.redisPrefix = "bench:" + randomHex(4) + ":"
			if _, err := url.Parse(e.redisURL); err != nil {
				// Its message would repeat the URL, password and all.
				return nil, errors.New("IDEMPOTENCY_REDIS_URL is not a URL")
			}
			opts, err := goredis.ParseURL(e.redisURL)
			if err != nil {
				return nil, fmt.Errorf("IDEMPOTENCY_REDIS_URL: %w", err)
			}
			client := goredis.NewClient(opts)
			if err := client.Ping(ctx).Err(); err != nil {
				return nil, fmt.Errorf("redis at %s: %w", opts.Addr, err)
			}
			info, _ := client.Info(ctx, "server").Result()
			e.versions["redis"] = infoField(info, "redis_version")
			e.counters["redis"] = redisScripts{client}
			e.cleanup = append(e.cleanup, func() { deletePrefix(client, e.redisPrefix); client.Close() })
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
			e.cleanup = append(e.cleanup, func() { dropTable(e.pgDSN, e.pgTable) })
		default:
			return nil, fmt.Errorf("unknown store %q", s)
		}
	}
	for _, s := range stores {
		if base, v := splitVariant(s); v != "" {
			if _, ok := variants[v]; !ok || !slices.Contains(stores, base) {
				return nil, fmt.Errorf("store %q: unknown variant, or %q missing from -stores", s, base)
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
