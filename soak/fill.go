package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/soak/history"
)

// The fill: made-up credentials (each a scope of its own, as a
// credential-stuffing client's or a scanner's) whose requests the
// upstream refuses with 404, a status that is recorded, fill every
// instance's memory store (/memory/, max_keys -fill); then real clients'
// new keys arrive on the same store. Refused answers that are recorded
// must not let such sources fill a store against a new key
// (history.checkFill).

// fillReal is how many real clients' new keys follow the fill on each
// instance.
const fillReal = 5

// fill fills every instance's memory store with maxKeys made-up sources'
// refusals, 8 at a time, then sends fillReal real new keys to each.
func (c *clients) fill(ctx context.Context, maxKeys int) {
	var wg sync.WaitGroup
	for i, nd := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem := make(chan struct{}, 8)
			var fw sync.WaitGroup
			for j := range maxKeys {
				in := intentSpec{Intent: history.Intent{Scope: fmt.Sprintf("Bearer made-up-%s-%d", nd.name, j),
					Key: fmt.Sprintf("probe-%d", j), Senders: 1, Source: history.SourceMadeUp, Instance: nd.name}, status: 404}
				in.on(routeAt("/memory/"))
				in.body = fmt.Appendf(nil, `{"probe":%d}`, j)
				in.BodyDigest = digest(in.body)
				c.register(&in)
				sem <- struct{}{}
				fw.Add(1)
				go func() {
					defer fw.Done()
					defer func() { <-sem }()
					c.send(ctx, &in, 1, rngFor(c.seed, 10, i, j), sendPlan{first: &behaviour{timeout: patience(c.L)}})
				}()
			}
			fw.Wait()
			for j := range fillReal {
				in := intentSpec{Intent: history.Intent{Scope: "Bearer soak-client-fill",
					Key: fmt.Sprintf("mem-%s-%d", nd.name, j), Senders: 1, Source: history.SourceFill, Instance: nd.name}}
				in.on(routeAt("/memory/"))
				in.body = fmt.Appendf(nil, `{"order":"mem-%s-%d","amount":%d}`, nd.name, j, 100+j)
				in.BodyDigest = digest(in.body)
				c.register(&in)
				fw.Add(1)
				go func() {
					defer fw.Done()
					c.send(ctx, &in, 1, rngFor(c.seed, 11, i, j), sendPlan{first: &behaviour{timeout: patience(c.L)}})
				}()
			}
			fw.Wait()
		}()
	}
	wg.Wait()
}

// fillAt runs the fill at a tenth of the run (at least 5 s in), unless
// issue ends first.
func (c *clients) fillAt(issue, done context.Context, start time.Time, length time.Duration, maxKeys int) {
	sleep(issue, time.Until(start.Add(max(length/10, 5*time.Second))))
	if issue.Err() == nil {
		c.fill(done, maxKeys)
	}
}
