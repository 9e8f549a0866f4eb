package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/soak/history"
)

// A waiter storm is one client's retries gone wild: a key runs for 4 to 5
// lock_timeouts on an instance, and a third of a lock_timeout in, n
// retries of it arrive there within two lock_timeouts, each with a body
// of -storm-body bytes (a retry loop without backoff, a fleet of workers
// redelivering one message). Another client's key runs there at the same
// time; once the storm is in, its retry must find a place in the wait and
// get its replay (history's waiter-crowded-out otherwise), and the
// instance must keep every lease: each key runs once.
//
// The retries are spread over two lock_timeouts rather than sent at one
// instant: each body is read whole before its key is looked up, so a
// gigabyte of uploads arriving within a second takes the instance's
// cores for that long whatever waits (docs/caddyfile.md, Waiting), and
// the storm is about what waiting requests hold.

// stormSpread is how long a storm takes to send its retries.
func stormSpread(L time.Duration) time.Duration { return 2 * L }

// storm sends storm number s of n retries with bodies of size bytes to
// instance nd, on route on.
func (c *clients) storm(ctx context.Context, s, n, size int, nd *node, on route) {
	L := c.L
	rng := rngFor(c.seed, 9, s)
	hold := stormSpread(L) + time.Duration((2+rng.Float64())*float64(L))
	first := behaviour{delay: hold, timeout: hold + patience(L)}

	storm := intentSpec{Intent: history.Intent{Scope: fmt.Sprintf("Bearer soak-storm-%d", s),
		Key: fmt.Sprintf("storm-%d", s), Senders: n + 1, Source: history.SourceStorm}}
	storm.on(on)
	head := fmt.Sprintf(`{"storm":%d,"pad":"`, s)
	storm.body = []byte(head + strings.Repeat("p", max(0, size-len(head)-2)) + `"}`)
	storm.BodyDigest = digest(storm.body)
	c.register(&storm)
	other := intentSpec{Intent: history.Intent{Scope: fmt.Sprintf("Bearer soak-storm-other-%d", s),
		Key: fmt.Sprintf("storm-other-%d", s), Senders: 2, Source: history.SourceStormOther}}
	other.on(on)
	other.body = fmt.Appendf(nil, `{"order":"storm-other-%d","amount":%d}`, s, 1+rng.IntN(100000))
	other.BodyDigest = digest(other.body)
	c.register(&other)

	go1 := func(f func()) {
		c.extra.Add(1)
		go func() {
			defer c.extra.Done()
			f()
		}()
	}
	go1(func() {
		c.send(ctx, &storm, 1, rngFor(c.seed, 9, s, 1), sendPlan{first: &first, at: nd, patient: true})
	})
	go1(func() {
		c.send(ctx, &other, 1, rngFor(c.seed, 9, s, 2), sendPlan{first: &first, at: nd, patient: true})
	})
	sleep(ctx, L/3)
	for i := range n {
		at := stormSpread(L) * time.Duration(i) / time.Duration(n)
		retry := behaviour{timeout: patience(L)}
		go1(func() {
			sleep(ctx, at)
			c.send(ctx, &storm, i+2, rngFor(c.seed, 9, s, 3, i), sendPlan{first: &retry, at: nd, once: true})
		})
	}
	sleep(ctx, stormSpread(L)+L/5)
	retry := behaviour{timeout: patience(L)}
	go1(func() {
		c.send(ctx, &other, 2, rngFor(c.seed, 9, s, 4), sendPlan{first: &retry, at: nd, patient: true})
	})
}

// stormAt is when storm s of storms starts: a quarter of the way into
// each storm's share of the run, away from the scale waves (which come
// in the middle of theirs).
func stormAt(length time.Duration, s, storms int) time.Duration {
	return length * time.Duration(4*s+1) / time.Duration(4*storms)
}

// stormQuiet is the window of storm s in which the nemesis stays quiet:
// from a second before it until its first requests (5 lock_timeouts at
// most) and the retries are answered, with a margin.
func stormQuiet(length time.Duration, s, storms int, L time.Duration) window {
	at := stormAt(length, s, storms)
	return window{from: at - time.Second, to: at + 6*L + 2*time.Second}
}

// storms sends storms storms of n retries with bodies of size bytes while
// issue lasts, spread over its length, each on the next instance and on
// the routes of on in turn; done ends their senders.
func (c *clients) storms(issue, done context.Context, start time.Time, length time.Duration, storms, n, size int, on []route) {
	for s := range storms {
		sleep(issue, time.Until(start.Add(stormAt(length, s, storms))))
		if issue.Err() != nil {
			return
		}
		c.storm(done, s, n, size, c.nodes[s%len(c.nodes)], on[s%len(on)])
	}
}
