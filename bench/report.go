package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
)

// report renders the rounds as a Markdown table: per case the median
// req/s, the ratio to its baseline (median over the rounds, with the
// range), the target, latencies of the median round, the Caddy process's
// CPU time per request and its multiple of the baseline's in the same
// round (median, range, target), and store round trips per request.
func report(o options, cases []benchCase, results map[string][]sample) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| case | req/s | ratio (median of %d rounds, range) | target | p50 / p99 | Caddy CPU per request | CPU, multiple of the baseline's (median, range), difference, target | store round trips per request |\n", o.rounds)
	b.WriteString("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |\n")
	for _, c := range cases {
		runs := results[c.name]
		var rps, ratios, cpuMultiples []float64
		var cpus []time.Duration
		for i, s := range runs {
			rps = append(rps, s.rps)
			cpus = append(cpus, s.cpuPerReq)
			if c.baseline != "" {
				base := results[c.baseline][i]
				ratios = append(ratios, s.rps/base.rps)
				if base.cpuPerReq > 0 {
					cpuMultiples = append(cpuMultiples, float64(s.cpuPerReq)/float64(base.cpuPerReq))
				}
			}
		}
		mid := runs[medianIndex(rps)]
		ratio, target, cpuRatio := "", "", ""
		if c.baseline != "" {
			ratio = fmt.Sprintf("%.2fx of %s (%.2f-%.2f)", median(ratios), c.baseline, minOf(ratios), maxOf(ratios))
			baseCPU := median(cpuOf(results[c.baseline]))
			cpuRatio = fmt.Sprintf("%+.1f µs", float64(median(cpus)-baseCPU)/float64(time.Microsecond))
			if len(cpuMultiples) > 0 {
				cpuRatio = fmt.Sprintf("%.2fx (%.2f-%.2f), %s", median(cpuMultiples), minOf(cpuMultiples), maxOf(cpuMultiples), cpuRatio)
				if c.cpu > 0 {
					verdict := "met"
					if median(cpuMultiples) > c.cpu {
						verdict = "MISSED"
					}
					cpuRatio += fmt.Sprintf("; <= %.2fx: %s", c.cpu, verdict)
				}
			}
		}
		if c.target > 0 {
			verdict := "met"
			if median(ratios) < c.target {
				verdict = "MISSED"
			}
			target = fmt.Sprintf(">= %.2fx: %s", c.target, verdict)
		}
		trips := "-"
		if c.count != nil {
			var ts []float64
			for _, s := range runs {
				ts = append(ts, s.trips)
			}
			want := fmt.Sprintf("want %g", c.want)
			if c.atMost && c.want > 0 {
				want = fmt.Sprintf("want at most %g", c.want)
			}
			trips = fmt.Sprintf("%.3f-%.3f (%s)", minOf(ts), maxOf(ts), want)
		}
		fmt.Fprintf(&b, "| %s | %.0f | %s | %s | %s / %s | %.1f µs | %s | %s |\n",
			c.name, median(rps), ratio, target, ms(mid.p50), ms(mid.p99),
			float64(median(cpus))/float64(time.Microsecond), cpuRatio, trips)
	}
	return b.String()
}

func cpuOf(runs []sample) []time.Duration {
	var out []time.Duration
	for _, s := range runs {
		out = append(out, s.cpuPerReq)
	}
	return out
}

// medianIndex returns the index of the median of xs.
func medianIndex(xs []float64) int {
	m, best := median(xs), 0
	for i, x := range xs {
		if abs(x-m) < abs(xs[best]-m) {
			best = i
		}
	}
	return best
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

func minOf(xs []float64) float64 {
	m := xs[0]
	for _, x := range xs {
		m = min(m, x)
	}
	return m
}

func maxOf(xs []float64) float64 {
	m := xs[0]
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d.Microseconds())/1000) }

// writeResults puts the results and the machine they ran on between the
// markers of section in the Markdown file at path (<!-- section:begin -->
// and <!-- section:end -->; appending them when it has none), so that a
// run of some parts (-only) leaves the others' results. header is the
// first line, with a %s for the date.
func writeResults(path, section, header, table string, o options, versions map[string]string) error {
	beginMarker, endMarker := "<!-- "+section+":begin -->", "<!-- "+section+":end -->"
	var b strings.Builder
	b.WriteString(beginMarker + "\n")
	fmt.Fprintf(&b, header, time.Now().UTC().Format("2006-01-02"))
	b.WriteString(table)
	b.WriteString("\nMachine: ")
	fmt.Fprintf(&b, "%s, %d logical CPUs, %s memory, %s, %s", cpuModel(), runtime.NumCPU(), memTotal(), strings.TrimSpace(command("uname", "-sr")), runtime.Version())
	for _, k := range []string{"redis", "postgres"} {
		if v, ok := versions[k]; ok {
			fmt.Fprintf(&b, ", %s %s", k, v)
		}
	}
	b.WriteString(" (load generator, Caddy, upstream and stores on this one machine).\n")
	b.WriteString(endMarker)

	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	page := string(old)
	i, j := strings.Index(page, beginMarker), strings.Index(page, endMarker)
	if i >= 0 && j > i {
		page = page[:i] + b.String() + page[j+len(endMarker):]
	} else {
		page += "\n" + b.String() + "\n"
	}
	return os.WriteFile(path, []byte(page), 0o644)
}

func cpuModel() string {
	data, _ := os.ReadFile("/proc/cpuinfo")
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "model name"); ok {
			return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
		}
	}
	return "unknown CPU"
}

func memTotal() string {
	data, _ := os.ReadFile("/proc/meminfo")
	line, _, _ := strings.Cut(string(data), "\n")
	return strings.Join(strings.Fields(strings.TrimPrefix(line, "MemTotal:")), " ")
}

func command(name string, args ...string) string {
	out, _ := exec.Command(name, args...).Output()
	return string(out)
}
