package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/soak/history"
)

// nemesis applies a schedule of faults to a cluster and logs each one in
// the history, from when it began to when it was healed.
type nemesis struct {
	c       *cluster
	cl      *clients // a lock's burst of keys
	rec     *recorder
	logf    func(string, ...any)
	verbose bool // log every fault

	mu      sync.Mutex
	targets map[string]*sync.Mutex // one fault at a time per target
	lk      locker
}

func (nm *nemesis) lock(target string) func() {
	nm.mu.Lock()
	m := nm.targets[target]
	if m == nil {
		m = new(sync.Mutex)
		nm.targets[target] = m
	}
	nm.mu.Unlock()
	m.Lock()
	return m.Unlock
}

// run applies each fault at its time until the schedule or ctx ends, and
// returns once every fault it began is healed: within its planned length
// and a restart, or at once when abort ends (an interrupted run).
func (nm *nemesis) run(ctx, abort context.Context, schedule []planned) {
	nm.targets = map[string]*sync.Mutex{}
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, p := range schedule {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(nm.rec.start.Add(p.At))):
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			nm.apply(abort, p)
		}()
	}
}

// apply does one fault and logs it; ctx cuts its length short.
func (nm *nemesis) apply(ctx context.Context, p planned) {
	f := history.Fault{Kind: p.Kind, Instance: p.Instance, Store: p.Store}
	target := "store " + p.Store
	var n *node
	if p.Instance != "" {
		n = nm.c.nodes[int(p.Instance[0]-'a')]
		target = "instance " + p.Instance
		if p.Kind.OnALink() {
			target = "link " + p.Instance + "-" + p.Store
		}
	}
	defer nm.lock(target)()
	// wait sleeps for d, or less when the run is interrupted.
	wait := func(d time.Duration) {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	var err error
	f.Start = nm.rec.now()
	switch p.Kind {
	case history.Kill:
		n.kill()
		wait(p.For)
		err = n.restart()
	case history.Pause:
		if err = n.current().Pause(); err == nil {
			wait(p.For)
			err = n.current().Resume()
		}
	case history.Stall:
		l := n.links[p.Store]
		l.Stall()
		wait(p.For)
		l.Unstall()
	case history.Cut:
		l := n.links[p.Store]
		l.Cut()
		wait(p.For)
		err = l.Restore()
	case history.Reload:
		f.Note = variants[p.Variant].String()
		err = n.reload(variants[p.Variant])
	case history.StoreRestart, history.StoreKill:
		err = nm.restartStore(p, wait)
	case history.Latency:
		l := n.links[p.Store]
		f.Note = fmt.Sprintf("%s-%s round trip", 2*p.Latency, 2*(p.Latency+p.Jitter))
		l.SetLatency(p.Latency, p.Jitter)
		wait(p.For)
		l.SetLatency(nm.c.latency, nm.c.jitter)
	case history.Lock:
		err = nm.lockRow(ctx, p, &f, wait)
	}
	f.End = nm.rec.now()
	if err != nil {
		f.Note += fmt.Sprintf(" failed: %v", err)
		nm.logf("fault %s: %v", p, err)
	} else if nm.verbose {
		nm.logf("fault %s", f.Describe())
	}
	nm.rec.fault(f)
}

// restartStore stops (cleanly) or kills a store and starts it again on
// its port.
func (nm *nemesis) restartStore(p planned, wait func(time.Duration)) error {
	type server interface {
		Stop() error
		Kill()
		Restart() error
	}
	var s server = nm.c.redis
	if p.Store == history.Postgres {
		s = nm.c.pg
	}
	if p.Kind == history.StoreKill {
		s.Kill()
		wait(p.For)
	} else if err := s.Stop(); err != nil {
		return err
	}
	return s.Restart()
}

// watch records instances that exit on their own (a crash the nemesis did
// not cause) and starts them again, until ctx ends.
func (nm *nemesis) watch(ctx context.Context) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, n := range nm.c.nodes {
			if !n.exitedOnItsOwn() || ctx.Err() != nil {
				continue // an interrupted run's instances get the ^C too
			}
			logs := n.logs()
			nm.rec.crash(history.Crash{Instance: n.name, At: nm.rec.now(),
				What: "exited on its own; its log ends:\n" + lastLines(logs[len(logs)-1], 30)})
			nm.logf("caddy %s exited on its own; restarting it", n.name)
			func() {
				defer nm.lock("instance " + n.name)()
				if err := n.restart(); err != nil {
					nm.logf("restarting caddy %s: %v", n.name, err)
				}
			}()
		}
	}
}
