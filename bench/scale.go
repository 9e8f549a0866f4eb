package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"
)

// liveSuffix names the site of a store that holds -live records besides
// the benchmark's own: Redis database liveRedisDB, or a PostgreSQL table
// of its own (which also cleans up every second, for the cleanup run).
const (
	liveSuffix  = "@live"
	liveRedisDB = 1
	// scaleTarget is the least a full store may serve of what the empty
	// one does, in requests per second (issue 21: within 15%).
	scaleTarget = 0.85
	fillChunk   = 500_000
)

// liveStores are the stores measured with live records: the memory store
// is measured for its heap instead (heap.go).
func liveStores(o options) []string {
	var out []string
	for _, s := range []string{"redis", "postgres"} {
		if o.live > 0 && slices.Contains(o.stores, s) {
			out = append(out, s)
		}
	}
	return out
}

// scalePhase fills each live site with o.live records and compares it
// with the same store empty, new keys and replays, for throughput (wrk)
// and for p99 at the open-loop rate, in alternating runs. For PostgreSQL
// it then measures the cleanup of expired rows while new keys are served.
func scalePhase(o options, dir string, env *storeEnv, ports map[string]int, rate float64, body []byte) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "With %d live records in the store, against the same store empty (%d rounds; each run of %s; p99 at %.0f requests/s open-loop; target: at least %.2fx of the empty store's throughput):\n\n",
		o.live, o.scaleRounds, o.duration, rate, scaleTarget)
	b.WriteString("| case | empty: req/s | full: req/s | full / empty (median, range) | target | p99 at the rate, empty | p99 at the rate, full |\n")
	b.WriteString("| --- | ---: | ---: | ---: | --- | ---: | ---: |\n")
	var notes []string
	client := newOpenLoopClient(o.openConns)
	defer client.close()
	url := func(site string) string { return fmt.Sprintf("http://127.0.0.1:%d/orders", ports[site]) }
	for _, store := range liveStores(o) {
		var cases []benchCase
		for _, site := range []string{store, store + liveSuffix} {
			for _, mode := range []string{"new", "replay"} {
				cases = append(cases, benchCase{name: site + " " + mode, site: site, mode: mode, url: url(site), prefix: "s-" + randomHex(4)})
			}
		}
		for _, c := range cases {
			if c.mode == "replay" {
				if err := completeKeys(c, o.conns*4, body); err != nil {
					return "", err
				}
			}
		}
		fmt.Fprintf(os.Stderr, "%s: filling with %d records...\n", store, o.live)
		start := time.Now()
		var err error
		switch store {
		case "redis":
			err = fillRedis(env, o.live)
		case "postgres":
			err = fillPostgres(env, o.live, "now() + interval '1 day'")
		}
		if err != nil {
			return "", fmt.Errorf("%s: filling: %w", store, err)
		}
		notes = append(notes, fmt.Sprintf("filling %s took %s", store, time.Since(start).Round(time.Second)))

		rps := map[string][]float64{}
		p99 := map[string][]time.Duration{}
		for _, c := range cases { // warm the full store's caches as the empty one's are
			if _, err := runWrk(o, dir, c.url, c.mode, c.prefixFor(-1), o.conns*4, body, o.warmup); err != nil {
				return "", fmt.Errorf("%s: warming up: %w", c.name, err)
			}
		}
		for r := range o.scaleRounds {
			fmt.Fprintf(os.Stderr, "scale round %d:", r+1)
			for _, c := range cases {
				w, err := runWrk(o, dir, c.url, c.mode, c.prefixFor(r), o.conns*4, body, o.duration)
				if err != nil {
					return "", fmt.Errorf("%s: %w", c.name, err)
				}
				if w.non2xx > 0 || w.errors > 0 {
					return "", fmt.Errorf("%s: %d answers were not 2xx, %d socket errors", c.name, w.non2xx, w.errors)
				}
				lat, err := client.run(c.url, c.mode, c.prefixFor(r), o.conns*4, body, rate, o.latencyDuration)
				if err != nil {
					return "", fmt.Errorf("%s at %.0f/s: %w", c.name, rate, err)
				}
				rps[c.name] = append(rps[c.name], w.rps)
				p99[c.name] = append(p99[c.name], lat.p99)
				fmt.Fprintf(os.Stderr, " %s %.0f/s p99 %s", c.name, w.rps, ms(lat.p99))
			}
			fmt.Fprintln(os.Stderr)
		}
		for _, mode := range []string{"new", "replay"} {
			empty, full := store+" "+mode, store+liveSuffix+" "+mode
			var ratios []float64
			for i := range rps[empty] {
				ratios = append(ratios, rps[full][i]/rps[empty][i])
			}
			verdict := "met"
			if median(ratios) < scaleTarget {
				verdict = "MISSED"
			}
			fmt.Fprintf(&b, "| %s %s | %.0f | %.0f | %.2fx (%.2f-%.2f) | >= %.2fx: %s | %s | %s |\n", store, mode,
				median(rps[empty]), median(rps[full]), median(ratios), minOf(ratios), maxOf(ratios), scaleTarget, verdict,
				ms(median(p99[empty])), ms(median(p99[full])))
		}
		if store == "postgres" {
			line, err := cleanupWhileServing(o, env, client, url(store+liveSuffix), rate, body, median(p99[store+liveSuffix+" new"]))
			if err != nil {
				return "", err
			}
			notes = append(notes, line)
		}
	}
	b.WriteString("\n")
	for _, n := range notes {
		b.WriteString("- " + n + "\n")
	}
	return b.String(), nil
}

// cleanupWhileServing adds o.expired expired rows to the full PostgreSQL
// table and serves new keys at the rate while the store's own cleanup
// (every second on the live site) deletes them: it reports the rows
// deleted per second and the p99 of the new keys meanwhile, against
// without.
func cleanupWhileServing(o options, env *storeEnv, client *openLoopClient, url string, rate float64, body []byte, p99Without time.Duration) (string, error) {
	if err := fillPostgres(env, o.expired, "now() - interval '1 hour'"); err != nil {
		return "", fmt.Errorf("postgres: adding expired rows: %w", err)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, env.pgDSN)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	table := env.liveTable()
	start := time.Now()
	done := make(chan time.Duration, 1)
	stop := make(chan struct{})
	go func() { // a cheap probe on the expires_at index, until no expired row is left
		defer close(done)
		for {
			var left bool
			if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+table+` WHERE expires_at <= now() - interval '1 minute')`).Scan(&left); err == nil && !left {
				done <- time.Since(start)
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	var p99s []time.Duration
	var took time.Duration
	for took == 0 {
		run, err := client.run(url, "new", "c-"+randomHex(4), 0, body, rate, o.latencyDuration)
		if err != nil {
			close(stop)
			return "", fmt.Errorf("postgres new during cleanup: %w", err)
		}
		p99s = append(p99s, run.p99)
		select {
		case took = <-done:
		default:
			if time.Since(start) > 10*time.Minute {
				close(stop)
				return "", fmt.Errorf("postgres: cleanup of %d rows did not end in 10 minutes", o.expired)
			}
		}
	}
	return fmt.Sprintf("PostgreSQL cleanup while serving: %d expired rows in a table of %d live ones were deleted in %s (%.0f rows/s, in batches of 1000 every second: the store's own cleanup), while new keys came at %.0f/s; their p99 meanwhile: %s (worst %s-run: %s), without cleanup: %s",
		o.expired, o.live, took.Round(100*time.Millisecond), float64(o.expired)/took.Seconds(), rate,
		ms(median(p99s)), o.latencyDuration, ms(maxDur(p99s)), ms(p99Without)), nil
}

// fillRedis copies one completed record of the live site's database to
// n names, in scripts of fillChunk each.
func fillRedis(env *storeEnv, n int) error {
	ctx := context.Background()
	client := goredis.NewClient(&goredis.Options{Addr: env.redisAddr, DB: liveRedisDB, ReadTimeout: 5 * time.Minute})
	defer client.Close()
	keys, _, err := client.Scan(ctx, 0, env.redisPrefix+"*", 1000).Result()
	if err != nil {
		return err
	}
	var template string
	for _, k := range keys {
		if t, _ := client.Type(ctx, k).Result(); t == "hash" {
			template = k
			break
		}
	}
	if template == "" {
		return fmt.Errorf("no completed record under %s* to copy", env.redisPrefix)
	}
	fields, err := client.HGetAll(ctx, template).Result()
	if err != nil {
		return err
	}
	args := []any{0, 0}
	for k, v := range fields {
		args = append(args, k, v)
	}
	const script = `
for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
  local k = KEYS[1] .. 'fill:' .. i
  redis.call('HSET', k, unpack(ARGV, 3))
  redis.call('PEXPIRE', k, 86400000)
end
return 0`
	for from := 0; from < n; from += fillChunk {
		args[0], args[1] = from, min(from+fillChunk, n)-1
		if err := client.Eval(ctx, script, []string{env.redisPrefix}, args...).Err(); err != nil {
			return err
		}
	}
	return nil
}

// fillPostgres copies one completed row of the live table to n new keys
// expiring at expires (an SQL expression), fillChunk rows a statement,
// then vacuums and analyses the table and checkpoints, so that the
// measurement does not pay for the load.
func fillPostgres(env *storeEnv, n int, expires string) error {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, env.pgDSN)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	table, salt := env.liveTable(), randomHex(4)
	for from := 0; from < n; from += fillChunk {
		_, err := conn.Exec(ctx, `INSERT INTO `+table+` (scope, key, fingerprint, state, token, status, headers, body, body_omitted, created_at, expires_at, detail)
SELECT t.scope, md5(g::text || $3), t.fingerprint, t.state, t.token, t.status, t.headers, t.body, t.body_omitted, now(), `+expires+`, t.detail
FROM (SELECT * FROM `+table+` WHERE state = 2 LIMIT 1) t, generate_series($1::bigint, $2::bigint) g`, from, min(from+fillChunk, n)-1, salt)
		if err != nil {
			return err
		}
	}
	if _, err := conn.Exec(ctx, `VACUUM ANALYZE `+table); err != nil {
		return err
	}
	_, _ = conn.Exec(ctx, `CHECKPOINT`) // only a superuser may; the run goes on without
	return nil
}
