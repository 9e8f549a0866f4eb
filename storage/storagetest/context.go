package storagetest

import (
	"context"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// cancelBound is how long an operation may take on a cancelled context.
const cancelBound = 20 * time.Second

// returnsWithin fails unless fn returns within cancelBound. What fn returns
// is not judged: an in-process store may complete the work, a remote one
// should give up with an error.
func (f *fixture) returnsWithin(op string, fn func()) {
	f.t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(cancelBound):
		f.t.Fatalf("%s with a cancelled context did not return within %v", op, cancelBound)
	}
}

func testContextCancelled(f *fixture) {
	key := f.key()
	tok := f.acquire(key, fpA, longLease)
	w, isWaiter := f.store.(storage.Waiter)

	// Cancelled while blocked.
	if isWaiter {
		ctx, cancel := context.WithCancel(f.ctx)
		time.AfterFunc(wakeAfter, cancel)
		f.returnsWithin("Wait", func() { w.Wait(ctx, key, maxWait) })
		cancel()
	}

	// Cancelled before the call. Wait goes first, while key is in flight.
	ctx, cancel := context.WithCancel(f.ctx)
	cancel()
	if isWaiter {
		f.returnsWithin("Wait", func() { w.Wait(ctx, key, maxWait) })
	}
	fresh := f.key()
	f.returnsWithin("Reserve new", func() { f.store.Reserve(ctx, fresh, fpA, longLease) })
	f.returnsWithin("Reserve in flight", func() { f.store.Reserve(ctx, key, fpA, longLease) })
	f.returnsWithin("Renew", func() { f.store.Renew(ctx, key, tok, longLease) })
	f.returnsWithin("Get", func() { f.store.Get(ctx, key, true) })
	f.returnsWithin("Complete", func() { f.store.Complete(ctx, key, tok, textResponse("x"), longTTL) })
	f.returnsWithin("Release", func() { f.store.Release(ctx, key, tok) })
	f.returnsWithin("Delete", func() { f.store.Delete(ctx, key) })

	// Cancelled calls must not leave a pooled connection unusable.
	f.acquire(f.key(), fpA, longLease)
}
