package main

import (
	"context"
	"fmt"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/soak/history"
)

// A scale wave is production's scale and timing at once: every instance
// gets n new keys within half a second, each asking the upstream to work
// 2 to 3 lock_timeouts, so that thousands of leases are renewed at once
// (over links that may be tens of milliseconds long); once each has run
// longer than lock_timeout, a retry of its key comes from the next
// instance, which must wait for it and get its replay, never run it
// again. Without a fault, a second execution is a duplicate.

// scaleSpread is how long a wave takes to send its first requests.
const scaleSpread = 500 * time.Millisecond

// scaleWave sends wave number wave: n keys on each instance, on the
// routes given in turn.
func (c *clients) scaleWave(ctx context.Context, wave, n int, on []route) {
	L := c.L
	for i, nd := range c.nodes {
		next := c.nodes[(i+1)%len(c.nodes)]
		for j := range n {
			rng := rngFor(c.seed, 8, wave, i, j)
			in := intentSpec{Intent: history.Intent{Scope: fmt.Sprintf("Bearer soak-scale-%d", wave),
				Key: fmt.Sprintf("scale-%d-%s-%d", wave, nd.name, j), Senders: 2, Source: history.SourceScale}}
			in.on(on[j%len(on)])
			in.body = fmt.Appendf(nil, `{"batch":"%d-%s-%d","amount":%d}`, wave, nd.name, j, 1+rng.IntN(100000))
			in.BodyDigest = digest(in.body)
			c.register(&in)
			at := time.Duration(rng.Int64N(int64(scaleSpread)))
			hold := time.Duration((2 + rng.Float64()) * float64(L))
			first := behaviour{delay: hold, timeout: hold + patience(L)}
			retry := behaviour{delay: time.Duration(rng.Int64N(int64(100 * time.Millisecond))), timeout: patience(L)}
			c.extra.Add(2)
			go func() {
				defer c.extra.Done()
				sleep(ctx, at)
				c.send(ctx, &in, 1, rngFor(c.seed, 8, wave, i, j, 1), sendPlan{first: &first, at: nd, patient: true})
			}()
			go func() {
				defer c.extra.Done()
				sleep(ctx, at+13*L/10)
				c.send(ctx, &in, 2, rngFor(c.seed, 8, wave, i, j, 2), sendPlan{first: &retry, at: next, patient: true})
			}()
		}
	}
}

// waveAt is when wave w of waves starts: spread over the run's length
// (one wave: in the middle).
func waveAt(length time.Duration, w, waves int) time.Duration {
	return length * time.Duration(2*w+1) / time.Duration(2*waves)
}

// waveQuiet is the window of wave w in which the nemesis stays quiet:
// from a second before it to when its last requests (sent within
// scaleSpread, working up to 3 lock_timeouts) and their retries are
// answered, with a margin.
func waveQuiet(length time.Duration, w, waves int, L time.Duration) window {
	at := waveAt(length, w, waves)
	return window{from: at - time.Second, to: at + scaleSpread + 4*L + 2*time.Second}
}

// scaleWaves sends waves waves of n keys per instance while issue lasts,
// spread over its length; done ends their senders (an interrupted run).
func (c *clients) scaleWaves(issue, done context.Context, start time.Time, length time.Duration, waves, n int, on []route) {
	for w := range waves {
		sleep(issue, time.Until(start.Add(waveAt(length, w, waves))))
		if issue.Err() != nil {
			return
		}
		c.scaleWave(done, w, n, on)
	}
}
