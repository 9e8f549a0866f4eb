//go:build unix

package e2e

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// A Redis replica cut off, then the primary lost, through a real Caddy
// process on Sentinel with `durability replicas 1` (issue 38's finding):
// while a request runs, its replica is paused and its link cut (as the
// failover soak's -lag does), so that the request's completion reaches the
// primary only and its WAIT falls short. The primary then dies and the
// Sentinel promotes the replica, which holds the reservation in flight
// under the request's lease; the old primary comes back as its replica.
// The completion, sent again with its lease kept alive, lands on the
// promoted replica, and the retry is a replay. Before the fix the
// completion was accepted and never sent again: the retry got 409 until
// the lease lapsed, then ran the upstream again.
func TestACompletionShortOfItsReplicaSurvivesTheFailover(t *testing.T) {
	sentinel := redistest.StartSentinel(t, "")
	up := newUpstream(t)
	storage := fmt.Sprintf("\t\tstorage redis {\n\t\t\taddresses %s\n\t\t\tmaster_name %s\n\t\t\tkey_prefix %s\n\t\t\tdurability replicas 1 300ms\n\t\t}\n",
		sentinel.Addr, sentinel.MasterName, "e2e-"+redistest.RandomHex(4)+":")
	inst := startCaddy(t, "cut-replica", site{routes: route(up, storage)})
	// The first write may fall short while the store's first connections
	// are made: the client retries a 503.
	testutil.Eventually(t, 30*time.Second, "a key recorded with the replica in sync", func() bool {
		return post(inst.URL(), "/orders", "warm", `{"amount":1}`).isNew()
	})

	first := running(t, up, inst, "first", `{"amount":10}`, 2*time.Second)
	sentinel.Replica.Pause()
	c := goredis.NewClient(&goredis.Options{Addr: sentinel.Primary.Addr})
	err := c.Do(context.Background(), "CLIENT", "KILL", "TYPE", "replica").Err()
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	if r := <-first; !r.isNew() {
		t.Fatalf("the request whose completion its replica missed: %s, want the upstream's answer", r)
	}
	testutil.Eventually(t, 10*time.Second, "the completion's shortfall counted", func() bool {
		return durabilityTimeouts(t, inst, "complete") >= 1
	})

	sentinel.Primary.Kill()
	sentinel.Replica.Resume()
	// Once the Sentinel promoted the replica, the old primary comes back
	// as its replica (empty: it had no persistence), so that the promoted
	// one takes writes again with durability replicas 1.
	sc := goredis.NewSentinelClient(&goredis.Options{Addr: sentinel.Addr})
	defer sc.Close()
	testutil.Eventually(t, time.Minute, "the replica promoted", func() bool {
		addr, err := sc.GetMasterAddrByName(context.Background(), sentinel.MasterName).Result()
		return err == nil && len(addr) == 2 && net.JoinHostPort(addr[0], addr[1]) == sentinel.Replica.Addr
	})
	sentinel.Primary.Restart(t)
	host, port, _ := net.SplitHostPort(sentinel.Replica.Addr)
	c = goredis.NewClient(&goredis.Options{Addr: sentinel.Primary.Addr})
	err = c.ReplicaOf(context.Background(), host, port).Err()
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	var r reply
	testutil.Eventually(t, time.Minute, "the retry answered on the promoted replica", func() bool {
		r = post(inst.URL(), "/orders", "first", `{"amount":10}`)
		return r.status != 503 && !r.isConflict()
	})
	if !r.isReplayOf(1) {
		t.Fatalf("the retry after the failover: %s, want the replay", r)
	}
	assertExecutions(t, up, "first", 1)
}
