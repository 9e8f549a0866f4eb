package idempotency

// The store writes that settle a record when the store could not take
// them at once, retried in the background.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// Aftercare bounds.
const (
	// maxAftercare bounds the store writes one handler keeps retrying;
	// beyond it a write is given up at once (its lease lapses on its own).
	maxAftercare = 10_000

	// aftercareMinPause and aftercareMaxPause bound the pause between
	// rounds while the store keeps failing.
	aftercareMinPause = 100 * time.Millisecond
	aftercareMaxPause = 2 * time.Second

	// ghostSettle is how long after the store first answers "nothing to
	// release" an abandoned reservation is released once more: a write
	// that was queued behind the stall (a Redis busy in a slow script, a
	// statement delivered when a partition heals) lands within moments of
	// the store answering again. It is also how long a finished abandon
	// is remembered for reclaim.
	ghostSettle = time.Second

	// choreTimeout bounds one try of a write.
	choreTimeout = 30 * time.Second
)

// settler is the part of a store (observed, see store.go) that aftercare
// writes to.
type settler interface {
	Complete(ctx context.Context, key storage.Key, token storage.Token, resp *storage.Response, ttl time.Duration) error
	Release(ctx context.Context, key storage.Key, token storage.Token) error
}

// chore is one store write a request could not finish.
type chore struct {
	kind  choreKind
	key   storage.Key
	token storage.Token
	resp  *storage.Response // complete only
	ttl   time.Duration     // complete only
	until time.Time         // given up after this
	lease *lease            // complete and release: kept alive until done with (nil: none)
	// replicas: a completion on the primary that too few replicas
	// acknowledged, sent again until they do (the store then answers
	// that the lease completed the record already)
	replicas bool

	notBefore time.Time // abandon: the second look
	answered  bool      // abandon: the store said there was nothing to release
	finished  time.Time // abandon: when it was done with (guarded by aftercare.mu)
}

type choreKind uint8

const (
	choreComplete choreKind = iota + 1 // record the response of a request that ran
	choreRelease                       // free the key of a request that failed
	choreAbandon                       // remove a reservation whose outcome is unknown
)

func (k choreKind) String() string {
	switch k {
	case choreComplete:
		return "complete"
	case choreRelease:
		return "release"
	}
	return "abandon"
}

// aftercare finishes, in the background, the store writes that requests
// could not: a Complete or Release that failed because the store was
// unreachable or slow (the key would otherwise stay in flight, answering
// 409, until its lease lapses), and the release of a reservation whose
// Reserve failed with an unknown outcome (a ghost lease: written by the
// store, never known to the request, which was told "not processed").
//
// A Complete or Release chore holds its request's lease, renewed on its
// own cadence meanwhile, until its write succeeds, is fenced
// (ErrLeaseLost) or is given up: a completion waiting out a store outage
// must not lose the key to a retry elsewhere, which would run the upstream
// again. A ghost's lease is not renewed: it is meant to go.
//
// One goroutine per handler does the work while there is any, one write at
// a time, pausing between rounds while the store keeps failing, so that an
// outage of the store costs it one probe per pause rather than one per
// failed request. It holds the store open meanwhile (a reload must not
// close it under a pending write).
//
// Two gauges count what is pending, apart: backlog the writes that settle
// the records of requests that ran (complete, release), each holding its
// key in flight until it lands; abandons the reservations of requests
// that were answered 503, released once the store answers. An outage
// fills the second with one per 503, the first only with the requests
// that were running when it began.
type aftercare struct {
	store    settler
	hold     func() (release func(), ok bool)
	logger   *zap.Logger
	backlog  prometheus.Gauge // complete and release chores not done with; nil: not counted
	abandons prometheus.Gauge // abandon chores not done with; nil: not counted

	mu      sync.Mutex
	pending []*chore
	// abandoned holds the abandons still pending, and those finished
	// within ghostSettle, by key: a retry that meets its key in flight
	// asks reclaim whether it was one of ours.
	abandoned map[storage.Key]*chore
	running   bool

	// settling counts the complete and release chores not done with, for
	// drain.
	settling atomic.Int64
}

// add queues c and starts the worker if it is idle.
func (a *aftercare) add(c *chore) {
	a.mu.Lock()
	if len(a.pending) >= maxAftercare {
		a.mu.Unlock()
		a.logger.Error("too many idempotency store writes pending; giving one up (its key stays in flight until its lease lapses)",
			zap.String("op", c.kind.String()), zap.String("key_hash", c.key.Hash()))
		c.lease.stop()
		return
	}
	a.pending = append(a.pending, c)
	a.count([]*chore{c}, nil)
	if c.kind == choreAbandon {
		if a.abandoned == nil {
			a.abandoned = make(map[storage.Key]*chore)
		}
		a.abandoned[c.key] = c
	}
	start := !a.running
	a.running = true
	a.mu.Unlock()
	if !start {
		return
	}
	release, ok := a.hold()
	if !ok {
		// The store is closed: nothing can be written or renewed.
		a.mu.Lock()
		dropped := a.pending
		a.pending, a.abandoned, a.running = nil, nil, false
		a.mu.Unlock()
		a.count(nil, dropped)
		for _, d := range dropped {
			d.lease.stop()
		}
		return
	}
	go func() {
		defer release()
		a.work()
	}()
}

// count adds the chores of added to their gauges and takes those of
// done off, each gauge changed once.
func (a *aftercare) count(added, done []*chore) {
	var settle, abandon int
	for _, c := range added {
		if c.kind == choreAbandon {
			abandon++
		} else {
			settle++
		}
	}
	for _, c := range done {
		if c.kind == choreAbandon {
			abandon--
		} else {
			settle--
		}
	}
	a.settling.Add(int64(settle))
	if a.backlog != nil && settle != 0 {
		a.backlog.Add(float64(settle))
	}
	if a.abandons != nil && abandon != 0 {
		a.abandons.Add(float64(abandon))
	}
}

// work runs rounds until nothing is pending.
func (a *aftercare) work() {
	pause := aftercareMinPause
	for {
		a.mu.Lock()
		a.forgetFinished(time.Now())
		batch := a.pending
		a.pending = nil
		if len(batch) == 0 {
			a.running = false
			a.mu.Unlock()
			return
		}
		a.mu.Unlock()

		keep, failing, next := a.round(batch)
		a.count(keep, batch)

		a.mu.Lock()
		a.pending = append(keep, a.pending...)
		a.mu.Unlock()
		switch {
		case failing:
			time.Sleep(pause)
			pause = min(2*pause, aftercareMaxPause)
		case len(keep) > 0:
			pause = aftercareMinPause
			time.Sleep(max(time.Until(next), time.Millisecond))
		}
	}
}

// round tries each chore once, until the store fails; it returns the
// chores left, whether the store failed, and when the earliest of them is
// due.
func (a *aftercare) round(batch []*chore) (keep []*chore, failing bool, next time.Time) {
	later := func(c *chore) {
		keep = append(keep, c)
		if next.IsZero() || c.notBefore.Before(next) {
			next = c.notBefore
		}
	}
	for _, c := range batch {
		now := time.Now()
		switch {
		case a.isFinished(c):
			continue // reclaimed by a retry meanwhile
		case now.After(c.until):
			a.logger.Warn("gave up an idempotency store write; its key stays in flight until its lease lapses",
				zap.String("op", c.kind.String()), zap.String("key_hash", c.key.Hash()))
			a.finish(c, now)
			continue
		case failing || now.Before(c.notBefore):
			later(c)
			continue
		}
		err := c.do(a.store)
		switch {
		case err == nil:
			a.logger.Info("finished an idempotency store write after the store recovered",
				zap.String("op", c.kind.String()), zap.String("key_hash", c.key.Hash()))
			a.finish(c, now)
		case errors.Is(err, storage.ErrLeaseLost) && c.kind == choreAbandon && !c.answered:
			// Nothing to release yet; look once more in a moment.
			c.answered, c.notBefore = true, now.Add(ghostSettle)
			later(c)
		case errors.Is(err, storage.ErrLeaseLost) && c.replicas:
			a.logger.Info("an idempotent response is on enough replicas now (or was taken over meanwhile)",
				zap.String("key_hash", c.key.Hash()))
			a.finish(c, now)
		case errors.Is(err, storage.ErrLeaseLost):
			// Taken over, deleted, or never written: nothing of ours. (Or
			// written by an earlier try whose answer was lost.)
			if c.kind != choreAbandon {
				a.logger.Info("an idempotency store write found its lease gone: taken over after a lapse, deleted, or done by an earlier try",
					zap.String("op", c.kind.String()), zap.String("key_hash", c.key.Hash()))
			}
			a.finish(c, now)
		default:
			failing = true
			keep = append(keep, c)
		}
	}
	return keep, failing, next
}

// drain waits, until the deadline at most, for the complete and release
// chores to be done with, and returns how many are left. When Caddy
// exits, a completion still pending would be lost with the process: its
// key would stay in flight until its lease lapsed, and the retry would
// then run the request again. (A reload needs no wait: the worker goes on
// with the store held.) Abandons are not waited for: their reservations
// lapse on their own, and nothing ran for them.
func (a *aftercare) drain(deadline time.Time) int {
	for {
		n := int(a.settling.Load())
		if n <= 0 || !time.Now().Before(deadline) {
			return max(n, 0)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exitDrain bounds how long an exiting Caddy waits for the store writes
// still pending (Handler.Cleanup); a service manager's stop timeout is
// longer (systemd's default is 90 s).
const exitDrain = 15 * time.Second

// exitDeadline is when the wait of every handler's Cleanup ends, set by
// the first to wait.
var exitDeadline = sync.OnceValue(func() time.Time { return time.Now().Add(exitDrain) })

// reclaim is for a request that met key in flight. When that may be a
// reservation this handler abandoned (see Handler.abandon), it releases it
// at once rather than waiting for the worker, and reports whether the
// request should look again: the reservation is gone now (released here,
// by the worker a moment ago, or never written).
func (a *aftercare) reclaim(key storage.Key) bool {
	a.mu.Lock()
	c := a.abandoned[key]
	var finished bool
	if c != nil && !c.finished.IsZero() {
		finished = true
		if time.Since(c.finished) > ghostSettle {
			delete(a.abandoned, key)
			c = nil
		}
	}
	a.mu.Unlock()
	if c == nil {
		return false
	}
	if finished {
		return true
	}
	if err := c.do(a.store); err != nil && !errors.Is(err, storage.ErrLeaseLost) {
		return false
	}
	a.finish(c, time.Now())
	return true
}

// finish is called once a chore is done with: it lets go of its lease,
// and marks an abandon as done with; reclaim remembers it for ghostSettle,
// as a retry may have met the reservation just before the worker released
// it.
func (a *aftercare) finish(c *chore, now time.Time) {
	if c.kind != choreAbandon {
		c.lease.stop()
		c.lease = nil // one chore, one hold
		return
	}
	a.mu.Lock()
	if c.finished.IsZero() {
		c.finished = now
	}
	a.mu.Unlock()
}

func (a *aftercare) isFinished(c *chore) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return !c.finished.IsZero()
}

// forgetFinished drops the abandons finished more than ghostSettle ago;
// the caller holds a.mu.
func (a *aftercare) forgetFinished(now time.Time) {
	for k, c := range a.abandoned {
		if !c.finished.IsZero() && now.Sub(c.finished) > ghostSettle {
			delete(a.abandoned, k)
		}
	}
}

// do tries the write once. The built-in stores apply their own timeout;
// choreTimeout keeps a store without one from stalling the worker.
func (c *chore) do(store settler) error {
	ctx, cancel := context.WithTimeout(context.Background(), choreTimeout)
	defer cancel()
	if c.kind == choreComplete {
		return store.Complete(ctx, c.key, c.token, c.resp, c.ttl)
	}
	return store.Release(ctx, c.key, c.token)
}
