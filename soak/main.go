// Command soak is the chaos soak of `make soak`: real `caddy run`
// instances built from the checkout share a private, persistent Redis and
// a private PostgreSQL, each instance reaching each store through a TCP
// proxy of its own; a population of retrying clients sends intents to
// random instances; a nemesis on a seeded schedule kills, stops and
// reloads instances, restarts and kills the stores, and black-holes and
// cuts the links; the upstream logs every execution. Then the faults stop,
// a quiet period passes, and a sweep asks for every intent once more. The
// checker (internal/testkit/soak/history) judges the whole history and the run
// ends with the line "N anomalies"; its exit status is 1 when N > 0.
//
// Besides the steady clients, a run has production's scale and timing:
// scale waves (-scale: hundreds or thousands of long requests at once on
// each instance, each retried from another instance once it outlived
// lock_timeout), stores tens of milliseconds away (-store-latency, and
// the latency fault), a PostgreSQL row locked by an outside transaction
// while other keys arrive (the lock fault), clients over HTTP/2, h2c and
// HTTP/3 that read slowly, stop reading and resume, hang up, or read
// from an upstream that falls silent past the stall timeout
// (-slow-clients), waiter storms (-storms: a thousand retries of one key
// with 1 MiB bodies at once on its instance, while another client's retry
// there must still wait), and made-up credentials whose refusals fill a
// small memory store before real clients' new keys arrive (-fill).
//
//	go run ./soak [-seed N] [-duration 3m] [-instances 3] [-lock-timeout 3s]
//	              [-tolerance 0.75] [-clients 16] [-faults stall,cut,...] [-out dir] [-v]
//	              [-scale 300] [-scale-waves 1] [-scale-on postgres,redis]
//	              [-store-latency 30ms] [-store-jitter 10ms] [-slow-clients 4] [-fill 100]
//	              [-storms 1] [-storm-size 1000] [-storm-body 1048576]
//	go run ./soak -check dir/history.json
//
// The same seed draws the same fault schedule and the same workload
// (intents, behaviours, backoffs, instances); real processes decide the
// rest. Everything listens on loopback; every file lives in a temporary
// directory removed at the end, also on ^C (-out keeps the history, the
// report and Caddy's logs).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/soak/history"
)

type options struct {
	seed         int64
	duration     time.Duration
	instances    int
	lockTimeout  time.Duration
	tolerance    float64
	storeTimeout time.Duration
	clients      int
	every        time.Duration
	quiet        time.Duration
	faults       string
	out          string
	check        string
	verbose      bool
	scale        int
	scaleWaves   int
	scaleOn      string
	latency      time.Duration
	jitter       time.Duration
	slowClients  int
	fill         int
	storms       int
	stormSize    int
	stormBody    int
}

func main() {
	var o options
	flag.Int64Var(&o.seed, "seed", 0, "seed of the fault schedule and the workload (0: from the clock; printed)")
	flag.DurationVar(&o.duration, "duration", 3*time.Minute, "how long faults are injected and new intents issued")
	flag.IntVar(&o.instances, "instances", 3, "Caddy instances")
	flag.DurationVar(&o.lockTimeout, "lock-timeout", 3*time.Second, "lock_timeout of every route")
	flag.Float64Var(&o.tolerance, "tolerance", 0.75, "fraction of lock_timeout below which an outage or stall must never run a key twice")
	flag.DurationVar(&o.storeTimeout, "store-timeout", 2*time.Second, "timeout of the storage blocks")
	flag.IntVar(&o.clients, "clients", 16, "client workers, each with one intent at a time (sent by 1-3 senders)")
	flag.DurationVar(&o.every, "fault-every", 1200*time.Millisecond, "mean gap between faults")
	flag.DurationVar(&o.quiet, "quiet", 0, "quiet period between the last fault and the sweep (0: 4 x lock_timeout)")
	flag.StringVar(&o.faults, "faults", "all", "the faults to inject, separated by commas: stall, cut, pause, reload, kill, store-restart, store-kill, latency, lock (none: no fault)")
	flag.IntVar(&o.scale, "scale", 300, "long requests (2-3 x lock_timeout) each scale wave sends to each instance at once, each retried from another instance (0: no wave)")
	flag.IntVar(&o.scaleWaves, "scale-waves", 1, "scale waves, spread over -duration")
	flag.StringVar(&o.scaleOn, "scale-on", "postgres,redis", "the stores of the scale waves' routes, taken in turn")
	flag.DurationVar(&o.latency, "store-latency", 0, "one-way latency of every link to a store, all run long (a store a network hop away)")
	flag.DurationVar(&o.jitter, "store-jitter", 0, "random extra one-way latency of every link to a store, up to this")
	flag.IntVar(&o.slowClients, "slow-clients", 4, "workers of clients over HTTP/1.1, HTTP/2, h2c and HTTP/3 that read at 1-3 KB/s, stop reading for 12-25 s, hang up, or read from an upstream silent for 12-25 s")
	flag.IntVar(&o.storms, "storms", 1, "waiter storms, spread over -duration: one key's retries, all at once on its instance, while another client's retry there must still wait (0: none)")
	flag.IntVar(&o.stormSize, "storm-size", 1000, "retries of a waiter storm, sent within two lock_timeouts")
	flag.IntVar(&o.stormBody, "storm-body", 1<<20, "the request body of a waiter storm's key, in bytes")
	flag.IntVar(&o.fill, "fill", 100, "max_keys of each instance's memory store, which as many made-up credentials' refusals fill before real clients' new keys (0: no memory route)")
	flag.StringVar(&o.out, "out", "", "keep the history (history.json), the report and Caddy's logs in this directory")
	flag.StringVar(&o.check, "check", "", "only check a saved history.json and print its report")
	flag.BoolVar(&o.verbose, "v", false, "print the schedule and each fault as it ends")
	flag.Parse()
	os.Exit(run(o))
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "soak: "+format+"\n", args...)
}

// Exit statuses.
const (
	exitClean       = 0
	exitAnomalies   = 1
	exitFailed      = 2
	exitInterrupted = 130
)

func run(o options) int {
	if o.check != "" {
		return checkSaved(o.check)
	}
	if failoverTargets != "" {
		return runFailover(o)
	}
	if o.seed == 0 {
		o.seed = time.Now().UnixNano() % 1_000_000_000
	}
	if o.quiet == 0 {
		o.quiet = 4 * o.lockTimeout
	}
	kinds, err := parseKinds(o.faults)
	if err != nil {
		logf("-faults: %v", err)
		return exitFailed
	}
	var scaleOn []route
	for _, s := range strings.Split(o.scaleOn, ",") {
		switch strings.TrimSpace(s) {
		case history.Redis:
			scaleOn = append(scaleOn, routeAt("/redis/"))
		case history.Postgres:
			scaleOn = append(scaleOn, routeAt("/postgres/"))
		default:
			logf("-scale-on: %q is neither redis nor postgres", s)
			return exitFailed
		}
	}
	if o.instances < 2 || o.instances > 26 || o.clients < 1 || o.lockTimeout < time.Second {
		logf("need 2-26 instances, a client and a lock_timeout of at least 1s")
		return exitFailed
	}
	fmt.Printf("soak: seed %d (replay: make soak SOAK_FLAGS='-seed %d%s')\n", o.seed, o.seed, replayFlags(o))

	// A scale wave holds three connections a request in this process
	// (client, retry, upstream) and three in Caddy.
	if want := uint64(3*o.scale*o.instances + 2048); want > 0 {
		if got, err := raiseOpenFiles(want); err != nil {
			logf("raising the limit of open files to %d: %v (it is %d)", want, err, got)
		}
	}

	// ^C or SIGTERM ends the run early; everything is still cleaned up.
	interrupted, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	bin, cleanup, err := caddyBinary()
	if err != nil {
		logf("%v", err)
		return exitFailed
	}
	defer cleanup()

	params := history.Params{Seed: o.seed, LockTimeout: o.lockTimeout, Tolerance: o.tolerance,
		StoreTimeout: o.storeTimeout, RedisReconnect: time.Second,
		StoreLatency: o.latency, StoreJitter: o.jitter, MemoryMaxKeys: o.fill}
	rec := newRecorder(params)
	site := siteSettings{lockTimeout: o.lockTimeout, storeTimeout: o.storeTimeout, memoryMaxKeys: o.fill}
	c, err := startCluster(bin, o.instances, site, o.latency, o.jitter, rec, logf)
	if err != nil {
		logf("starting the cluster: %v", err)
		return exitFailed
	}
	closed := false
	closeCluster := func() {
		if !closed {
			closed = true
			if err := c.close(); err != nil {
				logf("cleaning up: %v", err)
			}
		}
	}
	defer closeCluster()
	rec.start = time.Now() // the schedule counts from here

	names := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		names[i] = n.name
	}
	var quiet []window
	if o.scale > 0 {
		for w := range o.scaleWaves {
			quiet = append(quiet, waveQuiet(o.duration, w, o.scaleWaves, o.lockTimeout))
		}
	}
	if o.stormSize > 0 {
		for s := range o.storms {
			quiet = append(quiet, stormQuiet(o.duration, s, o.storms, o.lockTimeout))
		}
	}
	schedule := plan(scheduleOptions{seed: o.seed, length: o.duration, every: o.every, instances: names,
		lockTimeout: o.lockTimeout, storeTimeout: o.storeTimeout, kinds: kinds, quiet: quiet})
	logf("%d instances, lock_timeout %s, tolerance %.2f, %d client workers, %d faults over %s",
		len(c.nodes), o.lockTimeout, o.tolerance, o.clients, len(schedule), o.duration)
	logf("%d slow clients, %d scale wave(s) of %d requests per instance, %d waiter storm(s) of %d retries with %d-byte bodies, memory stores of %d filled by made-up credentials, store links %s + %s away",
		o.slowClients, o.scaleWaves*min(o.scale, 1), o.scale, o.storms*min(o.stormSize, 1), o.stormSize, o.stormBody, o.fill, o.latency, o.jitter)
	if o.verbose {
		for _, p := range schedule {
			logf("planned %s", p)
		}
	}

	cl := newClients(o.seed, o.lockTimeout, c.nodes, c.cert, rec)
	nm := &nemesis{c: c, cl: cl, rec: rec, logf: logf, verbose: o.verbose}
	watching, stopWatching := context.WithCancel(interrupted)
	go nm.watch(watching)
	go progress(watching, rec)

	// Chaos: faults and new intents for the duration.
	issuing, stopIssuing := context.WithTimeout(interrupted, o.duration)
	defer stopIssuing()
	var workers sync.WaitGroup
	spawn := func(f func()) {
		workers.Add(1)
		go func() { defer workers.Done(); f() }()
	}
	for w := range o.clients {
		spawn(func() { cl.work(issuing, interrupted, w) })
	}
	for w := range o.slowClients {
		spawn(func() { cl.slowWork(issuing, interrupted, w, o.slowClients) })
	}
	if o.scale > 0 && o.scaleWaves > 0 {
		spawn(func() { cl.scaleWaves(issuing, interrupted, rec.start, o.duration, o.scaleWaves, o.scale, scaleOn) })
	}
	if o.fill > 0 {
		spawn(func() { cl.fillAt(issuing, interrupted, rec.start, o.duration, o.fill) })
	}
	if o.storms > 0 && o.stormSize > 0 {
		spawn(func() {
			cl.storms(issuing, interrupted, rec.start, o.duration, o.storms, o.stormSize, o.stormBody, []route{routeAt("/postgres/"), routeAt("/redis/")})
		})
	}
	nm.run(issuing, interrupted, schedule)
	rec.mark(func(h *history.History) { h.NemesisEnd = rec.now() })
	logf("faults stopped at %.1fs; waiting for the clients' last intents", rec.now().Seconds())
	workers.Wait()
	cl.extra.Wait()

	// Quiet, then the sweep: every intent must get its final answer.
	sleep(interrupted, o.quiet)
	if interrupted.Err() == nil {
		rec.mark(func(h *history.History) { h.SweepStart = rec.now() })
		logf("quiet for %s; sweeping every intent at %.1fs", o.quiet, rec.now().Seconds())
		cl.sweep(interrupted, 6)
	}
	stopWatching()
	for _, n := range c.nodes {
		for _, p := range n.panics() {
			rec.crash(history.Crash{Instance: n.name, At: rec.now(), What: p})
		}
	}
	if o.out != "" {
		if err := errors.Join(os.MkdirAll(o.out, 0o755), c.saveLogs(o.out)); err != nil {
			logf("saving Caddy's logs: %v", err)
		}
	}
	closeCluster()

	h := rec.snapshot()
	if interrupted.Err() != nil {
		h.SweepStart = 0 // no liveness verdict on an interrupted run
	}
	code := report(h, o.out)
	if interrupted.Err() != nil {
		logf("interrupted: the history above is partial")
		return exitInterrupted
	}
	return code
}

// report checks h, prints the report (and saves it with the history in
// out), and returns the exit status.
func report(h *history.History, out string) int {
	r := history.Check(h)
	r.Write(os.Stdout, h)
	if out != "" {
		err := errors.Join(os.MkdirAll(out, 0o755), h.Save(filepath.Join(out, "history.json")))
		if f, ferr := os.Create(filepath.Join(out, "report.txt")); ferr == nil {
			r.Write(f, h)
			err = errors.Join(err, f.Close())
		}
		if err != nil {
			logf("saving the history: %v", err)
		}
	}
	if len(r.Anomalies) > 0 {
		return exitAnomalies
	}
	return exitClean
}

// checkSaved checks a history saved with -out.
func checkSaved(path string) int {
	f, err := os.Open(path)
	if err != nil {
		logf("%v", err)
		return exitFailed
	}
	defer f.Close()
	h, err := history.Load(f)
	if err != nil {
		logf("%s: %v", path, err)
		return exitFailed
	}
	return report(h, "")
}

// replayFlags are the flags besides the seed that shape a run, for the
// replay line.
func replayFlags(o options) string {
	s := ""
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, name := range []string{"duration", "instances", "lock-timeout", "tolerance", "store-timeout", "clients", "fault-every", "quiet", "faults",
		"scale", "scale-waves", "scale-on", "store-latency", "store-jitter", "slow-clients", "fill", "storms", "storm-size", "storm-body"} {
		if set[name] {
			s += fmt.Sprintf(" -%s %s", name, flag.Lookup(name).Value)
		}
	}
	return s
}

// progress prints a line every 15 seconds.
func progress(ctx context.Context, rec *recorder) {
	t := time.NewTicker(15 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			in, at, ex, f := rec.counts()
			logf("%5.0fs: %d intents, %d attempts, %d executions, %d faults", rec.now().Seconds(), in, at, ex, f)
		}
	}
}

// lastLines is the end of a log.
func lastLines(s string, n int) string {
	for i, count := len(s)-1, 0; i >= 0; i-- {
		if s[i] == '\n' {
			if count++; count > n {
				return s[i+1:]
			}
		}
	}
	return s
}

// caddyBinary is the caddy the soak runs: the xcaddy-built one make soak
// names, or else one go build makes into a directory that cleanup
// removes.
func caddyBinary() (bin string, cleanup func(), err error) {
	dir, cleanup := "", func() {}
	if os.Getenv(caddyproc.EnvBinary) == "" {
		if dir, err = os.MkdirTemp("", "caddy-soak-build-"); err != nil {
			return "", cleanup, err
		}
		cleanup = func() { os.RemoveAll(dir) }
	}
	if bin, err = caddyproc.Build(dir); err != nil {
		cleanup()
		return "", func() {}, fmt.Errorf("building caddy: %w", err)
	}
	return bin, cleanup, nil
}
