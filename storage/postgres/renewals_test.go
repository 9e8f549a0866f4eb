package postgres

import (
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// TestRenewalsForgetWhatWasAskedOnceNoneHoldsIt is a review finding: a
// RenewBatch that finds a lease in a renewal on its way (an earlier
// call's, slow, or the waiting renewal's) marks it asked, and only the
// waiting renewal's ticker forgets the mark. A mark made while an earlier
// call held the lease, or after the waiting renewal's last tick, stayed
// for the life of the store: one entry per such lease, every lease of a
// slow store's overlapping ticks (an outage) among them.
func TestRenewalsForgetWhatWasAskedOnceNoneHoldsIt(t *testing.T) {
	var rr renewals
	r := &storage.Renewal{Key: storage.Key{Scope: "s", ID: "k"}, Token: 7}
	held := rr.take([]*storage.Renewal{r}) // a slow call holds it
	if len(held) != 1 {
		t.Fatalf("the first call took %d leases, want 1", len(held))
	}
	if again := rr.take([]*storage.Renewal{r}); len(again) != 0 {
		t.Fatalf("the next tick took %d leases, want none (the first call answers for it)", len(again))
	}
	rr.let(held)
	if len(rr.m) != 0 || len(rr.asked) != 0 {
		t.Fatalf("once no renewal holds the lease: %d held, %d asked marks left, want none", len(rr.m), len(rr.asked))
	}
}
