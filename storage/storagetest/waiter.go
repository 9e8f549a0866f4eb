package storagetest

import (
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

const (
	// maxWait is long next to wakeAfter, so that a Waiter that merely
	// times out fails the wake-up tests.
	maxWait   = 5 * time.Second
	wakeAfter = 100 * time.Millisecond
	wakeBound = 3 * time.Second
)

// waiterTest skips fn when the store does not implement storage.Waiter.
func waiterTest(fn func(f *fixture, w storage.Waiter)) func(*fixture) {
	return func(f *fixture) {
		w, ok := f.store.(storage.Waiter)
		if !ok {
			f.t.Skip("store does not implement storage.Waiter")
		}
		fn(f, w)
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

// later runs fn on another goroutine after wakeAfter; receive its error
// from the returned channel.
func later(fn func() error) <-chan error {
	errc := make(chan error, 1)
	go func() {
		time.Sleep(wakeAfter)
		errc <- fn()
	}()
	return errc
}

func testWaiterWakesOnComplete(f *fixture, w storage.Waiter) {
	key := f.key()
	tok := f.acquire(key, fpA, longLease)
	errc := later(func() error {
		return f.store.Complete(f.ctx, key, tok, textResponse("done"), longTTL)
	})
	res, took := waitOut(f, w, key)
	f.wantErr("Complete", <-errc, nil)
	if res.Outcome != storage.Replay || took > wakeBound {
		f.t.Fatalf("after %v waiting: %v, want replay within %v", took, res.Outcome, wakeBound)
	}
	if msg := diffResponse(res.Record.Response, textResponse("done"), true); msg != "" {
		f.t.Fatalf("replay after Wait: %s", msg)
	}
}

func testWaiterWakesOnRelease(f *fixture, w storage.Waiter) {
	key := f.key()
	tok := f.acquire(key, fpA, longLease)
	errc := later(func() error { return f.store.Release(f.ctx, key, tok) })
	res, took := waitOut(f, w, key)
	f.wantErr("Release", <-errc, nil)
	if res.Outcome != storage.Acquired || took > wakeBound {
		f.t.Fatalf("after %v waiting: %v, want acquired within %v", took, res.Outcome, wakeBound)
	}
}

func testWaiterTimesOut(f *fixture, w storage.Waiter) {
	const wait = 600 * time.Millisecond
	key := f.key()
	f.acquire(key, fpA, longLease)
	start := time.Now()
	err := w.Wait(f.ctx, key, wait)
	took := time.Since(start)
	f.wantErr("Wait", err, nil)
	if took < wait*9/10 || took > wait+2*time.Second {
		f.t.Fatalf("Wait(%v) on an idle in-flight key returned after %v", wait, took)
	}
}

func testWaiterOnAbsentKeyReturnsPromptly(f *fixture, w storage.Waiter) {
	const prompt = time.Second
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
