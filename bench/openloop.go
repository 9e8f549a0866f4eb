package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"time"
)

// openLoopRun is what one open-loop run measured. Latencies are taken from
// the moment a request was due, not from when it was sent, so a server
// that falls behind is charged for the queue it causes (a closed-loop
// generator such as wrk waits for answers and hides it).
type openLoopRun struct {
	due      int           // requests scheduled
	answered int           // requests answered 2xx
	failed   int           // errors and non-2xx answers
	p50, p99 time.Duration // over answered requests
	max      time.Duration
	// behind is how late the generator itself was at its worst: a run it
	// could not keep up with says nothing of the server.
	behind time.Duration
}

// openLoopClient sends requests on many keep-alive connections, enough
// that the rate never waits for a free one while the server keeps up.
type openLoopClient struct {
	client    *http.Client
	workers   int
	gcPercent int // to restore
}

// newOpenLoopClient also makes this process collect garbage less often
// until close: the generator shares it with the upstream, and a
// collection that delays the schedule would count against the server.
func newOpenLoopClient(workers int) *openLoopClient {
	tr := &http.Transport{
		MaxIdleConns:        workers,
		MaxIdleConnsPerHost: workers,
		MaxConnsPerHost:     workers,
		DisableCompression:  true,
		IdleConnTimeout:     time.Minute,
	}
	return &openLoopClient{client: &http.Client{Transport: tr, Timeout: 30 * time.Second}, workers: workers, gcPercent: debug.SetGCPercent(400)}
}

func (c *openLoopClient) close() {
	c.client.CloseIdleConnections()
	debug.SetGCPercent(c.gcPercent)
}

// run sends rate requests per second to url for d, on a fixed schedule
// whatever the answers do. mode and prefix choose the keys as for wrk: a
// new key per request, or the completed keys prefix-0..prefix-<nkeys-1>.
func (c *openLoopClient) run(url, mode, prefix string, nkeys int, body []byte, rate float64, d time.Duration) (openLoopRun, error) {
	interval := time.Duration(float64(time.Second) / rate)
	n := int(d / interval)
	type job struct {
		i  int
		at time.Time
	}
	jobs := make(chan job, n)
	var (
		mu        sync.Mutex
		latencies = make([]time.Duration, 0, n)
		failed    int
		firstErr  error
	)
	var wg sync.WaitGroup
	for range c.workers {
		wg.Go(func() {
			var mine []time.Duration
			bad := 0
			var badErr error
			for j := range jobs {
				key := prefix + "-" + strconv.Itoa(j.i)
				if mode == "replay" {
					key = prefix + "-" + strconv.Itoa(j.i%max(nkeys, 1))
				}
				if err := c.post(url, key, body); err != nil {
					bad++
					badErr = err
					continue
				}
				mine = append(mine, time.Since(j.at))
			}
			mu.Lock()
			latencies = append(latencies, mine...)
			failed += bad
			if firstErr == nil {
				firstErr = badErr
			}
			mu.Unlock()
		})
	}
	start := time.Now()
	var behind time.Duration
	for i := range n {
		at := start.Add(time.Duration(i) * interval)
		if wait := time.Until(at); wait > 0 {
			time.Sleep(wait)
		} else {
			behind = max(behind, -wait)
		}
		jobs <- job{i: i, at: at}
	}
	close(jobs)
	wg.Wait()

	r := openLoopRun{due: n, answered: len(latencies), failed: failed, behind: behind}
	if len(latencies) == 0 {
		return r, fmt.Errorf("no request was answered: %v", firstErr)
	}
	slices.Sort(latencies)
	r.p50 = percentile(latencies, 0.50)
	r.p99 = percentile(latencies, 0.99)
	r.max = latencies[len(latencies)-1]
	if failed > 0 {
		return r, fmt.Errorf("%d of %d requests failed: %v", failed, n, firstErr)
	}
	return r, nil
}

func (c *openLoopClient) post(url, key string, body []byte) error {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// percentile returns the q-quantile of sorted (nearest rank).
func percentile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted)) + 0.5)
	return sorted[min(max(i-1, 0), len(sorted)-1)]
}
