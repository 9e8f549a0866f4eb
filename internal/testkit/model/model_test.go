package model

import (
	"flag"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	"github.com/jackc/pgx/v5"

	_ "github.com/caddy-idempotency/caddy-idempotency" // the module under test
	"github.com/caddy-idempotency/caddy-idempotency/internal/knobs"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// The model-based randomized test: configurations, request sequences and
// upstream behaviours drawn from a seed, run through a real Caddy in this
// process, every answer and every upstream execution judged against the
// contract (decide.go, judge*.go). make test runs a short budget on every
// store; make soak a long one. A failure prints its seed and the smallest
// trial that still fails; -model.seed replays one seed.
var (
	flagSeed   = flag.Uint64("model.seed", 0, "run only this seed")
	flagTrials = flag.Int("model.trials", 3, "trials per store and server setting")
	flagSteps  = flag.Int("model.steps", 15, "random steps per trial (besides its scenarios)")
	flagLong   = flag.Bool("model.long", false, "version 1 only: add a client that stops reading for 20 s")
	flagStore  = flag.String("model.store", "", "run only this store (memory, redis, postgres)")
	flagBase   = flag.Uint64("model.base", defaultBase, "first seed (0: random, printed)")
	flagVer    = flag.Int("model.version", 3, "generator version (1: that of the regression seeds before 2026-12; 2: before 2026-12-07)")
	flagAll    = flag.Bool("model.all", false, "every scenario of its store in every trial")

	flagShrinkKinds = flag.Int("model.shrink-kinds", 3, "kinds of anomaly to shrink a failing trial for")
	flagShrinkRuns  = flag.Int("model.shrink-runs", 25, "re-runs to shrink a failing trial with, per kind")
)

// defaultBase is the first seed of make test's runs: its trials are the
// same in every run, so that what they catch (make mutants) they catch
// every time; make soak draws new ones.
const defaultBase = 26_000

func TestMain(m *testing.M) {
	flag.Parse()
	// The model's clients sleep and read slowly against a stall timeout
	// of seconds, not the production's ten (see stallTimeout).
	knobs.ClientStallTimeout.Store(int64(stallTimeout))
	os.Exit(testutil.RunWithoutLookups(m))
}

// setting is a store under particular server settings.
type setting struct {
	store, name string
	open        func(t *testing.T) func(env *Env)
}

func settings() []setting {
	return []setting{
		{"memory", "", func(*testing.T) func(*Env) { return func(*Env) {} }},
		{"redis", "", func(t *testing.T) func(*Env) {
			addr := redistest.Addr()
			redistest.Require(t, addr)
			return viaPaths(t, addr, func(env *Env) { env.RedisURL = "redis://" + addr + "/0" })
		}},
		{"redis", "persistent", func(t *testing.T) func(*Env) {
			srv := redistest.StartServerArgs(t, "--appendonly", "yes", "--appendfsync", "always")
			return viaPaths(t, srv.Addr, func(env *Env) { env.RedisURL = "redis://" + srv.Addr + "/0" })
		}},
		{"postgres", "", func(t *testing.T) func(*Env) {
			dsn := pgtest.Require(t)
			table := pgtest.Table(t, dsn)
			return viaPaths(t, pgtest.Address(t, dsn), func(env *Env) { env.PostgresD, env.PGTable = dsn, table })
		}},
		{"postgres", "serializable", isolatedPostgres("serializable")},
		{"postgres", "repeatable read", isolatedPostgres("repeatable read")},
	}
}

// isolatedPostgres is a database of the test's own whose default
// isolation is level.
func isolatedPostgres(level string) func(t *testing.T) func(*Env) {
	return func(t *testing.T) func(*Env) {
		dsn := pgtest.Require(t)
		db, name := pgtest.Database(t, dsn)
		pgtest.Exec(t, dsn, `ALTER DATABASE `+pgx.Identifier{name}.Sanitize()+` SET default_transaction_isolation = '`+level+`'`)
		return viaPaths(t, pgtest.Address(t, dsn), func(env *Env) { env.PostgresD, env.PGTable = db, "idempotency_keys" })
	}
}

// viaPaths adds to set the two paths to the store at addr: proxies that
// the scenarios slow down, black-hole and cut.
func viaPaths(t *testing.T, addr string, set func(*Env)) func(*Env) {
	var paths [2]*caddyproc.Proxy
	for i := range paths {
		p, err := caddyproc.NewProxy(addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		paths[i] = p
	}
	return func(env *Env) {
		set(env)
		env.Paths = paths
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func newEnv(t *testing.T) *Env {
	up, err := NewUpstream(clockForModules)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(up.Close)
	t.Cleanup(func() { _ = caddy.Stop() })
	tls, err := NewTLSServer(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	refuse, err := caddyproc.NewRefuser()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { refuse.Close() })
	return &Env{Up: up, Port: func() int { return freePort(t) }, TLS: tls, Refuse: refuse.Addr}
}

func TestModel(t *testing.T) {
	base := *flagBase
	if base == 0 {
		base = uint64(os.Getpid())<<20 ^ uint64(caddyRandom())
	}
	t.Logf("model seeds from %d (replay one with -model.base %d -model.trials N, or -model.seed N)", base, base)
	forEachSetting(t, func(t *testing.T, st setting, env *Env) {
		for i := range *flagTrials {
			seed := base + uint64(i)
			if *flagSeed != 0 && seed != *flagSeed {
				continue
			}
			run(t, env, st, seed, trialOptions(st, i, *flagTrials))
		}
	})
	t.Log(stats.report())
}

// trialOptions are what trial i of n on st draws: its share of the
// store's scenarios (all of them with -model.all), and a store 30 ms
// away each way for the trial that runs many leases at once.
func trialOptions(st setting, i, n int) GenOptions {
	o := GenOptions{Store: Store{Kind: st.store}, Setting: st.name, Steps: *flagSteps, Long: *flagLong, Version: *flagVer}
	if o.Version == 1 {
		return o
	}
	kinds := scenarioKinds(st.store, st.name, o.Version)
	o.Cover = cover(kinds, i, n)
	if *flagAll {
		o.Cover = kinds
	}
	if st.store != "memory" && slices.Contains(o.Cover, scScale) {
		o.Latency = 30 * time.Millisecond
	}
	return o
}

// regressions are the seeds that found bugs on the code before they were
// fixed, kept so that each stays fixed: what the seed's trial does is
// fixed by the seed, the store, the number of steps, the generator's
// version and the scenarios it covers.
//
// The first ones were found by version 1 of the generator (main 168c050)
// and run as version 1 (version 0 here).
var regressions = []struct {
	store, setting string
	seed           uint64
	steps          int
	version        int      // of the generator; 0: 1
	cover          []string // the scenarios of the trial (version 2 and up)
	// finds is the anomaly kind the seed found, for a rule that
	// knownFailing lists as not kept yet: until the fix the seed must
	// still find it; after, it must pass.
	finds string
	found string
}{
	{"memory", "", 41001, 25, 0, nil, "", "observe around enforce ran keys several times; an upstream's 042 made the memory store panic on every retry"},
	{"redis", "", 41010, 25, 0, nil, "", "observe around enforce ran a key again for another body (no 422)"},
	{"memory", "", 41009, 25, 0, nil, "", "a request going on without a key (key_json, observe) reached the upstream with a closed body"},
	{"memory", "", 41027, 25, 0, nil, "", "an upstream's 042 was recorded and the memory store panicked; differs named equal members"},
	{"memory", "", 41007, 25, 0, nil, "", "trailers lost on replay; a gzip body the upstream sent despite identity replayed to clients that never asked"},
	{"memory", "", 41000, 25, 0, nil, "", "the upstream's Server header replaced by Caddy's on replay"},
	{"memory", "", 41003, 25, 0, nil, "", "lock_timeout 25h loaded"},
	{"memory", "", 50773, 25, 0, nil, "", "lock_timeout near the int64 maximum loaded, and requests with one key ran several times"},
	{"redis", "", 50580, 25, 0, nil, "", "lock_timeout 60000d gave PEXPIRE a negative value: a key ran twice"},
	{"redis", "", 30002, 25, 0, nil, "", "replay_cache let an outer header replace rewrite the cached record on every replay"},
	{"postgres", "serializable", 40001, 25, 0, nil, "", "serialization failures ran keys several times under fail_open, and answered 503"},
	{"postgres", "repeatable read", 40005, 25, 0, nil, "", "serialization failures ran keys several times under fail_open"},
	// Version 3, found on main 7b26018 (issue 38 item 3).
	{"memory", "", 70006, 15, 3, nil, "ran-after-unknown",
		"a reverse_proxy whose response_header_timeout is shorter than the upstream takes answered 504, and the retry ran the request again (2 executions)"},
	{"memory", "", 39001, 0, 3, []string{scUpstream}, "ran-after-unknown",
		"an upstream that reset the connection (or closed it) once it read the request: 502, and the retry ran again; a 504 the same; over HTTP/1.1, HTTP/2, h2c and HTTP/3"},
	{"redis", "", 39001, 0, 3, []string{scUpstream}, "ran-after-unknown", "the same on Redis"},
	{"postgres", "", 39001, 0, 3, []string{scUpstream}, "ran-after-unknown", "the same on PostgreSQL"},
	// A false alarm of a judge, on main 7b26018 (issue 38 item 6): the
	// pause judge took the keys whose records had expired (ttl 2s, drawn
	// by the ttl scenario) before the burst's second wave for duplicates.
	// As -model.base 31788901234 -model.trials 1 -model.version 2 draws
	// it: every scenario of Redis.
	{"redis", "", 31788901234, 15, 2, scenarioKindsV2("redis", ""), "",
		"false alarm: 22 duplicates of the pause scenario whose records a 2s ttl had expired"},
	// Version 3's request spellings, found on main 7b26018 (issue 38 item
	// 2) as trials 5, 26, 23 and 37 of -model.base 39000 -model.trials 40:
	// trial 5 covered the resume scenario, the others none.
	{"memory", "", 39005, 15, 3, []string{scResume}, "", "a host spelt in upper case was a scope of its own: a key held by the host in lower case ran again"},
	{"memory", "", 39026, 15, 3, nil, "", "JSON bodies sent gzipped or deflated got 400 body-invalid-json; a host in mixed case ran a key again"},
	{"memory", "", 39023, 15, 3, nil, "", "key_json found no key in a webhook delivered in zstd and passed it on unprotected: it ran twice"},
	{"memory", "", 39037, 15, 3, nil, "", "a zstd body in zlib without its checksum decoded as if whole (the decoder of the new codings, before its fix)"},
	// Version 3's other writers of the store, found on main 7b26018 (issue
	// 38 item 5) as trials 7 and 9 of -model.base 39200 -model.trials 10.
	{"postgres", "", 39207, 15, 3, []string{scLocked}, "", "up to 20 concurrent requests for a locked key stalled every batch: 78 unrelated requests got 503 from a healthy store"},
	{"postgres", "", 39209, 15, 3, []string{scLockedLease}, "", "a live lease whose row was locked past lock_timeout was taken over when the lock went: the key ran twice"},
	// Version 3's silent upstreams and waiter storms, found on main 7b26018
	// (issue 38 items 3 and 4), each seed 26000 with its scenario alone.
	{"memory", "", 26000, 0, 3, []string{scSilent}, "", "an upstream silent for longer than the stall timeout after its flushed headers or its first bytes: the HTTP/2 and h2c clients' streams were reset (the stall deadline stayed armed between writes)"},
	{"memory", "", 26000, 0, 3, []string{scStorm}, "", "one key's 1,000 waiting retries took every place in the wait: another client's retry got 409 at once"},
	// Found by make soak's fresh seeds on main 318c982, as trial 2 of
	// -model.base 22192887568 -model.trials 3 on PostgreSQL.
	{"postgres", "", 22192887570, 15, 3, cover(scenarioKinds("postgres", "", 3), 2, 3), "",
		"a burst of up to 150 new keys, retried while in flight under in_flight wait, on a store 30 ms away with max_conns 4: a poller per waited key took every connection, and reserves timed out into 503 from a healthy store"},
}

// knownFailing are the anomaly kinds of rules of the contract that the
// code does not keep yet, each with the issue that fixes it: TestModel
// logs them without failing, and TestModelRegressions checks that the
// seeds that found them still do. The fix empties it (ran-after-unknown
// was here until issue 39 item 1, unknown outcomes keep the key).
var knownFailing = map[string]string{}

// TestModelRegressions runs the regression seeds.
func TestModelRegressions(t *testing.T) {
	forEachSetting(t, func(t *testing.T, st setting, env *Env) {
		for _, r := range regressions {
			if r.store != st.store || r.setting != st.name {
				continue
			}
			t.Logf("seed %d: %s", r.seed, r.found)
			o := GenOptions{Store: Store{Kind: st.store}, Setting: st.name, Steps: r.steps, Version: max(r.version, 1), Cover: r.cover}
			if st.store != "memory" && slices.Contains(o.Cover, scScale) {
				o.Latency = 30 * time.Millisecond // as trialOptions draws it
			}
			if issue, known := knownFailing[r.finds]; known {
				tr := Generate(r.seed, o)
				tr.Setting = st.name
				if !slices.ContainsFunc(env.Run(tr), func(a Anomaly) bool { return a.Kind == r.finds }) {
					t.Errorf("seed %d (version %d) no longer finds %s, which %s fixes: take %s out of knownFailing", r.seed, r.version, r.finds, issue, r.finds)
				}
				continue
			}
			run(t, env, st, r.seed, o)
		}
	})
}

// TestModelTrialsAreIsolated runs the version 1 trials of the bases that
// raised a false alarm 3 times in 4 before trials were isolated: a client
// of one trial that hung up reached the upstream only once the next trial
// had begun, and was taken for a stray execution of that one. An
// execution counts only for the trial whose token its request carries.
func TestModelTrialsAreIsolated(t *testing.T) {
	forEachSetting(t, func(t *testing.T, st setting, env *Env) {
		if st.store != "memory" {
			t.Skip("the memory store shows it; the others only cost time")
		}
		for _, base := range []uint64{27000, 20000} {
			for i := range 3 {
				run(t, env, st, base+uint64(i), GenOptions{Store: Store{Kind: st.store}, Steps: 15, Version: 1})
			}
		}
	})
}

// forEachSetting runs test once per store and server setting (those the
// -model.store flag allows), each with an environment of its own.
func forEachSetting(t *testing.T, test func(t *testing.T, st setting, env *Env)) {
	for _, st := range settings() {
		if *flagStore != "" && st.store != *flagStore {
			continue
		}
		t.Run(strings.TrimSpace(st.store+" "+st.name), func(t *testing.T) {
			env := newEnv(t)
			st.open(t)(env)
			test(t, st, env)
		})
	}
}

// run generates and runs one trial, and fails the test with what went
// wrong.
func run(t *testing.T, env *Env, st setting, seed uint64, o GenOptions) {
	tr := Generate(seed, o)
	tr.Setting = st.name
	stats.trial(tr)
	an := env.Run(tr)
	an = slices.DeleteFunc(an, func(a Anomaly) bool {
		issue, known := knownFailing[a.Kind]
		if known {
			t.Logf("seed %d: a rule not kept yet (%s): %s", seed, issue, a)
		}
		return known
	})
	if len(an) > 0 {
		reportFailure(t, env, tr, an)
	}
}

// reportFailure shrinks a failing trial and fails the test with its seed,
// the smallest trial that still fails, and its anomalies.
func reportFailure(t *testing.T, env *Env, tr *Trial, an []Anomaly) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d (%s %s, version %d): %d anomalies; replay with -model.store %s -model.base %d -model.seed %d -model.trials %d\n",
		tr.Seed, tr.Store, tr.Setting, tr.Version, len(an), tr.Store, *flagBase, tr.Seed, *flagTrials)
	lines := summarize(an)
	if testing.Verbose() {
		lines = lines[:0]
		for _, a := range an {
			lines = append(lines, a.String())
		}
	}
	for _, a := range lines {
		fmt.Fprintf(&b, "  %s\n", a)
	}
	// The smallest trial that still fails, for each kind of anomaly.
	seen := map[string]bool{}
	for _, a := range an {
		if seen[a.Kind] || len(seen) == *flagShrinkKinds {
			continue
		}
		seen[a.Kind] = true
		small, smallAn := Shrink(env, tr, []Anomaly{a}, *flagShrinkRuns)
		fmt.Fprintf(&b, "smallest trial still failing with %s (%d of %d steps):\n%s", a.Kind, len(small.Steps), len(tr.Steps), indent(small.Describe()))
		for _, sa := range smallAn {
			if sa.Kind == a.Kind {
				fmt.Fprintf(&b, "    => %s\n", sa)
				break
			}
		}
	}
	t.Error(b.String())
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ") + "\n"
}

// summarize keeps the first anomaly of each kind, and counts.
func summarize(an []Anomaly) []string {
	count := map[string]int{}
	var out []string
	for _, a := range an {
		count[a.Kind]++
		if count[a.Kind] == 1 {
			out = append(out, a.String())
		}
	}
	for i, s := range out {
		kind := strings.SplitN(strings.SplitN(s, ": ", 2)[1], ":", 2)[0]
		if n := count[kind]; n > 1 {
			out[i] = fmt.Sprintf("%s (and %d more %s)", s, n-1, kind)
		}
	}
	return out
}
