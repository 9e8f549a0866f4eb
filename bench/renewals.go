package main

// The renewal runs: the cost of keeping leases alive as the number of
// long requests grows. A Caddy of its own serves one site per store at
// lock_timeout 2s; the upstream holds the requests to holdPath (the
// leases), and while n of them are held the run counts, over a window,
// the renewal batches Caddy sends (its store_duration_seconds histogram,
// op="renew": one observation per batch) and what the store itself saw
// of them (Redis: renew script calls in INFO commandstats, one per lease
// and batch, in one pipeline per batch; PostgreSQL: committed
// transactions in pg_stat_database, one per batch). Then it measures new
// keys' throughput on the same site while the largest number of leases
// is held, against the same with none.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
)

// renewalLockTimeout is the lock_timeout of the renewal sites: the
// review's, at which leases are renewed every renewalLockTimeout/10.
const renewalLockTimeout = 2 * time.Second

// renewalRow is what one run with n leases held measured.
type renewalRow struct {
	store      string
	leases     int
	batches    float64 // renewal batches per second, counted by Caddy
	atStore    float64 // per second, counted by the store; -1: none (memory)
	cpu        float64 // Caddy's CPU, in cores, while the leases are held
	rpsHeld    float64 // new keys per second while the leases are held; 0: not measured
	rpsNone    float64 // the same with no lease held
	loadFailed int64   // new keys while held not answered 2xx, or wrk's socket errors (timeouts)
	early      int     // requests answered before they were let go: refused, no lease held
	lateHolder int     // held requests not answered 201 once let go
	holdErr    string  // the first error of those
}

// renewalRuns measures every store of o.stores (but the cached ones, the
// same store) with each number of leases of o.leases.
func renewalRuns(o options, dir, bin string, up *upstream, env *storeEnv, body []byte) (string, error) {
	most := 0
	for _, n := range o.leases {
		most = max(most, n)
	}
	var stores []string
	ports := map[string]int{}
	var sites strings.Builder
	for _, s := range o.stores {
		if strings.HasSuffix(s, cachedSuffix) {
			continue
		}
		port, err := caddyproc.FreePort()
		if err != nil {
			return "", err
		}
		stores = append(stores, s)
		ports[s] = port
		// The held requests come and go over HTTP/2 without TLS, many on
		// one connection: 10,000 connections in and 10,000 out would pass
		// a process's usual limit of open files.
		fmt.Fprintf(&sites, "http://127.0.0.1:%d {\n%s\treverse_proxy %s %s {\n\t\ttransport http {\n\t\t\tversions h2c\n\t\t}\n\t}\n\treverse_proxy %s\n}\n\n",
			port, env.renewalDirective(s), holdPath, up.addr, up.addr)
	}
	inst, err := caddyproc.Start(bin, dir, "renewals", ports[stores[0]], caddyproc.Config{
		Globals: "\tlog {\n\t\tlevel ERROR\n\t}\n\tservers {\n\t\tprotocols h1 h2 h2c\n\t}",
		Sites:   sites.String(),
	})
	if err != nil {
		return "", err
	}
	defer inst.Stop()

	var rows []renewalRow
	for _, s := range stores {
		base := fmt.Sprintf("http://127.0.0.1:%d", ports[s])
		if _, err := runWrk(o, dir, base+"/orders", "new", "w-"+randomHex(4), 1, body, o.warmup); err != nil {
			return "", fmt.Errorf("%s: warming up: %w", s, err)
		}
		none, err := runWrk(o, dir, base+"/orders", "new", "n-"+randomHex(4), 1, body, o.duration)
		if err != nil {
			return "", fmt.Errorf("%s: new keys: %w", s, err)
		}
		for _, n := range o.leases {
			fmt.Fprintf(os.Stderr, "renewals: %s with %d leases held...\n", s, n)
			row, err := renewalRun(o, dir, inst, up, env, s, base, n, n == most, body)
			if err != nil {
				return "", fmt.Errorf("%s with %d leases: %w", s, n, err)
			}
			row.rpsNone = none.rps
			rows = append(rows, row)
		}
	}
	return renewalReport(o, rows), nil
}

// renewalRun holds n requests on the site of store at base, counts the
// renewals over o.renewalWindow, and with withLoad measures new keys
// meanwhile.
func renewalRun(o options, dir string, inst *caddyproc.Instance, up *upstream, env *storeEnv, store, base string, n int, withLoad bool, body []byte) (renewalRow, error) {
	row := renewalRow{store: store, leases: n, atStore: -1}
	release := up.hold()
	held := holdRequests(base+holdPath, n, body, up)
	released := false
	letGo := func() {
		if !released {
			released = true
			release()
		}
	}
	defer letGo()
	if err := held.wait(n, up); err != nil {
		return row, err
	}
	// A request the store refused (a 503 when a store is slow to answer
	// on a loaded machine) holds no lease: the run measures those held.
	row.leases = int(up.holding.Load())
	row.early = int(held.done.Load())
	if row.early > 0 {
		row.holdErr = held.firstErr().Error()
	}
	// The leases' first renewals, then a steady state.
	time.Sleep(renewalLockTimeout)
	ctx := context.Background()
	count := env.counters[store]
	if count != nil {
		// PostgreSQL's backends that reserved the keys publish those
		// commits once idle, up to ten seconds later: before the window.
		settle(count)
	}
	read := func() (batches, atStore int64, cpu time.Duration, err error) {
		if batches, err = renewBatches(inst.AdminAddr, store); err != nil {
			return
		}
		if count != nil {
			if atStore, err = count.read(ctx); err != nil {
				return
			}
		}
		cpu, err = cpuTime(inst.PID())
		return
	}
	b0, s0, c0, err := read()
	if err != nil {
		return row, err
	}
	t0 := time.Now()
	time.Sleep(o.renewalWindow)
	b1, s1, c1, err := read()
	if err != nil {
		return row, err
	}
	window := time.Since(t0).Seconds()
	row.batches = float64(b1-b0) / window
	row.cpu = (c1 - c0).Seconds() / window
	if count != nil {
		row.atStore = float64(s1-s0) / window
	}
	if withLoad {
		w, err := runWrk(o, dir, base+"/orders", "new", "h-"+randomHex(4), 1, body, o.duration)
		if err != nil {
			return row, fmt.Errorf("new keys while the leases are held: %w", err)
		}
		// Reported, not fatal: a loaded machine times some out.
		row.rpsHeld, row.loadFailed = w.rps, w.non2xx+w.errors
	}
	if got := int(up.holding.Load()); got != row.leases {
		return row, fmt.Errorf("%d requests held at the end of the run, %d at its start", got, row.leases)
	}
	letGo()
	// Their answers once let go, all at once: reported, not fatal, so
	// that a run keeps what it measured.
	if row.lateHolder = held.finish() - row.early; row.lateHolder > 0 {
		row.holdErr = held.firstErr().Error()
		fmt.Fprintf(os.Stderr, "renewals: %s: %d of %d held requests were not answered 201 once let go: %s\n", store, row.lateHolder, n, row.holdErr)
	}
	return row, nil
}

// heldRequests are the long requests of a run.
type heldRequests struct {
	wg     sync.WaitGroup
	done   atomic.Int64 // answered (or failed) before being let go
	failed atomic.Int64
	mu     sync.Mutex
	err    error
}

// holdRequests sends n new keys to url over HTTP/2 (h2c), in steps.
func holdRequests(url string, n int, body []byte, up *upstream) *heldRequests {
	h := &heldRequests{}
	h2c := new(http.Protocols)
	h2c.SetUnencryptedHTTP2(true)
	client := &http.Client{
		Timeout:   holdLimit + time.Minute,
		Transport: &http.Transport{Protocols: h2c},
	}
	defer client.CloseIdleConnections()
	prefix := "l-" + randomHex(4)
	const step = 500
	for i := range n {
		if i > 0 && i%step == 0 {
			// Let the store take the reservations in steps; the
			// deadline only bounds a hang (a run past it fails).
			deadline := time.Now().Add(2 * time.Minute)
			for up.holding.Load()+h.done.Load() < int64(i) && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
		}
		h.wg.Add(1)
		go func(key string) {
			defer h.wg.Done()
			req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", key)
			resp, err := client.Do(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
			}
			if err != nil {
				h.failed.Add(1)
				h.mu.Lock()
				if h.err == nil {
					h.err = err
				}
				h.mu.Unlock()
			}
			h.done.Add(1)
		}(fmt.Sprintf("%s-%d", prefix, i))
	}
	return h
}

// wait waits until each of the n requests is held by the upstream or was
// answered (refused) already.
func (h *heldRequests) wait(n int, up *upstream) error {
	deadline := time.Now().Add(5 * time.Minute) // only bounds a hang
	for up.holding.Load()+h.done.Load() < int64(n) {
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d requests reached the upstream", up.holding.Load(), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// finish waits for the answers of the requests let go and returns how
// many failed.
func (h *heldRequests) finish() int {
	h.wg.Wait()
	return int(h.failed.Load())
}

func (h *heldRequests) firstErr() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// renewBatches reads the renewal batches Caddy has sent to store: the
// count of its store_duration_seconds histogram for op="renew".
func renewBatches(admin, store string) (int64, error) {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "caddy_http_idempotency_store_duration_seconds_count{") ||
			!strings.Contains(line, `backend="`+store+`"`) || !strings.Contains(line, `op="renew"`) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		return int64(v), err
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, nil // no batch yet
}

// renewalDirective is the idempotency directive of a renewal site: the
// store's, at renewalLockTimeout, and for PostgreSQL without a cleanup
// in the window (its commits would be counted as renewals).
func (e *storeEnv) renewalDirective(store string) string {
	d := e.directive(store)
	d = strings.Replace(d, "\tidempotency {\n", fmt.Sprintf("\tidempotency {\n\t\tlock_timeout %s\n", renewalLockTimeout), 1)
	return strings.Replace(d, "storage postgres {\n", "storage postgres {\n\t\t\tcleanup_interval 30d\n", 1)
}

func renewalReport(o options, rows []renewalRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Lease renewal at `lock_timeout %s` (a batch every %s: %.0f a second per store and lease length, whatever the number of leases), counted over %s while the leases are held:\n\n",
		renewalLockTimeout, renewalLockTimeout/10, float64(time.Second)/float64(renewalLockTimeout/10), o.renewalWindow)
	b.WriteString("| store | leases held | renewal batches/s, by Caddy (one round trip each) | at the store, per second | renewals per lease per second | Caddy CPU (cores) |\n")
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rows {
		atStore, perLease := "none: in process, no round trip", "-"
		switch {
		case r.atStore < 0:
		case r.store == "postgres":
			// One transaction per batch, every lease in it.
			atStore = fmt.Sprintf("%.1f commits", r.atStore)
			perLease = fmt.Sprintf("%.1f", r.batches)
		default:
			// One renew script call per lease and batch, all of a batch
			// in one pipeline.
			atStore = fmt.Sprintf("%.0f script calls", r.atStore)
			perLease = fmt.Sprintf("%.1f", r.atStore/float64(r.leases))
		}
		fmt.Fprintf(&b, "| %s | %d | %.1f | %s | %s | %.2f |\n", r.store, r.leases, r.batches, atStore, perLease, r.cpu)
	}
	for _, r := range rows {
		if r.early > 0 {
			fmt.Fprintf(&b, "\n%s, %d leases: %d more requests were refused before they held a lease (%s).\n", r.store, r.leases, r.early, r.holdErr)
		}
		if r.lateHolder > 0 {
			fmt.Fprintf(&b, "\n%s, %d leases: %d of the held requests were not answered 201 when all were let go at once (the first: %s).\n", r.store, r.leases, r.lateHolder, r.holdErr)
		}
	}
	b.WriteString("\nNew keys while the most leases are held, against the same site with none (wrk as above, one run each):\n\n")
	b.WriteString("| store | leases held | new keys/s with none held | new keys/s while held | ratio | errors while held (not 2xx, or wrk's timeouts) |\n")
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rows {
		if r.rpsHeld == 0 {
			continue
		}
		fmt.Fprintf(&b, "| %s | %d | %.0f | %.0f | %.2fx | %d |\n", r.store, r.leases, r.rpsNone, r.rpsHeld, r.rpsHeld/r.rpsNone, r.loadFailed)
	}
	return b.String()
}
