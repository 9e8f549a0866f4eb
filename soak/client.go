package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/soak/history"
)

// Bounds of one sender: it gives up after this many attempts or this
// long (the sweep asks again after the faults).
const (
	maxAttempts  = 80
	senderBudget = 60 * time.Second
	// maxBody bounds what a client reads of an answer: more than any the
	// workload asks for (sized answers stay below max_response_size).
	maxBody = 4 << 20
)

// clients send the workload's intents to random instances and retry them
// as a careful client would: same key, same body, on a network error, a
// timeout, 409, 503 or another 5xx, after a backoff, possibly elsewhere.
type clients struct {
	seed  int64
	L     time.Duration
	nodes []*node
	cert  *caddyproc.Cert
	rec   *recorder
	http  *http.Client

	mu      sync.Mutex
	nextID  int
	intents []*intentSpec

	// extra counts the senders no worker waits for (scale waves, the
	// fill, lock bursts): the run waits for them before its sweep.
	extra sync.WaitGroup
}

func newClients(seed int64, L time.Duration, nodes []*node, cert *caddyproc.Cert, rec *recorder) *clients {
	return &clients{seed: seed, L: L, nodes: nodes, cert: cert, rec: rec, http: &http.Client{
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 32,
			DisableCompression:  true,
		},
	}}
}

// register gives in the next id and logs it.
func (c *clients) register(in *intentSpec) {
	c.mu.Lock()
	c.nextID++
	in.ID = c.nextID
	c.intents = append(c.intents, in)
	c.mu.Unlock()
	c.rec.intent(in.Intent)
}

// node returns the instance named name.
func (c *clients) node(name string) *node { return c.nodes[int(name[0]-'a')] }

// work runs one client worker: intent after intent until issue ends, each
// sent by its senders until they get a final answer or give up; done
// ends everything at once (an interrupted run).
func (c *clients) work(issue, done context.Context, worker int) {
	for n := 0; issue.Err() == nil; n++ {
		in := newIntent(c.seed, worker, n, 0, c.L)
		c.register(&in)
		var wg sync.WaitGroup
		for s := range in.Senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if s > 0 {
					sleep(done, in.lag[s-1])
				}
				c.send(done, &in, s+1, rngFor(c.seed, 2, worker, n, s), sendPlan{})
			}()
		}
		wg.Wait()
		sleep(issue, time.Duration(rngFor(c.seed, 3, worker, n).Int64N(int64(200*time.Millisecond))))
	}
}

// sendPlan is how a sender begins: its first attempt's behaviour,
// instance and client (drawn, random and the steady HTTP/1.1 client when
// nil), and how long it keeps trying (0: senderBudget).
type sendPlan struct {
	first  *behaviour
	at     *node
	reader *reader
	budget time.Duration
	// patient senders back off exponentially (a scale wave's thousands
	// of them, as SDKs do), up to patientBackoff.
	patient bool
	// once: the sender makes one attempt, whatever it gets (a storm's
	// retries).
	once bool
}

// patientBackoff caps a patient sender's backoff.
const patientBackoff = 8 * time.Second

// send retries an intent until it gets a final answer, or gives up.
func (c *clients) send(ctx context.Context, in *intentSpec, sender int, rng *rand.Rand, sp sendPlan) {
	budget := senderBudget
	if sp.budget > 0 {
		budget = sp.budget
	}
	deadline := time.Now().Add(budget)
	for seq := 1; seq <= maxAttempts && ctx.Err() == nil && time.Now().Before(deadline); seq++ {
		b := drawBehaviour(rng, c.L)
		n := c.nodes[rng.IntN(len(c.nodes))]
		var rd *reader
		if seq == 1 {
			if sp.first != nil {
				b = *sp.first
			}
			if sp.at != nil {
				n = sp.at
			}
			rd = sp.reader
		}
		if in.Instance != "" {
			n = c.node(in.Instance)
		}
		in.shape(&b)
		a := c.attempt(ctx, in, n, b, rd)
		a.Sender, a.Seq = sender, seq
		c.rec.attempt(a)
		if finalForClient(&a) || sp.once {
			return
		}
		d := backoff(rng, &a)
		if sp.patient {
			d = min(d<<min(seq-1, 5), patientBackoff)
		}
		sleep(ctx, d)
	}
}

// sweep asks for every intent once more after the faults stopped and a
// quiet period, retrying a 409, a 503 or an error a few times over a
// couple of lock_timeouts: every intent must get its final answer.
func (c *clients) sweep(ctx context.Context, attempts int) {
	c.mu.Lock()
	intents := c.intents
	c.mu.Unlock()
	// Enough workers that thousands of intents (a scale wave's), each a
	// round trip or two to a store tens of milliseconds away, take
	// seconds.
	workers := min(256, max(8, len(intents)/40))
	next := make(chan *intentSpec)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for in := range next {
				rng := rngFor(c.seed, 4, in.ID)
				for seq := 1; seq <= attempts && ctx.Err() == nil; seq++ {
					n := c.nodes[rng.IntN(len(c.nodes))]
					if in.Instance != "" {
						n = c.node(in.Instance)
					}
					b := behaviour{timeout: patience(c.L)}
					in.shape(&b)
					a := c.attempt(ctx, in, n, b, nil)
					a.Sender, a.Seq, a.Sweep = 0, seq, true
					c.rec.attempt(a)
					if finalForClient(&a) {
						break
					}
					sleep(ctx, c.L/2)
				}
			}
		}()
	}
	for _, in := range intents {
		if in.MadeUp() {
			continue // a made-up credential never comes back
		}
		select {
		case next <- in:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
}

// attempt sends one request for in to n and records what came back; rd,
// when not nil, is a client of its own that speaks rd's protocol and
// reads as rd says.
func (c *clients) attempt(ctx context.Context, in *intentSpec, n *node, b behaviour, rd *reader) history.Attempt {
	a := history.Attempt{Intent: in.ID, Instance: n.name, AskDelay: b.delay, AskStatus: b.status, AskBreak: b.breakOff, AskSize: b.size,
		AskFail: b.fail, AskSilence: b.silence}
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	var hungUp atomic.Bool
	if b.hangUp > 0 {
		t := time.AfterFunc(b.hangUp, func() { hungUp.Store(true); cancel() })
		defer t.Stop()
	}
	hc, base := c.http, n.url()
	if rd != nil {
		a.Proto, a.Read, a.ReadRate, a.StallFor = rd.proto.String(), rd.mode, rd.rate, rd.stall
		rt := c.transport(rd.proto)
		defer caddyproc.CloseTransport(rt)
		hc = &http.Client{Transport: rt}
		if rd.proto == caddyproc.H2 || rd.proto == caddyproc.H3 {
			base = n.tlsURL()
		}
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+in.Path, bytes.NewReader(in.body))
	// One attempt, one request: net/http would resend a request with an
	// Idempotency-Key on a new connection when a reused one turns out
	// dead, hiding a try from the history.
	req.GetBody = nil
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", in.Key)
	req.Header.Set("Authorization", in.Scope)
	if b.delay > 0 {
		req.Header.Set("X-Upstream-Delay", strconv.FormatInt(b.delay.Milliseconds(), 10))
	}
	if b.status > 0 {
		req.Header.Set("X-Upstream-Status", strconv.Itoa(b.status))
	}
	if b.breakOff {
		req.Header.Set("X-Upstream-Break-After", "64")
	}
	if b.size > 0 {
		// Streamed in 8 KiB chunks as fast as Caddy takes them.
		req.Header.Set("X-Upstream-Size", strconv.Itoa(b.size))
	}
	if b.fail != "" {
		req.Header.Set("X-Upstream-Fail", b.fail)
	}
	if b.silence > 0 {
		req.Header.Set("X-Upstream-Silence", fmt.Sprintf("%d:%d", b.silentAt, b.silence.Milliseconds()))
		if b.silentAt == 0 {
			req.Header.Set("X-Upstream-Unsized", "true")
		}
	}
	a.Start = c.rec.now()
	resp, err := hc.Do(req)
	var body []byte
	if err == nil {
		body, err = rd.read(ctx, io.LimitReader(resp.Body, maxBody))
		resp.Body.Close()
		a.Status = resp.StatusCode
		a.Replayed = resp.Header.Get("Idempotent-Replayed") == "true"
		a.BodyOmitted = resp.Header.Get("Idempotent-Body-Omitted") == "true"
		a.Execution, _ = strconv.ParseInt(resp.Header.Get("X-Execution"), 10, 64)
		a.BodyDigest = digest(body)
		a.BodyBytes = len(body)
		parseBody(&a, resp.Header.Get("Content-Type"), body)
	}
	a.End = c.rec.now()
	a.HungUp = hungUp.Load()
	if err != nil {
		a.Err = shortError(err)
	}
	return a
}

// parseBody takes what the answer's body says: a problem's type, or the
// upstream's execution, key and scope.
func parseBody(a *history.Attempt, contentType string, body []byte) {
	switch {
	case strings.HasPrefix(contentType, "application/problem+json"):
		var p struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(body, &p) == nil {
			a.Problem = p.Type
		}
	case strings.HasPrefix(contentType, "application/json"):
		var v struct {
			Execution int64             `json:"execution"`
			Key       string            `json:"key"`
			Echo      map[string]string `json:"echo"`
		}
		if json.Unmarshal(body, &v) == nil {
			a.BodyExecution, a.BodyKey, a.BodyScope = v.Execution, v.Key, v.Echo["Authorization"]
		}
	}
}

// finalForClient reports whether a client stops retrying after a: it got
// a whole answer that does not free the key, or the answer that its
// key's outcome is unknown (not retryable: a client reconciles instead).
func finalForClient(a *history.Attempt) bool {
	if a.Problem == history.ProblemOutcomeUnknown {
		return true
	}
	return a.Status > 0 && a.Err == "" && !a.HungUp && a.Status != http.StatusConflict && a.Status < 500
}

// backoff is the pause before the next attempt: short after a 409 (the
// first request may be about to finish, or to lose its lease), longer
// after a store or network failure.
func backoff(rng *rand.Rand, a *history.Attempt) time.Duration {
	ms := func(lo, hi int) time.Duration { return time.Duration(lo+rng.IntN(hi-lo)) * time.Millisecond }
	switch {
	case a.Status == http.StatusConflict:
		return ms(30, 200)
	case a.Status == http.StatusServiceUnavailable:
		return ms(200, 700)
	case a.Status >= 500:
		return ms(50, 300)
	}
	return ms(100, 500)
}

// shortError is an error without the request's URL, for the history.
func shortError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return err.Error()
}

// sleep waits d, or less when ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
