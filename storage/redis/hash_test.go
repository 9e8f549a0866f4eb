package redis

import (
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// TestListInFlightFillsPagesPastLapsedLeases: a lease that lapsed keeps
// its key (and its token) a while, so the scan finds it, but it is no
// longer in flight. It must not take a place in a page: a short page
// reads as the last one, and the admin API would stop listing there.
func TestListInFlightFillsPagesPastLapsedLeases(t *testing.T) {
	addr := redistest.Addr()
	s := newTestStore(t, addr, Options{})
	admin := adminClient(t, addr)
	ctx := t.Context()
	// Lapsed leases whose key hashes sort before any other.
	for _, d := range []string{"0", "1"} {
		name := s.prefix + strings.Repeat(d, 32)
		if err := admin.HSet(ctx, name, "f", fp, "t", "7", "c", 1, "e", 2).Err(); err != nil {
			t.Fatal(err)
		}
		admin.Expire(ctx, name, time.Hour)
	}
	key := storage.Key{Scope: "s", ID: "running"}
	tok := acquire(t, s, key, time.Hour)

	for _, limit := range []int{1, 2, 3} {
		recs, err := s.ListInFlight(ctx, "", limit)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != 1 || recs[0].KeyHash != key.Hash() || recs[0].Record.Token != tok {
			t.Fatalf("ListInFlight(\"\", %d) = %+v, want the one record in flight", limit, recs)
		}
	}
}
