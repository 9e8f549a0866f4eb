// Command bench is the load benchmark of `make bench`. It builds Caddy
// from the checkout and runs one Caddy process that serves every case on
// a port of its own: plain reverse_proxy (the ceiling of any request that
// runs the upstream), Caddy's static respond (the ceiling of any answer
// that runs nothing), and the idempotency handler on each store with new
// keys (reserve, proxy, record) and with repeated keys (replays). wrk
// drives the load, so that the load generator takes little of the CPU.
//
// Each round runs every case once, one after the other; ratios are taken
// within a round, and the report gives their median over the rounds, the
// Caddy process's CPU time per request (from /proc/<pid>/stat over the
// measured window: the figure that travels across machines), and the
// store round trips per request of every round (Redis INFO commandstats,
// PostgreSQL pg_stat_database.xact_commit). It also measures the memory
// store's heap per record and garbage-collection pause at a million
// records.
//
// Then it measures latency at fixed open-loop rates (half and a quarter
// of plain's throughput; latency.go), and each of Redis and PostgreSQL with ten
// million live records against the same store empty, with PostgreSQL's
// cleanup of a million expired rows while it serves (scale.go).
//
// Before those, it runs the Go benchmarks of the handler (gobench.go:
// ns and allocations per request through ServeHTTP), and it measures
// lease renewal (renewals.go): the round trips per second as the number
// of long requests holding leases grows, and new keys' throughput while
// they are held. -only runs some of the parts (go, renewals, load).
//
//	go run ./bench [-rounds 5] [-duration 4s] [-conns 32] [-body 86]
//	               [-stores memory,redis,postgres] [-write docs/performance.md]
//	               [-profile dir] [-rates 0.5,0.25] [-live 10000000] [-expired 1000000]
//	               [-only go,renewals,load] [-leases 1,100,10000] [-renewal-window 15s]
//
// Redis and PostgreSQL are those of the tests (IDEMPOTENCY_REDIS_URL or
// IDEMPOTENCY_REDIS_ADDR, IDEMPOTENCY_POSTGRES_DSN; `make bench` starts
// private ones, see internal/testkit/cmd/testservers).
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

type options struct {
	rounds   int
	duration time.Duration
	warmup   time.Duration
	conns    int
	threads  int
	bodySize int
	stores   []string
	records  int
	write    string
	profile  string // a directory for CPU profiles of the last round
	// pgMaxConns is the PostgreSQL store's max_conns (0: its default).
	pgMaxConns int

	// The open-loop latency runs (latency.go).
	rates           []float64 // fractions of plain's median throughput
	latencyRounds   int
	latencyDuration time.Duration
	openConns       int // the open-loop generator's connections at most

	// The runs with live records (scale.go).
	live        int // records put in Redis and PostgreSQL; 0 skips
	expired     int // expired rows the PostgreSQL cleanup run deletes
	scaleRounds int

	// only lists the parts to run: load, renewals, go (all when empty).
	only []string

	// The renewal runs (renewals.go).
	leases        []int
	renewalWindow time.Duration

	// The Go benchmarks (gobench.go).
	goCount     int
	goBenchtime string
}

// parts are the parts of the benchmark, in the order they run: the Go
// benchmarks first, while the machine is quiet.
var parts = []string{"go", "renewals", "load"}

// runs says whether part is to run.
func (o options) runs(part string) bool {
	return len(o.only) == 0 || slices.Contains(o.only, part)
}

func main() {
	var o options
	var stores string
	flag.IntVar(&o.rounds, "rounds", 5, "rounds; each runs every case once (0: only the memory store's heap)")
	flag.DurationVar(&o.duration, "duration", 4*time.Second, "length of each run")
	flag.DurationVar(&o.warmup, "warmup", 2*time.Second, "unmeasured load of each case before the first round")
	flag.IntVar(&o.conns, "conns", 32, "keep-alive connections")
	flag.IntVar(&o.threads, "threads", 2, "wrk threads")
	flag.IntVar(&o.bodySize, "body", 86, "request body size in bytes (JSON)")
	flag.StringVar(&stores, "stores", "memory,redis,postgres,redis+cache,postgres+cache", "stores to measure (+cache: with a replay cache)")
	flag.IntVar(&o.records, "records", 1_000_000, "records for the memory store's heap measurement (0: skip it)")
	flag.IntVar(&o.pgMaxConns, "pg-max-conns", 0, "the PostgreSQL store's max_conns (0: the module's default)")
	flag.StringVar(&o.profile, "profile", "", "write a CPU profile of Caddy for every case of the last round into this directory")
	rates := flag.String("rates", "0.5,0.25", "open-loop rates of the latency runs, as fractions of plain's median throughput; the last is that of the runs against a full store")
	flag.IntVar(&o.latencyRounds, "latency-rounds", 3, "rounds of open-loop latency runs (0: skip them)")
	flag.DurationVar(&o.latencyDuration, "latency-duration", 5*time.Second, "length of each open-loop run")
	flag.IntVar(&o.openConns, "open-conns", 256, "connections of the open-loop generator at most")
	flag.IntVar(&o.live, "live", 10_000_000, "live records put in Redis and PostgreSQL for the runs against a full store (0: skip them)")
	flag.IntVar(&o.expired, "expired", 1_000_000, "expired PostgreSQL rows for the cleanup run")
	flag.IntVar(&o.scaleRounds, "scale-rounds", 3, "rounds of the runs against a full store")
	only := flag.String("only", "", "run only these parts, comma-separated: go (the Go benchmarks of the handler), renewals (lease renewal as leases grow), load (the rest); all when empty")
	leases := flag.String("leases", "1,100,10000", "numbers of leases held in the renewal runs; new keys' throughput is measured while the last and largest is held")
	flag.DurationVar(&o.renewalWindow, "renewal-window", 15*time.Second, "how long renewals are counted in each renewal run")
	flag.IntVar(&o.goCount, "go-count", 5, "runs of each Go benchmark (the report gives the median)")
	flag.StringVar(&o.goBenchtime, "go-benchtime", "1s", "-benchtime of each Go benchmark run")
	flag.StringVar(&o.write, "write", "", "also write the results into this Markdown file, between its bench markers")
	flag.Parse()
	o.stores = strings.Split(stores, ",")
	if *only != "" {
		for _, p := range strings.Split(*only, ",") {
			if !slices.Contains(parts, p) {
				fmt.Fprintf(os.Stderr, "bench: -only: %q is not one of %s\n", p, strings.Join(parts, ", "))
				os.Exit(2)
			}
			o.only = append(o.only, p)
		}
	}
	for _, l := range strings.Split(*leases, ",") {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "bench: -leases: %q is not a positive number\n", l)
			os.Exit(2)
		}
		o.leases = append(o.leases, n)
	}
	for _, r := range strings.Split(*rates, ",") {
		f, err := strconv.ParseFloat(r, 64)
		if err != nil || f <= 0 || f > 1 {
			fmt.Fprintf(os.Stderr, "bench: -rates: %q is not a fraction in (0, 1]\n", r)
			os.Exit(2)
		}
		o.rates = append(o.rates, f)
	}

	// The benchmark sends nothing off the machine, not even a name lookup.
	testutil.GuardLookups()
	defer func() {
		if names := testutil.LookedUp(); len(names) > 0 {
			fmt.Fprintf(os.Stderr, "bench: looked up names other than localhost: %q\n", names)
			os.Exit(1)
		}
	}()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
