package main

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
)

// executions records when the upstream ran each key.
type executions struct {
	mu    sync.Mutex
	byKey map[string][]time.Time
}

func (e *executions) add(x caddyproc.Execution) {
	key := x.Header.Get("Idempotency-Key")
	if key == "" {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.byKey[key] = append(e.byKey[key], x.Start)
}

// duplicate is an execution of a key after its first.
type duplicate struct {
	key      string
	runs     []time.Time
	failover int // the failover it follows; 0: none
}

// check finds the keys the upstream ran more than once and puts each
// extra run under the failover that lost the key's record: the first
// whose replica was promoted after the key's first run (a record
// written after that lives on the new primary). Attributing it by the
// time of the extra run would put the keys the final sweep found under
// the last failover.
func check(e *executions, fs []failover) []duplicate {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []duplicate
	for key, runs := range e.byKey {
		if len(runs) < 2 {
			continue
		}
		slices.SortFunc(runs, func(a, b time.Time) int { return a.Compare(b) })
		for _, at := range runs[1:] {
			d := duplicate{key: key, runs: runs}
			for _, f := range fs {
				if f.Promoted.After(runs[0]) && !f.At.After(at) {
					d.failover = f.N
					break
				}
			}
			out = append(out, d)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].runs[0].Before(out[j].runs[0]) })
	return out
}

// report writes the failovers, the load and the duplicates per failover,
// each named.
func report(w io.Writer, start time.Time, fs []failover, l *load, dups []duplicate, timeouts string) {
	at := func(t time.Time) string { return fmt.Sprintf("%.1fs", t.Sub(start).Seconds()) }
	per := make(map[int][]duplicate)
	for _, d := range dups {
		per[d.failover] = append(per[d.failover], d)
	}
	fmt.Fprintf(w, "\n%d failovers:\n", len(fs))
	for _, f := range fs {
		fmt.Fprintf(w, "  %s at %s: promoted after %.1fs, healed after %.1fs: %d duplicates\n",
			f, at(f.At), f.Promoted.Sub(f.At).Seconds(), f.Healed.Sub(f.At).Seconds(), len(per[f.N]))
		for _, d := range per[f.N] {
			runs := make([]string, len(d.runs))
			for i, r := range d.runs {
				runs[i] = at(r)
			}
			fmt.Fprintf(w, "    key %s ran %d times, at %v\n", d.key, len(d.runs), runs)
		}
	}
	if n := len(per[0]); n > 0 {
		fmt.Fprintf(w, "  before any failover: %d duplicates\n", n)
		for _, d := range per[0] {
			fmt.Fprintf(w, "    key %s ran %d times\n", d.key, len(d.runs))
		}
	}
	l.mu.Lock()
	intents := len(l.intents)
	l.mu.Unlock()
	fmt.Fprintf(w, "\nload: %d keys, %d upstream executions, %d requests; retried: %d 409, %d 503, %d other statuses, %d without an answer\n",
		intents, l.executions.Load(), l.requests.Load(), l.conflicts.Load(), l.unavailable.Load(), l.otherStatus.Load(), l.errors.Load())
	if timeouts != "" {
		fmt.Fprintf(w, "durability timeouts: %s\n", timeouts)
	}
	perFailover := 0.0
	if len(fs) > 0 {
		perFailover = float64(len(dups)) / float64(len(fs))
	}
	fmt.Fprintf(w, "%d duplicate executions over %d failovers (%.2f per failover)\n", len(dups), len(fs), perFailover)
}
