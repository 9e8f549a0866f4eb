package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// intent is a key a client sends until it is answered, and then again
// (a client that lost the answer): the second answer must be a replay.
type intent struct {
	key   string
	first time.Time
}

// load is the retrying clients.
type load struct {
	urls   []string // the Caddy instances' bases
	client *http.Client

	mu      sync.Mutex
	intents []*intent

	executions, requests, conflicts, unavailable, errors, otherStatus atomic.Int64
}

func newLoad(urls []string) *load {
	return &load{urls: urls, client: &http.Client{Timeout: 30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}}
}

// worker sends new intents until stop is closed.
func (l *load) worker(id int, seed uint64, stop <-chan struct{}) {
	r := rand.New(rand.NewPCG(seed, uint64(id)))
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		in := &intent{key: fmt.Sprintf("w%d-%d", id, i), first: time.Now()}
		l.mu.Lock()
		l.intents = append(l.intents, in)
		l.mu.Unlock()
		l.until201(in, r)
		time.Sleep(time.Duration(r.IntN(300)) * time.Millisecond)
		l.until201(in, r)
	}
}

// until201 sends in's key, to a random instance each time, and retries
// on errors, 409, 503 and other 5xx, as a client of the contract does,
// for up to two minutes.
func (l *load) until201(in *intent, r *rand.Rand) {
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); {
		status := l.send(in.key, l.urls[r.IntN(len(l.urls))], 20+r.IntN(130))
		switch {
		case status == http.StatusCreated:
			return
		case status == http.StatusConflict:
			l.conflicts.Add(1)
		case status == http.StatusServiceUnavailable:
			l.unavailable.Add(1)
		case status == 0:
			l.errors.Add(1)
		default:
			l.otherStatus.Add(1)
		}
		time.Sleep(time.Duration(50+r.IntN(150)) * time.Millisecond)
	}
}

// send POSTs key to base with an upstream that works for workMS, and
// returns the status (0: no answer).
func (l *load) send(key, base string, workMS int) int {
	l.requests.Add(1)
	req, err := http.NewRequest(http.MethodPost, base+"/soak/x", strings.NewReader(`{"key":"`+key+`"}`))
	if err != nil {
		return 0
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Upstream-Delay", strconv.Itoa(workMS))
	resp, err := l.client.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0
	}
	return resp.StatusCode
}

// sweep sends every intent's key once more, until answered.
func (l *load) sweep(seed uint64, workers int) {
	l.mu.Lock()
	all := append([]*intent(nil), l.intents...)
	l.mu.Unlock()
	next := make(chan *intent)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(1000+w)))
			for in := range next {
				l.until201(in, r)
			}
		})
	}
	for _, in := range all {
		next <- in
	}
	close(next)
	wg.Wait()
}

// adminGet GETs path on the admin API at addr.
func adminGet(ctx context.Context, addr, path string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
