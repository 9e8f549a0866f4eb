package main

// The Go benchmarks of the handler (handler_bench_test.go): ServeHTTP
// with a trivial next handler, one request at a time, on the memory store
// and on the Redis and PostgreSQL of the run. They measure the handler's
// own CPU and allocations, which travel across machines better than
// throughput does.

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// goBenchmarks are the benchmarks run, in the report's order.
var goBenchmarks = []struct {
	name, what string
	// Targets (issue 31) on the handler's own cost, the request's set-up
	// subtracted; 0: none. over: the target is the CPU over that
	// benchmark's.
	ns, allocs float64
	over       string
}{
	{name: "BenchmarkReplay", what: "memory replay", ns: 4000, allocs: 15},
	{name: "BenchmarkNewKey", what: "memory new key, the same body each time", ns: 12000, allocs: 40},
	{name: "BenchmarkNewKeyNewBody", what: "memory new key, a body of its own", ns: 12000, allocs: 40},
	{name: "BenchmarkRedisReplay", what: "Redis replay", ns: 10000, over: "BenchmarkReplay"},
	{name: "BenchmarkReplayParallel", what: "memory replay, 64 at once"},
	{name: "BenchmarkRedisReplayParallel", what: "Redis replay, 64 at once (sharing round trips)", ns: 10000, over: "BenchmarkReplayParallel"},
	{name: "BenchmarkPostgresNewKey", what: "PostgreSQL new key"},
	{name: "BenchmarkRequestSetup", what: "building the request (subtracted above)"},
}

// goBench is one benchmark's medians over the counts.
type goBench struct {
	ns, cpu, allocs, bytes float64
}

var (
	benchLine = regexp.MustCompile(`^(Benchmark\w+)(?:-\d+)?\s+\d+\s+([\d.]+) ns/op.*?\s([\d.]+) B/op\s+([\d.]+) allocs/op`)
	cpuField  = regexp.MustCompile(`\s([\d.]+) cpu-ns/op`)
	logLine   = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[.\d]*Z\t(?:DEBUG|INFO|WARN|ERROR)\t[^\n]*\n`)
)

// goBenchRuns runs the benchmarks o.goCount times each and reports them.
func goBenchRuns(o options) (string, error) {
	var names []string
	for _, b := range goBenchmarks {
		names = append(names, b.name)
	}
	args := []string{"test", "-run", "^$", "-bench", "^(" + strings.Join(names, "|") + ")$", "-benchmem",
		"-count", strconv.Itoa(o.goCount), "-benchtime", o.goBenchtime, "."}
	out, err := goTest(args)
	if err != nil {
		return "", err
	}
	// The stores' log lines interrupt a benchmark's result line (its name
	// is printed before it runs, its figures after): without them, each
	// result is one line again.
	out = logLine.ReplaceAllString(out, "")
	runs := map[string][]goBench{}
	for line := range strings.SplitSeq(out, "\n") {
		m := benchLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var g goBench
		g.ns, _ = strconv.ParseFloat(m[2], 64)
		g.bytes, _ = strconv.ParseFloat(m[3], 64)
		g.allocs, _ = strconv.ParseFloat(m[4], 64)
		if c := cpuField.FindStringSubmatch(line); c != nil {
			g.cpu, _ = strconv.ParseFloat(c[1], 64)
		}
		runs[m[1]] = append(runs[m[1]], g)
	}
	med := map[string]goBench{}
	for _, b := range goBenchmarks {
		rs := runs[b.name]
		if len(rs) == 0 {
			return "", fmt.Errorf("go test -bench: no result for %s (is the store of the tests reachable?):\n%s", b.name, out)
		}
		var ns, cpu, allocs, bytes []float64
		for _, r := range rs {
			ns, cpu, allocs, bytes = append(ns, r.ns), append(cpu, r.cpu), append(allocs, r.allocs), append(bytes, r.bytes)
		}
		med[b.name] = goBench{ns: median(ns), cpu: median(cpu), allocs: median(allocs), bytes: median(bytes)}
	}
	return goBenchReport(o, med), nil
}

func goBenchReport(o options, med map[string]goBench) string {
	setup := med["BenchmarkRequestSetup"]
	var b strings.Builder
	fmt.Fprintf(&b, "Go benchmarks of `ServeHTTP` with a trivial next handler (handler_bench_test.go; `go test -bench -benchmem`, median of %d runs of %s each, one request at a time but where it says 64 at once). CPU is the process's CPU time per request (`cpu-ns/op`: every goroutine, the store client's and garbage collection included), which other load on the machine changes far less than the wall time (`ns/op`); the handler's own cost is the benchmark's less `BenchmarkRequestSetup`'s, which builds the request:\n\n", o.goCount, o.goBenchtime)
	b.WriteString("| benchmark | case | CPU per request | ns/op | allocs/op | B/op | the handler's own: CPU, allocations | target | verdict |\n")
	b.WriteString("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |\n")
	for _, g := range goBenchmarks {
		m := med[g.name]
		own, target, verdict := "", "", ""
		if g.name != "BenchmarkRequestSetup" {
			own = fmt.Sprintf("%s, %.0f", us(m.cpu-setup.cpu), m.allocs-setup.allocs)
		}
		switch {
		case g.over != "":
			over := m.cpu - med[g.over].cpu
			target = fmt.Sprintf("<= %s over `%s`", us(g.ns), g.over)
			verdict = fmt.Sprintf("%s: %s over", metOrMissed(over <= g.ns), us(over))
		case g.ns > 0:
			target = fmt.Sprintf("<= %s and %.0f allocations", us(g.ns), g.allocs)
			verdict = fmt.Sprintf("CPU %s, allocations %s", metOrMissed(m.cpu-setup.cpu <= g.ns), metOrMissed(m.allocs-setup.allocs <= g.allocs))
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %.0f | %.0f | %.0f | %s | %s | %s |\n", g.name, g.what, us(m.cpu), m.ns, m.allocs, m.bytes, own, target, verdict)
	}
	return b.String()
}

func us(ns float64) string {
	return fmt.Sprintf("%.1f µs", float64(time.Duration(ns))/float64(time.Microsecond))
}

func metOrMissed(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

// goTest runs the go command with args (a go test -bench), saying so, and
// returns its output.
func goTest(args []string) (string, error) {
	fmt.Fprintf(os.Stderr, "go %s\n", strings.Join(args, " "))
	cmd := exec.Command("go", args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}
