// Command failover is the soak's failover faults for Redis (make
// soak-failover): a private replicated Redis, Sentinel (a primary, a
// replica, three Sentinels) or Cluster (three primaries, each with a
// replica), two real Caddy instances sharing it, and retrying clients,
// while the primary is killed with SIGKILL (and, on Cluster, handed over
// with CLUSTER FAILOVER) again and again under load. Each key is sent
// until answered, then again, as by a client that lost the answer, and
// once more in a sweep at the end: the upstream must run each once. The
// checker counts the keys it ran more than once, per failover, and names
// each. With -durability the storage waits for one replica
// (durability replicas 1); the run fails on any duplicate.
//
//	go run ./soak/failover -topology sentinel -durability -failovers 20
//	go run ./soak/failover -topology cluster -failovers 10
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
)

func main() {
	var (
		topo        = flag.String("topology", "sentinel", "sentinel or cluster")
		durable     = flag.Bool("durability", false, "durability replicas 1 on the storage")
		failovers   = flag.Int("failovers", 20, "how many failovers to force")
		clients     = flag.Int("clients", 16, "client workers")
		loadFor     = flag.Duration("load", 2*time.Second, "load between a failover healed and the next")
		seed        = flag.Uint64("seed", 0, "the seed of the failovers' and clients' draws (0: a new one)")
		bin         = flag.String("caddy", "bin/caddy", "the Caddy binary, built with this module (make build)")
		out         = flag.String("out", "", "also write the report to this file")
		wantNoDups  = flag.Bool("strict", false, "fail on any duplicate even without -durability")
		lockTimeout = flag.Duration("lock-timeout", 30*time.Second, "the handlers' lock_timeout: a failover longer than it lets a lease lapse")
		lag         = flag.Duration("lag", 0, "cut the primary's replica links this long before each kill -9 (the writes of that time are on the primary only)")
	)
	flag.Parse()
	if *seed == 0 {
		*seed = rand.Uint64()
	}
	var w io.Writer = os.Stdout
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		defer f.Close()
		w = io.MultiWriter(os.Stdout, f)
	}
	dups, err := run(w, *topo, *durable, *failovers, *clients, *loadFor, *lag, *lockTimeout, *seed, *bin)
	if err != nil {
		fmt.Fprintln(w, "soak-failover:", err)
		os.Exit(2)
	}
	if dups > 0 && (*durable || *wantNoDups) {
		os.Exit(1)
	}
}

func run(w io.Writer, topo string, durable bool, n, clients int, loadFor, lag, lockTimeout time.Duration, seed uint64, bin string) (int, error) {
	redisBin, err := exec.LookPath("redis-server")
	if err != nil {
		return 0, err
	}
	if _, err := os.Stat(bin); err != nil {
		return 0, fmt.Errorf("%s: %v (make build)", bin, err)
	}
	root, err := os.MkdirTemp("", "idempotency-soak-failover-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(root)
	var t topology
	switch topo {
	case "sentinel":
		t, err = startSentinel(redisBin, root)
	case "cluster":
		t, err = startCluster(redisBin, root)
	default:
		return 0, fmt.Errorf("-topology %q: want sentinel or cluster", topo)
	}
	if err != nil {
		return 0, err
	}
	defer t.close()
	// ^C stops everything, leaving nothing behind.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() { <-sig; t.close(); os.RemoveAll(root); os.Exit(130) }()

	extra := ""
	if durable {
		extra = "\t\t\tdurability replicas 1 500ms"
	}
	fmt.Fprintf(w, "soak-failover: seed %d, %s, durability %v, %d failovers, replica lag %v, lock_timeout %v, %d clients\n", seed, t.describe(), durable, n, lag, lockTimeout, clients)
	execs := &executions{byKey: make(map[string][]time.Time)}
	var l *load
	up, err := caddyproc.NewUpstreamWith(caddyproc.UpstreamOptions{OnExecution: func(x caddyproc.Execution) {
		execs.add(x)
		l.executions.Add(1)
	}})
	if err != nil {
		return 0, err
	}
	defer up.Close()
	var insts []*caddyproc.Instance
	defer func() {
		for _, i := range insts {
			i.Stop()
		}
	}()
	for _, name := range []string{"a", "b"} {
		port, err := caddyproc.FreePort()
		if err != nil {
			return 0, err
		}
		cfg := caddyproc.Config{Globals: "\tmetrics", Sites: fmt.Sprintf(`http://:%d {
	bind 127.0.0.1
	handle /soak/* {
		idempotency {
		%s
			lock_timeout %s
		}
		reverse_proxy %s
	}
}
`, port, t.storage(extra), lockTimeout, up.Addr)}
		dir := filepath.Join(root, "caddy-"+name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return 0, err
		}
		inst, err := caddyproc.Start(bin, dir, name, port, cfg)
		if err != nil {
			return 0, err
		}
		insts = append(insts, inst)
	}
	urls := []string{insts[0].URL(), insts[1].URL()}
	l = newLoad(urls)
	start := time.Now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() { l.worker(i, seed, stop) })
	}
	r := rand.New(rand.NewPCG(seed, 0))
	var fs []failover
	for i := 1; i <= n; i++ {
		time.Sleep(loadFor)
		f, err := t.fail(i, r, lag)
		fs = append(fs, f)
		if err != nil {
			close(stop)
			return 0, fmt.Errorf("%s: %v", f, err)
		}
		fmt.Fprintf(w, "%s at %.1fs: promoted in %.1fs, healed in %.1fs\n", f, f.At.Sub(start).Seconds(),
			f.Promoted.Sub(f.At).Seconds(), f.Healed.Sub(f.At).Seconds())
	}
	time.Sleep(loadFor)
	close(stop)
	wg.Wait()
	// Leases of requests cut off by the last failover lapse, the
	// background completions land; then every key is asked for again.
	time.Sleep(lockTimeout + 2*time.Second)
	l.sweep(seed, clients)
	dups := check(execs, fs)
	report(w, start, fs, l, dups, durabilityTimeouts(insts))
	if os.Getenv("SOAK_FAILOVER_LOG") != "" {
		for _, inst := range insts {
			os.WriteFile(os.Getenv("SOAK_FAILOVER_LOG")+"."+inst.Name, []byte(inst.Log()), 0o600)
		}
	}
	return len(dups), nil
}

// durabilityTimeouts sums caddy_http_idempotency_store_durability_timeouts_total
// per op over the instances.
func durabilityTimeouts(insts []*caddyproc.Instance) string {
	sums := map[string]float64{}
	for _, inst := range insts {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		body, err := adminGet(ctx, inst.AdminAddr, "/metrics")
		cancel()
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(body, "\n") {
			if !strings.HasPrefix(line, "caddy_http_idempotency_store_durability_timeouts_total{") {
				continue
			}
			var v float64
			fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
			op := "?"
			if i := strings.Index(line, `op="`); i >= 0 {
				op, _, _ = strings.Cut(line[i+4:], `"`)
			}
			sums[op] += v
		}
	}
	return fmt.Sprintf("reserve %.0f, complete %.0f", sums["reserve"], sums["complete"])
}
