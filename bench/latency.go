package main

import (
	"fmt"
	"os"
	"strings"
	"time"
)

// latencyTargets are the most each case may add to plain's p99 at the
// open-loop rate (issue 21). Replays on Redis and PostgreSQL have none:
// they run nothing upstream and are compared for throughput.
var latencyTargets = map[string]time.Duration{
	"memory new":    200 * time.Microsecond,
	"memory replay": 200 * time.Microsecond,
	"redis new":     time.Millisecond,
	"postgres new":  5 * time.Millisecond,
}

// latencyRounds runs every case at a fixed open-loop rate, rounds times,
// one case after the other within a round (so the added latency over
// plain is taken within a round, like the throughput ratios).
func latencyRounds(o options, cases []benchCase, rate float64, body []byte) (map[string][]openLoopRun, error) {
	client := newOpenLoopClient(o.openConns)
	defer client.close()
	// Open the connections and warm every path before measuring.
	for _, c := range cases {
		if _, err := client.run(c.url, c.mode, c.prefixFor(-1), o.conns*4, body, rate, time.Second); err != nil {
			return nil, fmt.Errorf("%s: warming up at %.0f/s: %w", c.name, rate, err)
		}
	}
	results := make(map[string][]openLoopRun)
	for r := range o.latencyRounds {
		fmt.Fprintf(os.Stderr, "latency round %d at %.0f/s:", r+1, rate)
		for _, c := range cases {
			run, err := client.run(c.url, c.mode, c.prefixFor(r), o.conns*4, body, rate, o.latencyDuration)
			if err != nil {
				return nil, fmt.Errorf("%s at %.0f/s: %w", c.name, rate, err)
			}
			results[c.name] = append(results[c.name], run)
			fmt.Fprintf(os.Stderr, " %s p99 %s", c.name, ms(run.p99))
		}
		fmt.Fprintln(os.Stderr)
	}
	return results, nil
}

// latencyReport renders the open-loop rounds: per case the median p50
// and p99, and what the case adds to plain's in the same round (median
// over the rounds, with the range of the p99's).
func latencyReport(o options, cases []benchCase, fraction, rate float64, results map[string][]openLoopRun) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Latency at a fixed open-loop rate of %.0f requests/s (%.2f of plain's median throughput above), %d rounds of %s, measured from when each request was due:\n\n", rate, fraction, o.latencyRounds, o.latencyDuration)
	b.WriteString("| case | p50 | p99 | added p50 over plain | added p99 over plain (median, range) | target (added p99) | generator late by at most |\n")
	b.WriteString("| --- | ---: | ---: | ---: | ---: | --- | ---: |\n")
	plain := results["plain"]
	for _, c := range cases {
		if c.name == "static" {
			continue // nothing upstream to compare with at this rate
		}
		runs := results[c.name]
		var p50s, p99s, add50, add99 []time.Duration
		var behind time.Duration
		for i, r := range runs {
			p50s = append(p50s, r.p50)
			p99s = append(p99s, r.p99)
			add50 = append(add50, r.p50-plain[i].p50)
			add99 = append(add99, r.p99-plain[i].p99)
			behind = max(behind, r.behind)
		}
		added50, added99, target := "", "", ""
		if c.name != "plain" {
			added50 = signedMs(median(add50))
			added99 = fmt.Sprintf("%s (%s to %s)", signedMs(median(add99)), signedMs(minDur(add99)), signedMs(maxDur(add99)))
		}
		if t, ok := latencyTargets[c.name]; ok {
			verdict := "met"
			if median(add99) > t {
				verdict = "MISSED"
			}
			target = fmt.Sprintf("<= +%s: %s", ms(t), verdict)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", c.name, ms(median(p50s)), ms(median(p99s)), added50, added99, target, ms(behind))
	}
	return b.String()
}

func signedMs(d time.Duration) string {
	if d < 0 {
		return "-" + ms(-d)
	}
	return "+" + ms(d)
}

func minDur(xs []time.Duration) time.Duration {
	m := xs[0]
	for _, x := range xs {
		m = min(m, x)
	}
	return m
}

func maxDur(xs []time.Duration) time.Duration {
	m := xs[0]
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}
