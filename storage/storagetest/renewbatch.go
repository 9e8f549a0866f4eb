package storagetest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// The storage.BatchRenewer contract, run when the store implements it.
var batchRenewerSuite = []struct {
	name string
	fn   func(f *fixture, b storage.BatchRenewer)
}{
	{"RenewBatchAnswersForEachLease", testRenewBatchAnswersForEachLease},
	{"RenewBatchOfManyLeases", testRenewBatchOfManyLeases},
	{"RenewBatchCancelled", testRenewBatchCancelled},
}

func testRenewBatchAnswersForEachLease(f *fixture, b storage.BatchRenewer) {
	held, other := f.key(), f.key()
	completed, released, unknown := f.key(), f.key(), f.key()
	tHeld := f.acquire(held, fpA, shortLease)
	tOther := f.acquire(other, fpB, shortLease)
	tCompleted := f.acquire(completed, fpA, longLease)
	f.complete(completed, tCompleted, textResponse("done"), longTTL)
	tReleased := f.acquire(released, fpA, longLease)
	f.wantErr("Release", f.store.Release(f.ctx, released, tReleased), nil)

	batch := []storage.Renewal{
		{Key: held, Token: tHeld, Lease: longLease},
		{Key: completed, Token: tCompleted, Lease: longLease},
		{Key: other, Token: tOther, Lease: longLease},
		{Key: released, Token: tReleased, Lease: longLease},
		{Key: unknown, Token: storage.NewToken(), Lease: longLease},
		{Key: held, Token: tHeld + 1, Lease: longLease}, // not its token
	}
	if err := b.RenewBatch(f.ctx, batch); err != nil {
		f.t.Fatalf("RenewBatch: %v", err)
	}
	want := []error{nil, storage.ErrLeaseLost, nil, storage.ErrLeaseLost, storage.ErrLeaseLost, storage.ErrLeaseLost}
	for i, r := range batch {
		f.wantErr(fmt.Sprintf("RenewBatch's answer for lease %d", i), r.Err, want[i])
	}
	// The renewed leases outlive their first length: nobody takes the
	// keys over once it has passed.
	time.Sleep(lapse)
	f.want(held, fpA, longLease, storage.Conflict)
	f.want(other, fpB, longLease, storage.Conflict)
	f.replays(completed, fpA, textResponse("done"))

	if err := b.RenewBatch(f.ctx, nil); err != nil {
		f.t.Fatalf("RenewBatch of no lease: %v", err)
	}
}

func testRenewBatchOfManyLeases(f *fixture, b storage.BatchRenewer) {
	const n = 2000
	batch := make([]storage.Renewal, n)
	for i := range batch {
		key := f.key()
		batch[i] = storage.Renewal{Key: key, Token: f.acquire(key, fpA, shortLease), Lease: longLease}
	}
	if err := b.RenewBatch(f.ctx, batch); err != nil {
		f.t.Fatalf("RenewBatch of %d leases: %v", n, err)
	}
	for i, r := range batch {
		if r.Err != nil {
			f.t.Fatalf("RenewBatch's answer for lease %d of %d: %v", i, n, r.Err)
		}
	}
	time.Sleep(lapse)
	f.want(batch[0].Key, fpA, longLease, storage.Conflict)
	f.want(batch[n-1].Key, fpA, longLease, storage.Conflict)
	// Leases left in flight would slow the suite's listings of them.
	for _, r := range batch {
		f.wantErr("Release", f.store.Release(f.ctx, r.Key, r.Token), nil)
	}
}

func testRenewBatchCancelled(f *fixture, b storage.BatchRenewer) {
	key := f.key()
	tok := f.acquire(key, fpA, longLease)
	ctx, cancel := context.WithCancel(f.ctx)
	cancel()
	batch := []storage.Renewal{{Key: key, Token: tok, Lease: longLease}}
	var err error
	f.returnsWithin("RenewBatch", func() { err = b.RenewBatch(ctx, batch) })
	// An in-process store may renew all the same; one that did not must
	// say so for the batch and for the lease.
	if err != nil && (batch[0].Err == nil || errors.Is(batch[0].Err, storage.ErrLeaseLost)) {
		f.t.Fatalf("RenewBatch failed (%v), but its lease's answer is %v", err, batch[0].Err)
	}
	// A cancelled batch must not leave a pooled connection unusable.
	f.acquire(f.key(), fpA, longLease)
}
