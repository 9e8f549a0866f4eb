package main

// The cost of the Redis store's `durability replicas 1` (issue 29): a new
// key (reserve and complete) against a private primary with one replica,
// with and without WAIT, one at a time and 64 at once
// (storage/redis BenchmarkDurability).

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

var durabilityLine = regexp.MustCompile(`^BenchmarkDurability/(serial|parallel)/replicas=(\d)(?:-\d+)?\s+\d+\s+([\d.]+) ns/op`)

// durabilityRuns runs BenchmarkDurability o.goCount times and reports the
// medians and what WAIT costs.
func durabilityRuns(o options) (string, error) {
	args := []string{"test", "-run", "^$", "-bench", "^BenchmarkDurability$", "-count", strconv.Itoa(o.goCount),
		"-benchtime", o.goBenchtime, "./storage/redis/"}
	out, err := goTest(args)
	if err != nil {
		return "", err
	}
	runs := map[string][]float64{}
	for line := range strings.SplitSeq(out, "\n") {
		if m := durabilityLine.FindStringSubmatch(line); m != nil {
			ns, _ := strconv.ParseFloat(m[3], 64)
			runs[m[1]+"/"+m[2]] = append(runs[m[1]+"/"+m[2]], ns)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nThe cost of Redis `durability replicas 1` (storage/redis `BenchmarkDurability`: a new key, reserve and complete, on a private primary with one replica on this machine; median of %d runs of %s):\n\n", o.goCount, o.goBenchtime)
	b.WriteString("| new keys | without (replicas 0) | with `durability replicas 1` | cost |\n| --- | ---: | ---: | ---: |\n")
	for _, mode := range []string{"serial", "parallel"} {
		without, with := runs[mode+"/0"], runs[mode+"/1"]
		if len(without) == 0 || len(with) == 0 {
			return "", fmt.Errorf("go test -bench BenchmarkDurability: no %s result:\n%s", mode, out)
		}
		w0, w1 := median(without), median(with)
		what := "one at a time (latency)"
		if mode == "parallel" {
			what = "64 at once (time per key: throughput)"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | +%.0f%% |\n", what, us(w0), us(w1), 100*(w1/w0-1))
	}
	return b.String(), nil
}
