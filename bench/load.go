package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// keyMode says which keys a run sends.
type keyMode int

const (
	uniqueKeys   keyMode = iota // every request a new key: reserve, run, complete
	repeatedKeys                // a fixed set of keys, completed before the run: replays
)

// result is one closed-loop run.
type result struct {
	requests  int64
	errors    int64
	statuses  map[int]int64
	elapsed   time.Duration
	latencies []time.Duration
}

func (r result) rps() float64 { return float64(r.requests) / r.elapsed.Seconds() }

func (r result) percentile(p float64) time.Duration {
	if len(r.latencies) == 0 {
		return 0
	}
	i := int(p * float64(len(r.latencies)-1))
	return r.latencies[i]
}

// loadSpec describes one run.
type loadSpec struct {
	url      string
	conns    int
	duration time.Duration
	body     []byte
	mode     keyMode
	keys     []string // the repeated keys
	prefix   string   // makes unique keys unique across runs
}

// runLoad drives closed-loop load: conns workers, each with one keep-alive
// connection, each sending its next request as soon as the previous one is
// answered, for spec.duration.
func runLoad(spec loadSpec) result {
	var (
		wg       sync.WaitGroup
		requests atomic.Int64
		errs     atomic.Int64
		mu       sync.Mutex
		statuses = make(map[int]int64)
		lat      = make([][]time.Duration, spec.conns)
	)
	ctx, cancel := context.WithTimeout(context.Background(), spec.duration)
	defer cancel()
	start := time.Now()
	for w := range spec.conns {
		wg.Go(func() {
			client := newWorkerClient()
			defer client.CloseIdleConnections()
			local := make(map[int]int64)
			samples := make([]time.Duration, 0, 1<<14)
			for n := 0; ctx.Err() == nil; n++ {
				key := spec.prefix + fmt.Sprintf("-%d-%d", w, n)
				if spec.mode == repeatedKeys {
					key = spec.keys[(w+n)%len(spec.keys)]
				}
				t0 := time.Now()
				status, err := post(client, spec.url, key, spec.body)
				if ctx.Err() != nil && err != nil {
					break // cut off by the end of the run
				}
				samples = append(samples, time.Since(t0))
				requests.Add(1)
				if err != nil {
					errs.Add(1)
					continue
				}
				local[status]++
			}
			lat[w] = samples
			mu.Lock()
			for s, c := range local {
				statuses[s] += c
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	r := result{requests: requests.Load(), errors: errs.Load(), statuses: statuses, elapsed: time.Since(start)}
	for _, s := range lat {
		r.latencies = append(r.latencies, s...)
	}
	slices.Sort(r.latencies)
	return r
}

// newWorkerClient returns a client that keeps exactly one connection.
func newWorkerClient() *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 1,
			MaxConnsPerHost:     1,
			DisableCompression:  true,
		},
		Timeout: 30 * time.Second,
	}
}

func post(client *http.Client, url, key string, body []byte) (int, error) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// jsonBody returns a realistic JSON request body of about n bytes.
func jsonBody(n int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"customer":"cus_8f2a91c4","currency":"eur","items":[`)
	for i := 0; b.Len() < n-40; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"sku":"sku-%04d","qty":%d,"price":%d.%02d}`, i, i%5+1, 10+i, i%100)
	}
	b.WriteString(`],"note":"bench"}`)
	return b.Bytes()
}
