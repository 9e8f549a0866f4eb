package redis

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/storagetest"
)

// TestCluster runs the store on a private three-node Redis Cluster: every
// script must keep to one slot, PUBLISH from a script must reach a waiter
// whose pub/sub connection sits on another node, and records must spread
// over the nodes (no hash tag piles them onto one).
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	addrs := redistest.StartCluster(t, 3)
	newStore := func(prefix string) *Store {
		renew, err := NewRenewClient(ClientOptions{Addrs: addrs})
		if err != nil {
			t.Fatal(err)
		}
		s := New(goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs}), Options{KeyPrefix: prefix, RenewClient: renew})
		t.Cleanup(func() { s.Close() })
		return s
	}
	prefix := testPrefix()
	s := newStore(prefix)

	t.Run("Suite", func(t *testing.T) { storagetest.Run(t, s) })

	t.Run("RecordsSpreadOverNodes", func(t *testing.T) {
		ctx := t.Context()
		for i := range 30 {
			key := storage.Key{Scope: "{same-tag}", ID: "{same-tag}" + string(rune('a'+i))}
			acquire(t, s, key, time.Minute)
		}
		counts := make(map[string]int)
		for _, addr := range addrs {
			c := goredis.NewClient(&goredis.Options{Addr: addr})
			counts[addr] = len(c.Keys(ctx, prefix+"*").Val())
			c.Close()
		}
		for addr, n := range counts {
			if n == 0 {
				t.Errorf("node %s holds no record: %v", addr, counts)
			}
		}
	})

	// One batch of renewals is one pipeline per node, sent to the nodes
	// in parallel, whatever the number of leases: three round trips for
	// 3,000 leases on three nodes, each node running the renewals of the
	// records it holds.
	t.Run("RenewBatchIsOneRoundTripPerNode", func(t *testing.T) {
		s := newStore(testPrefix())
		const n = 3000
		batch := acquireMany(t, s, n, time.Minute, 10*time.Minute)
		// Warm up: each node's connection, and the script (NOSCRIPT, then
		// EVAL, on nodes that never ran it).
		renewAll(t, s, batch, time.Minute)
		nodes := make([]*goredis.Client, len(addrs))
		before := make([]int64, len(addrs))
		for i, addr := range addrs {
			nodes[i] = adminClient(t, addr)
			before[i] = evalshaCalls(t, nodes[i])
		}
		trips := s.RenewalRoundTrips()
		renewAll(t, s, batch, time.Minute)
		if d := s.RenewalRoundTrips() - trips; d != int64(len(addrs)) {
			t.Errorf("%d leases on %d nodes renewed in %d round trips, want one per node", n, len(addrs), d)
		}
		var sum int64
		for i, node := range nodes {
			d := evalshaCalls(t, node) - before[i]
			if d == 0 {
				t.Errorf("node %s renewed none of %d leases", addrs[i], n)
			}
			sum += d
			t.Logf("node %s: %d renewals", addrs[i], d)
		}
		if sum != n {
			t.Errorf("the nodes ran %d EVALSHA for %d leases", sum, n)
		}
	})

	t.Run("WaitAcrossClients", func(t *testing.T) {
		owner, waiter := newStore(prefix), newStore(prefix)
		for i := range 6 { // keys on every node, whichever node the waiter listens on
			key := storage.Key{Scope: "scope", ID: "wait-" + string(rune('a'+i))}
			tok := acquire(t, owner, key, time.Minute)
			done := make(chan waitResult, 1)
			go func() {
				start := time.Now()
				err := waiter.Wait(context.Background(), key, time.Minute)
				done <- waitResult{err, time.Since(start)}
			}()
			c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs})
			for deadline := time.Now().Add(30 * time.Second); !c.HExists(t.Context(), owner.keyName(key), "w").Val(); time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("no waiter registered")
				}
			}
			c.Close()
			if err := owner.Complete(t.Context(), key, tok, textResponse("done"), time.Minute); err != nil {
				t.Fatal(err)
			}
			// Well under the minute the waiter would sit out unwoken.
			if r := <-done; r.err != nil || r.took > 20*time.Second {
				t.Fatalf("key %d: Wait %v after %v, want woken by the completion", i, r.err, r.took)
			}
		}
	})
}
