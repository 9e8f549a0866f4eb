package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// wrkScript makes wrk POST JSON with an Idempotency-Key: a new key per
// request (prefix, thread, counter), or one of a fixed set of keys.
const wrkScript = `
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end
function init(args)
  mode, prefix, nkeys = args[1], args[2], tonumber(args[3])
  counter = 0
end
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = os.getenv("BENCH_BODY")
request = function()
  counter = counter + 1
  if mode == "replay" then
    wrk.headers["Idempotency-Key"] = prefix .. "-" .. ((counter * 7 + id) % nkeys)
  else
    wrk.headers["Idempotency-Key"] = prefix .. "-" .. id .. "-" .. counter
  end
  return wrk.format()
end
`

// wrkRun is what wrk measured.
type wrkRun struct {
	requests int64
	rps      float64
	p50, p99 time.Duration
	non2xx   int64
	errors   int64
}

// runWrk runs wrk against url. mode is "new" or "replay" (keys prefix-0
// to prefix-<nkeys-1>, completed before).
func runWrk(o options, dir, url, mode, prefix string, nkeys int, body []byte, d time.Duration) (wrkRun, error) {
	script := filepath.Join(dir, "bench.lua")
	if _, err := os.Stat(script); err != nil {
		if err := os.WriteFile(script, []byte(wrkScript), 0o644); err != nil {
			return wrkRun{}, err
		}
	}
	cmd := exec.Command("wrk", "-t", strconv.Itoa(o.threads), "-c", strconv.Itoa(o.conns), "-d", fmt.Sprintf("%.0fs", d.Seconds()),
		"--latency", "-s", script, url, "--", mode, prefix, strconv.Itoa(max(nkeys, 1)))
	cmd.Env = append(os.Environ(), "BENCH_BODY="+string(body))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return wrkRun{}, fmt.Errorf("wrk: %v\n%s", err, out)
	}
	return parseWrk(string(out))
}

func parseWrk(out string) (wrkRun, error) {
	var r wrkRun
	for line := range strings.SplitSeq(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && f[0] == "Requests/sec:":
			r.rps, _ = strconv.ParseFloat(f[1], 64)
		case len(f) >= 4 && f[1] == "requests" && f[2] == "in":
			r.requests, _ = strconv.ParseInt(f[0], 10, 64)
		case len(f) == 2 && f[0] == "50%":
			r.p50 = parseWrkDuration(f[1])
		case len(f) == 2 && f[0] == "99%":
			r.p99 = parseWrkDuration(f[1])
		case strings.HasPrefix(strings.TrimSpace(line), "Non-2xx or 3xx responses:"):
			r.non2xx, _ = strconv.ParseInt(f[len(f)-1], 10, 64)
		case strings.HasPrefix(strings.TrimSpace(line), "Socket errors:"):
			for _, kv := range strings.Split(strings.TrimPrefix(strings.TrimSpace(line), "Socket errors:"), ",") {
				if kf := strings.Fields(kv); len(kf) == 2 {
					n, _ := strconv.ParseInt(kf[1], 10, 64)
					r.errors += n
				}
			}
		}
	}
	if r.requests == 0 || r.rps == 0 {
		return r, fmt.Errorf("cannot read wrk's output:\n%s", out)
	}
	return r, nil
}

// parseWrkDuration reads wrk's "1.23ms", "456.00us", "1.02s".
func parseWrkDuration(s string) time.Duration {
	for _, u := range []struct {
		suffix string
		unit   time.Duration
	}{{"us", time.Microsecond}, {"ms", time.Millisecond}, {"s", time.Second}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0
			}
			return time.Duration(f * float64(u.unit))
		}
	}
	return 0
}
