// Command bench is the load benchmark of `make bench`: it builds Caddy from
// the checkout, runs it in front of a counting upstream, and drives
// closed-loop load over keep-alive connections against plain
// reverse_proxy (the ceiling) and against the idempotency handler on each
// store, with unique keys (new) and repeated keys (replays). Plain and
// plugin runs alternate; each case reports req/s, p50 and p99 latency, the
// ratio to plain Caddy (median over the pairs), and store round trips per
// request.
//
//	go run ./bench [-duration 4s] [-pairs 5] [-conns 32] [-body 1024]
//	               [-stores memory,redis,postgres] [-write docs/benchmarks.md]
//	               [-profile dir]
//
// Redis and PostgreSQL are the servers of the tests: IDEMPOTENCY_REDIS_URL
// (or the older IDEMPOTENCY_REDIS_ADDR, host:port) and
// IDEMPOTENCY_POSTGRES_DSN, defaults on loopback; `make bench` starts
// private ones (internal/cmd/testservers).
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"
)

type options struct {
	duration time.Duration
	warmup   time.Duration
	pairs    int
	conns    int
	bodySize int
	stores   []string
	write    string
	profile  string
}

func main() {
	var o options
	var stores string
	flag.DurationVar(&o.duration, "duration", 4*time.Second, "length of each run")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured load before each case")
	flag.IntVar(&o.pairs, "pairs", 5, "plain/plugin run pairs per case")
	flag.IntVar(&o.conns, "conns", 32, "concurrent keep-alive connections")
	flag.IntVar(&o.bodySize, "body", 1024, "request body size in bytes (JSON)")
	flag.StringVar(&stores, "stores", "memory,redis,postgres,redis+cache,postgres+cache,postgres+async", "stores to measure (+cache: with a replay cache; +async: PostgreSQL with synchronous_commit=off)")
	flag.StringVar(&o.write, "write", "", "also write the result table as Markdown to this file")
	flag.StringVar(&o.profile, "profile", "", "save a CPU profile of Caddy during each case's last plugin run in this directory")
	flag.Parse()
	o.stores = strings.Split(stores, ",")

	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
