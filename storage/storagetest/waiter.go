package storagetest

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// The storage.Waiter contract, run for every store that implements it: a
// Wait on an in-flight record returns promptly once the record is
// completed, released, deleted or taken over, or its lease lapses, and
// when its context is done; with nothing happening it blocks for about
// maxWait.

const (
	// maxWait is long next to wakeBound, so that a Waiter that merely
	// times out fails the wake-up tests; wakeBound is long next to any
	// stall of a busy machine, so that a Waiter that wakes never does.
	// A passing test takes neither: it returns when the waiter wakes.
	maxWait   = time.Minute
	wakeAfter = 100 * time.Millisecond
	wakeBound = 20 * time.Second
)

// WaitProbe is an optional interface of the store handed to Run. A store
// that implements storage.Waiter gets it from a method in its own test
// files, which may read the store's internals; the Waiter tests then
// change a record only once a waiter listens on it, so that it is the
// change, not the waiter's first look, that wakes it. Without a probe
// they give the waiter wakeAfter to start listening, which a stalled
// machine may not honour.
type WaitProbe interface {
	// Listening reports whether a Wait call on key has registered: any
	// change to the record from now on wakes it.
	Listening(key storage.Key) bool
}

type waiterSubtest struct {
	name string
	fn   func(f *fixture, w storage.Waiter)
}

// waiterSuite lists the behaviours of a storage.Waiter, named for them.
var waiterSuite = []waiterSubtest{
	{"WaiterWakesOnComplete", testWaiterWakesOnComplete},
	{"WaiterWakesOnRelease", testWaiterWakesOnRelease},
	{"WaiterWakesOnDelete", testWaiterWakesOnDelete},
	{"WaiterWakesOnTakeover", testWaiterWakesOnTakeover},
	{"WaiterWakesWhenTheLeaseLapses", testWaiterWakesWhenTheLeaseLapses},
	{"WaiterReturnsWhenTheContextIsDone", testWaiterReturnsWhenTheContextIsDone},
	{"WaiterTimesOut", testWaiterTimesOut},
	{"WaiterOnAbsentKeyReturnsPromptly", testWaiterOnAbsentKeyReturnsPromptly},
}

// listening returns once a Wait call listens on key: as soon as the
// store's WaitProbe says so, or after wakeAfter for a store without one.
func (f *fixture) listening(key storage.Key) {
	f.t.Helper()
	probe, ok := f.store.(WaitProbe)
	if !ok {
		time.Sleep(wakeAfter)
		return
	}
	testutil.Eventually(f.t, wakeBound, "a waiter listening on "+key.ID, func() bool { return probe.Listening(key) })
}

// waitAsync waits on key on another goroutine; receive what Wait returned
// from the channel. Before act reports true, a Wait that returns nil is a
// false alarm (which the contract allows) and waits again, as callers do.
func waitAsync(f *fixture, w storage.Waiter, key storage.Key, acted *atomic.Bool) <-chan error {
	woke := make(chan error, 1)
	go func() {
		for {
			err := w.Wait(f.ctx, key, maxWait)
			if err != nil || acted.Load() {
				woke <- err
				return
			}
		}
	}()
	return woke
}

// wakes waits on key, in flight under a long lease, runs act once the
// waiter listens, and fails unless the waiter returns within wakeBound.
func wakes(f *fixture, w storage.Waiter, key storage.Key, act func()) {
	f.t.Helper()
	var acted atomic.Bool
	woke := waitAsync(f, w, key, &acted)
	f.listening(key)
	acted.Store(true)
	act()
	select {
	case err := <-woke:
		f.wantErr("Wait", err, nil)
	case <-time.After(wakeBound):
		f.t.Fatalf("Wait still blocked %v after the record changed, want it woken", wakeBound)
	}
}

// waitOut waits on key as callers do, looking again after every return
// (Wait may return early), until Reserve stops reporting a conflict or
// wakeBound has passed. It returns the last reservation and the time taken.
func waitOut(f *fixture, w storage.Waiter, key storage.Key) (storage.Reservation, time.Duration) {
	f.t.Helper()
	start := time.Now()
	for {
		if err := w.Wait(f.ctx, key, maxWait); err != nil {
			f.t.Fatalf("Wait: %v", err)
		}
		res := f.reserve(key, fpA, longLease)
		if took := time.Since(start); res.Outcome != storage.Conflict || took > wakeBound {
			return res, took
		}
	}
}

func testWaiterWakesOnComplete(f *fixture, w storage.Waiter) {
	key := f.key()
	tok := f.acquire(key, fpA, longLease)
	wakes(f, w, key, func() { f.complete(key, tok, textResponse("done"), longTTL) })
	f.replays(key, fpA, textResponse("done"))
}

func testWaiterWakesOnRelease(f *fixture, w storage.Waiter) {
	key := f.key()
	tok := f.acquire(key, fpA, longLease)
	wakes(f, w, key, func() { f.wantErr("Release", f.store.Release(f.ctx, key, tok), nil) })
	f.acquire(key, fpA, longLease) // the waiter runs the request itself
}

func testWaiterWakesOnDelete(f *fixture, w storage.Waiter) {
	key := f.key()
	f.acquire(key, fpA, longLease)
	wakes(f, w, key, func() { f.wantErr("Delete", f.store.Delete(f.ctx, key), nil) })
	f.acquire(key, fpA, longLease)
}

// testWaiterWakesOnTakeover makes sure it is the takeover that wakes the
// waiter: the waiter sees a long lease, so its own lapse timer is far off;
// the owner then shortens the lease (a renewal wakes nobody), and once it
// has lapsed another request takes the key over.
func testWaiterWakesOnTakeover(f *fixture, w storage.Waiter) {
	key := f.key()
	tok := f.acquire(key, fpA, longLease)
	var acted atomic.Bool
	woke := waitAsync(f, w, key, &acted)
	f.listening(key)
	f.wantErr("Renew", f.store.Renew(f.ctx, key, tok, shortLease), nil)
	testutil.Eventually(f.t, wakeBound, "the shortened lease to lapse", func() bool {
		_, err := f.store.Get(f.ctx, key, false)
		return errors.Is(err, storage.ErrNotFound)
	})
	select {
	case err := <-woke:
		testutil.Unavailable(f.t, "inconclusive: Wait returned (%v) before the takeover, on the renewal or the lapse, so this test cannot see the takeover wake it", err)
	default:
	}
	acted.Store(true)
	next := f.acquire(key, fpB, longLease)
	select {
	case err := <-woke:
		f.wantErr("Wait", err, nil)
	case <-time.After(wakeBound):
		f.t.Fatalf("Wait still blocked %v after the key was taken over, want it woken", wakeBound)
	}
	rec, err := f.store.Get(f.ctx, key, false)
	f.wantErr("Get after the takeover", err, nil)
	if rec.State != storage.InFlight || rec.Token != next {
		f.t.Fatalf("after the takeover Get = %v with token %d, want in flight under the new owner's %d", rec.State, rec.Token, next)
	}
}

func testWaiterWakesWhenTheLeaseLapses(f *fixture, w storage.Waiter) {
	key := f.key()
	start := time.Now()
	f.acquire(key, fpA, shortLease) // an owner that crashed: nobody completes
	err := w.Wait(f.ctx, key, maxWait)
	took := time.Since(start)
	f.wantErr("Wait", err, nil)
	if took < shortLease*9/10 || took > wakeBound {
		f.t.Fatalf("Wait on a %v lease that lapses returned %v after the Reserve, want about the lease (not maxWait %v)", shortLease, took, maxWait)
	}
	// The waiter may take the key over now (a Reserve a hair before the
	// server's lapse still conflicts: look again, as callers do).
	if res, took := waitOut(f, w, key); res.Outcome != storage.Acquired {
		f.t.Fatalf("after the lapse, and %v more waiting: %v, want acquired", took, res.Outcome)
	}
}

func testWaiterReturnsWhenTheContextIsDone(f *fixture, w storage.Waiter) {
	key := f.key()
	f.acquire(key, fpA, longLease)
	for _, c := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"cancelled", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(f.ctx)
			time.AfterFunc(wakeAfter, cancel)
			return ctx, cancel
		}, context.Canceled},
		{"past its deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(f.ctx, wakeAfter)
		}, context.DeadlineExceeded},
	} {
		ctx, cancel := c.ctx()
		start := time.Now()
		err := w.Wait(ctx, key, maxWait)
		took := time.Since(start)
		cancel()
		if !errors.Is(err, c.want) || took > wakeBound {
			f.t.Fatalf("Wait with a context %s after %v: %v after %v, want %v at once", c.name, wakeAfter, err, took, c.want)
		}
	}
	f.want(key, fpA, longLease, storage.Conflict) // the owner's lease is untouched
}

func testWaiterTimesOut(f *fixture, w storage.Waiter) {
	const wait = 600 * time.Millisecond
	key := f.key()
	f.acquire(key, fpA, longLease)
	start := time.Now()
	err := w.Wait(f.ctx, key, wait)
	took := time.Since(start)
	f.wantErr("Wait", err, nil)
	if took < wait*9/10 || took > wait+wakeBound {
		f.t.Fatalf("Wait(%v) on an idle in-flight key returned after %v", wait, took)
	}
}

func testWaiterOnAbsentKeyReturnsPromptly(f *fixture, w storage.Waiter) {
	const prompt = wakeBound // and well under maxWait
	done := f.key()
	f.complete(done, f.acquire(done, fpA, longLease), textResponse("done"), longTTL)
	for what, key := range map[string]storage.Key{"absent": f.key(), "completed": done} {
		start := time.Now()
		err := w.Wait(f.ctx, key, maxWait)
		f.wantErr("Wait on "+what+" key", err, nil)
		if took := time.Since(start); took > prompt {
			f.t.Fatalf("Wait on %s key took %v, want under %v", what, took, prompt)
		}
	}
}
