package main

// The PostgreSQL failover soak (go run ./soak -failover postgres, make
// soak-failover): a private primary with a streaming standby, real Caddy
// instances whose DSN names both hosts with
// target_session_attrs=read-write, and retrying clients. Under load the
// primary is killed (SIGKILL, its backends with it) and the standby
// promoted; the old primary's address then gets a fresh standby of the
// new primary (pg_basebackup), and the next promotion goes the other way.
// Each standby streams through a proxy with latency (-pg-lag), cut when
// the primary is killed: a primary host that dies takes the WAL still on
// its way with it. With -pg-cut the link is cut that long before the
// kill (a standby cut off, then the primary lost): the commits of that
// time wait for the standby until the store's timeout cancels their wait,
// which PostgreSQL answers with a warning and a local commit.
// Each mode runs -pg-promotions promotions: async (no synchronous
// standby), and sync (synchronous_standby_names '*', synchronous_commit
// on) or remote_apply. Every intent is sent until it gets a final answer
// and then sent again (a client that lost the answer): each must be a
// replay. The checker counts the keys the upstream executed more than
// once, names each, and puts it on the promotion before it.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/servers"
)

// pgFailover are the flags of the PostgreSQL failover soak.
var pgFailover struct {
	modes      string
	promotions int
	workers    int
	load       time.Duration
	lag        time.Duration
	cut        time.Duration
}

// failoverTargets is what -failover runs (postgres).
var failoverTargets string

func init() {
	flag.StringVar(&failoverTargets, "failover", "", "run the failover soak instead: postgres (a primary and a streaming standby, promoted under load)")
	flag.StringVar(&pgFailover.modes, "pg-modes", "async,sync", "failover modes, separated by commas: async (no synchronous standby), sync (synchronous_commit on), remote_write, remote_apply")
	flag.IntVar(&pgFailover.promotions, "pg-promotions", 10, "promotions of each failover mode")
	flag.IntVar(&pgFailover.workers, "pg-workers", 24, "client workers of the failover soak, each with one intent at a time")
	flag.DurationVar(&pgFailover.load, "pg-load", 3*time.Second, "load before each promotion, and after it")
	flag.DurationVar(&pgFailover.lag, "pg-lag", 10*time.Millisecond, "one-way latency of the replication link (a standby in another zone); the link is cut when its primary is killed, so that WAL on the wire is lost with it")
	flag.DurationVar(&pgFailover.cut, "pg-cut", 0, "cut the replication link this long before each kill -9 of the primary (0: as it is killed): a synchronous primary's commits wait for the standby meanwhile, and the store's timeout cancels those waits")
}

// pgMode is a replication setting the promotions run under.
type pgMode struct {
	name   string
	names  string // synchronous_standby_names
	commit string // synchronous_commit
}

var pgModes = map[string]pgMode{
	"async":        {"async", "", "on"},
	"sync":         {"sync", "*", "on"},
	"remote_write": {"remote_write", "*", "remote_write"},
	"remote_apply": {"remote_apply", "*", "remote_apply"},
}

// promotion is one failover: when the primary was killed, which one, and
// when the standby took writes.
type promotion struct {
	n              int
	killed, ready  time.Time
	down           time.Time // when the killed server's processes were all gone
	from, to       string
	duplicates     []string // named
	duplicateCount int
}

// pgExecutions collects when the upstream executed each key.
type pgExecutions struct {
	mu    sync.Mutex
	byKey map[string][]time.Time
}

func (e *pgExecutions) add(x caddyproc.Execution) {
	key := x.Header.Get("Idempotency-Key")
	e.mu.Lock()
	e.byKey[key] = append(e.byKey[key], x.Start)
	e.mu.Unlock()
}

// pgClientStats counts what the clients saw.
type pgClientStats struct {
	mu                                   sync.Mutex
	intents, replays, retries, unsettled int
	statuses                             map[int]int
}

func runFailover(o options) int {
	if failoverTargets != "postgres" {
		logf("-failover: %q: this soak has postgres", failoverTargets)
		return exitFailed
	}
	bin, cleanup, err := caddyBinary()
	if err != nil {
		logf("%v", err)
		return exitFailed
	}
	defer cleanup()
	var modes []pgMode
	for _, m := range strings.Split(pgFailover.modes, ",") {
		mode, ok := pgModes[strings.TrimSpace(m)]
		if !ok {
			logf("-pg-modes: unknown mode %q", m)
			return exitFailed
		}
		modes = append(modes, mode)
	}
	status := exitClean
	var summary []string
	for _, m := range modes {
		proms, err := pgFailoverMode(bin, m, o.verbose)
		if err != nil {
			logf("%s: %v", m.name, err)
			return exitFailed
		}
		total := 0
		per := make([]string, len(proms))
		for i, p := range proms {
			total += p.duplicateCount
			per[i] = strconv.Itoa(p.duplicateCount)
		}
		line := fmt.Sprintf("%s: %d duplicate executions over %d promotions (per promotion: %s)", m.name, total, len(proms), strings.Join(per, " "))
		summary = append(summary, line)
		if m.names != "" && total > 0 {
			status = exitAnomalies // a synchronous standby promises none
		}
	}
	for _, l := range summary {
		fmt.Println("soak failover postgres " + l)
	}
	return status
}

// pgFailoverMode runs the promotions of one mode on servers of its own.
func pgFailoverMode(bin string, m pgMode, verbose bool) ([]*promotion, error) {
	bins, err := servers.Find(false, true, logf)
	if err != nil {
		return nil, err
	}
	as, err := servers.ServerAccount()
	if err != nil {
		return nil, err
	}
	set, err := servers.NewSet("idempotency-soak-failover-pg-", logf)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := set.Close(); err != nil {
			logf("cleaning up: %v", err)
		}
	}()
	a, err := set.StartPostgres(bins, as)
	if err != nil {
		return nil, err
	}
	// A standby whose primary died retries its WAL source every
	// wal_retrieve_retry_interval, and takes a promotion only between
	// tries: 5s by default, which would only lengthen every outage. A
	// base backup carries the setting to every standby made later.
	if err := a.AlterSystem("wal_retrieve_retry_interval", "500ms"); err != nil {
		return nil, err
	}
	// link[x] carries the replication stream from x to its standby.
	link := map[*servers.Postgres]*caddyproc.Proxy{}
	defer func() {
		for _, l := range link {
			l.Close()
		}
	}()
	if link[a], err = caddyproc.NewProxy(a.Addr); err != nil {
		return nil, err
	}
	link[a].SetLatency(pgFailover.lag, 0)
	b, err := set.StartStandby(a, link[a].Addr)
	if err != nil {
		return nil, err
	}
	if link[b], err = caddyproc.NewProxy(b.Addr); err != nil {
		return nil, err
	}
	link[b].SetLatency(pgFailover.lag, 0)
	primary, standby := a, b
	if err := protect(primary, m); err != nil {
		return nil, err
	}
	logf("%s: PostgreSQL %s primary %s, standby %s streaming with %v one-way latency, cut %v before each kill (synchronous_standby_names %q, synchronous_commit %s); %d client workers; files in %s",
		m.name, a.Version, a.Addr, b.Addr, pgFailover.lag, pgFailover.cut, m.names, m.commit, pgFailover.workers, set.Dir)

	execs := &pgExecutions{byKey: map[string][]time.Time{}}
	up, err := caddyproc.NewUpstreamWith(caddyproc.UpstreamOptions{OnExecution: execs.add})
	if err != nil {
		return nil, err
	}
	defer up.Close()
	dsn := fmt.Sprintf("postgres://postgres@%s,%s/test?sslmode=disable&target_session_attrs=read-write", a.Addr, b.Addr)
	var insts []*caddyproc.Instance
	defer func() {
		for _, i := range insts {
			i.Stop()
		}
	}()
	for i := range 2 {
		port, err := caddyproc.FreePort()
		if err != nil {
			return nil, err
		}
		inst, err := caddyproc.Start(bin, filepath.Join(set.Dir, "caddy"), fmt.Sprintf("%s-%c", m.name, 'a'+i), port, pgFailoverConfig(port, dsn, up.Addr))
		if err != nil {
			return nil, err
		}
		insts = append(insts, inst)
	}

	ctx, stop := context.WithCancel(context.Background())
	stats := &pgClientStats{statuses: map[int]int{}}
	var wg sync.WaitGroup
	for w := range pgFailover.workers {
		wg.Go(func() { pgWorker(ctx, m.name, w, insts, stats) })
	}
	start := time.Now()
	var proms []*promotion
	fail := func(err error) ([]*promotion, error) { stop(); wg.Wait(); return nil, err }
	for n := 1; n <= pgFailover.promotions; n++ {
		time.Sleep(pgFailover.load)
		link[primary].Cut()
		time.Sleep(pgFailover.cut)
		p := &promotion{n: n, from: primary.Addr, to: standby.Addr, killed: time.Now()}
		primary.Kill()
		p.down = time.Now()
		if err := standby.Promote(); err != nil {
			return fail(err)
		}
		if err := link[primary].Restore(); err != nil {
			return fail(err)
		}
		p.ready = time.Now()
		proms = append(proms, p)
		primary, standby = standby, primary
		// No standby until the old primary is rebuilt: commits must not
		// wait for one meanwhile (no promotion happens in between).
		if err := primary.AlterSystem("synchronous_standby_names", ""); err != nil {
			return fail(err)
		}
		time.Sleep(pgFailover.load)
		if err := standby.Rebase(primary, link[primary].Addr); err != nil {
			return fail(err)
		}
		if err := primary.WaitStreaming(1, time.Minute); err != nil {
			return fail(err)
		}
		if err := protect(primary, m); err != nil {
			return fail(err)
		}
		if verbose {
			logf("%s: promotion %d: %s killed (its processes gone after %v), %s promoted in %v", m.name, n, p.from, p.down.Sub(p.killed).Round(time.Millisecond), p.to, p.ready.Sub(p.down).Round(time.Millisecond))
		}
	}
	time.Sleep(pgFailover.load)
	stop()
	wg.Wait()

	executions := map[string][]time.Time{}
	execs.mu.Lock()
	for k, v := range execs.byKey {
		executions[k] = slices.Clone(v)
	}
	execs.mu.Unlock()
	before := attribute(executions, proms, start)
	stats.mu.Lock()
	logf("%s: %d intents, %d answered again by a replay, %d retries, %d never settled; statuses %v", m.name, stats.intents, stats.replays, stats.retries, stats.unsettled, stats.statuses)
	stats.mu.Unlock()
	for _, p := range proms {
		logf("%s: promotion %d (%s killed at +%.1fs, %s took writes %v later): %d duplicate executions",
			m.name, p.n, p.from, p.killed.Sub(start).Seconds(), p.to, p.ready.Sub(p.killed).Round(time.Millisecond), p.duplicateCount)
		for _, d := range p.duplicates {
			logf("  %s", d)
		}
	}
	if len(before) > 0 {
		// Not a failover's: the promise is broken without one.
		return proms, fmt.Errorf("%d keys executed twice before any promotion: %s", len(before), strings.Join(before, "; "))
	}
	return proms, nil
}

// protect makes primary's commits wait for its standby as mode says.
func protect(primary *servers.Postgres, m pgMode) error {
	if err := primary.AlterSystem("synchronous_commit", m.commit); err != nil {
		return err
	}
	return primary.AlterSystem("synchronous_standby_names", m.names)
}

// attribute puts each key executed more than once on the last promotion
// that began before its second execution, names it there, and returns
// those with no promotion before them.
func attribute(executions map[string][]time.Time, proms []*promotion, start time.Time) (before []string) {
	keys := make([]string, 0, len(executions))
	for k := range executions {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		times := executions[k]
		if len(times) < 2 {
			continue
		}
		slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
		var at []string
		for _, t := range times {
			at = append(at, fmt.Sprintf("+%.3fs", t.Sub(start).Seconds()))
		}
		name := fmt.Sprintf("key %s executed %d times (at %s)", k, len(times), strings.Join(at, ", "))
		var owner *promotion
		for _, p := range proms {
			if !p.killed.After(times[1]) {
				owner = p
			}
		}
		if owner == nil {
			before = append(before, name)
			continue
		}
		owner.duplicates = append(owner.duplicates, name)
		owner.duplicateCount += len(times) - 1
	}
	return before
}

// pgFailoverConfig is an instance's Caddyfile: the idempotency handler on
// the multi-host DSN in front of the upstream, failing closed.
func pgFailoverConfig(port int, dsn, upstream string) caddyproc.Config {
	return caddyproc.Config{Sites: fmt.Sprintf(`http://:%d {
	bind 127.0.0.1
	idempotency {
		storage postgres {
			dsn "%s"
			table failover_keys
			timeout 2s
		}
		on_storage_error fail_closed
	}
	reverse_proxy %s
}
`, port, dsn, upstream)}
}

// pgWorker sends intents, one at a time, until ctx ends: each until it
// gets a final answer (201 new, or a replay), from a random instance,
// again after 503, 409 and broken connections; then once more after a
// pause, as a client that lost the answer does, which must be a replay.
func pgWorker(ctx context.Context, mode string, w int, insts []*caddyproc.Instance, stats *pgClientStats) {
	rng := rand.New(rand.NewPCG(uint64(w), uint64(len(mode))))
	client := &http.Client{Timeout: 10 * time.Second}
	for seq := 0; ctx.Err() == nil; seq++ {
		key := fmt.Sprintf("%s-%d-%d", mode, w, seq)
		stats.mu.Lock()
		stats.intents++
		stats.mu.Unlock()
		for round := range 2 {
			if round == 1 {
				time.Sleep(time.Duration(rng.IntN(1500)) * time.Millisecond)
			}
			// A client keeps retrying after the run's load stops, so that
			// every intent settles: bounded, so that a stuck one shows.
			settled := false
			for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
				inst := insts[rng.IntN(len(insts))]
				req, _ := http.NewRequest(http.MethodPost, inst.URL()+"/orders", strings.NewReader(`{"n":1}`))
				req.Header.Set("Idempotency-Key", key)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Upstream-Delay", strconv.Itoa(20+rng.IntN(180)))
				resp, err := client.Do(req)
				code := 0
				replayed := false
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					code, replayed = resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true"
				}
				stats.mu.Lock()
				stats.statuses[code]++
				if code == http.StatusCreated {
					if replayed && round == 1 {
						stats.replays++
					}
					stats.mu.Unlock()
					settled = true
					break
				}
				stats.retries++
				stats.mu.Unlock()
				time.Sleep(time.Duration(50+rng.IntN(150)) * time.Millisecond)
			}
			if !settled {
				stats.mu.Lock()
				stats.unsettled++
				stats.mu.Unlock()
				break
			}
		}
	}
}
