package redis

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/storagetest"
)

// shortfalls records the calls of Durability.OnShortfall.
type shortfalls struct {
	mu  sync.Mutex
	ops []string
}

func (s *shortfalls) add(op string, acked int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ops = append(s.ops, fmt.Sprintf("%s:%d", op, acked))
}

func (s *shortfalls) take() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := strings.Join(s.ops, " ")
	s.ops = nil
	return out
}

// TestDurabilityWaitsForTheReplica runs the store with durability
// replicas 1 on a private primary with one replica: the conformance
// suite passes, each reservation and completion is followed by WAIT in
// its own round trip, and once the replica is gone the timeout path
// fires: a reservation fails as a store error (ErrUnavailable,
// ErrNotReplicated) and is counted, or, with Proceed, goes on and is
// counted; a completion is counted and fails so too, to be sent again,
// with Proceed as well.
func TestDurabilityWaitsForTheReplica(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a primary and a replica")
	}
	primary := redistest.StartServer(t)
	replica := redistest.StartReplica(t, primary)
	var short shortfalls
	prefix := testPrefix()
	newStore := func(proceed bool) *Store {
		// WAIT's timeout is generous, so that a loaded machine's
		// replica is never late while in sync.
		return newTestStore(t, primary.Addr, Options{KeyPrefix: prefix, Timeout: 4 * time.Second, Durability: Durability{
			Replicas: 1, Timeout: time.Second, Proceed: proceed, OnShortfall: short.add}})
	}
	s, sProceed := newStore(false), newStore(true)

	t.Run("Suite", func(t *testing.T) { storagetest.Run(t, s) })
	if got := short.take(); got != "" {
		t.Fatalf("shortfalls with the replica in sync: %s", got)
	}

	t.Run("WaitFollowsEachWrite", func(t *testing.T) {
		mon := redistest.NewMonitor(t, primary.Addr)
		key := storage.Key{Scope: "s", ID: "waited-" + redistest.RandomHex(4)}
		var tok storage.Token
		cmds := mon.Commands(func() {
			tok = acquire(t, s, key, time.Minute)
			if err := s.Complete(t.Context(), key, tok, textResponse("done"), time.Hour); err != nil {
				t.Fatal(err)
			}
		})
		if got, want := names(cmds), "evalsha[TIME HMGET HSET PEXPIRE], wait, evalsha[TIME HMGET HDEL HSET PEXPIRE], wait"; got != want {
			t.Fatalf("commands %q, want %q", got, want)
		}
		// The completion sent again (its WAIT fell short) writes its
		// token field again, so that its WAIT covers the first one too.
		cmds = mon.Commands(func() {
			if err := s.Complete(t.Context(), key, tok, textResponse("done"), time.Hour); !errors.Is(err, storage.ErrLeaseLost) || storage.Unavailable(err) {
				t.Fatalf("the completion sent again: %v; want ErrLeaseLost (completed by this lease already)", err)
			}
		})
		if got, want := names(cmds), "evalsha[TIME HMGET HSET], wait"; got != want {
			t.Fatalf("the completion sent again: commands %q, want %q", got, want)
		}
		// A release is not waited for (a lost one leaves a 409 until
		// the lease lapses, never a second run).
		key2 := storage.Key{Scope: "s", ID: "released-" + redistest.RandomHex(4)}
		tok2 := acquire(t, s, key2, time.Minute)
		cmds = mon.Commands(func() {
			if err := s.Release(t.Context(), key2, tok2); err != nil {
				t.Fatal(err)
			}
		})
		if got, want := names(cmds), "evalsha[TIME HMGET DEL]"; got != want {
			t.Fatalf("release: commands %q, want %q", got, want)
		}
	})

	replica.Kill()

	t.Run("ReserveFailsWithoutTheReplica", func(t *testing.T) {
		key := storage.Key{Scope: "s", ID: "unreplicated-" + redistest.RandomHex(4)}
		start := time.Now()
		res, err := s.Reserve(t.Context(), key, fp, time.Minute)
		if !errors.Is(err, ErrNotReplicated) || !storage.Unavailable(err) {
			t.Fatalf("Reserve: %v, want ErrNotReplicated and ErrUnavailable", err)
		}
		if took := time.Since(start); took < time.Second {
			t.Fatalf("Reserve failed after %v, before WAIT's timeout", took)
		}
		if res.Token == 0 {
			t.Fatal("the failed Reserve gave no token to release its reservation with")
		}
		if got := short.take(); got != "reserve:0" {
			t.Fatalf("shortfalls %q, want reserve:0", got)
		}
		// The caller releases it, as after any failed Reserve.
		if err := s.Release(t.Context(), key, res.Token); err != nil {
			t.Fatalf("Release of the unreplicated reservation: %v", err)
		}
		// A replay writes nothing and falls short of nothing.
		done := storage.Key{Scope: "s", ID: "done-" + redistest.RandomHex(4)}
		tok := acquire(t, sProceed, done, time.Minute)
		if err := sProceed.Complete(t.Context(), done, tok, textResponse("x"), time.Hour); !errors.Is(err, ErrNotReplicated) {
			t.Fatal(err) // recorded on the primary, to be sent again
		}
		short.take()
		if res, err := s.Reserve(t.Context(), done, fp, time.Minute); err != nil || res.Outcome != storage.Replay {
			t.Fatalf("Reserve of a completed key: %v, %v; want a replay", res.Outcome, err)
		}
		if got := short.take(); got != "" {
			t.Fatalf("shortfalls of a replay: %q", got)
		}
	})

	t.Run("ProceedGoesOn", func(t *testing.T) {
		key := storage.Key{Scope: "s", ID: "proceed-" + redistest.RandomHex(4)}
		tok := acquire(t, sProceed, key, time.Minute)
		if err := sProceed.Complete(t.Context(), key, tok, textResponse("x"), time.Hour); !errors.Is(err, ErrNotReplicated) || !storage.Unavailable(err) {
			t.Fatalf("Complete: %v; want ErrNotReplicated and ErrUnavailable (it is sent again)", err)
		}
		if got := short.take(); got != "reserve:0 complete:0" {
			t.Fatalf("shortfalls %q, want reserve:0 complete:0", got)
		}
	})

	t.Run("CompleteIsCountedAndFailed", func(t *testing.T) {
		key := storage.Key{Scope: "s", ID: "complete-" + redistest.RandomHex(4)}
		tok := acquire(t, sProceed, key, time.Minute)
		short.take()
		if err := s.Complete(t.Context(), key, tok, textResponse("x"), time.Hour); !errors.Is(err, ErrNotReplicated) || !storage.Unavailable(err) {
			t.Fatalf("Complete: %v; want ErrNotReplicated and ErrUnavailable", err)
		}
		if got := short.take(); got != "complete:0" {
			t.Fatalf("shortfalls %q, want complete:0", got)
		}
		// The record is on the primary all the same: its replay is served.
		if res, err := sProceed.Reserve(t.Context(), key, fp, time.Minute); err != nil || res.Outcome != storage.Replay {
			t.Fatalf("Reserve of the completed key: %v, %v; want a replay", res.Outcome, err)
		}
		short.take()
	})

	t.Run("Facts", func(t *testing.T) {
		// Fewer replicas connected than the option asks for: the facts
		// come with the error the start-up line warns with, unavailable
		// (every reservation will fail as a store error) unless it is
		// proceed (every reservation runs unreplicated).
		d, err := s.Durability(t.Context())
		if !storage.Unavailable(err) || !strings.Contains(fmt.Sprint(err), primary.Addr+" has 0 connected replicas, fewer than durability replicas 1") {
			t.Fatalf("facts without the replica: %v; want an unavailable error naming the shortfall", err)
		}
		if _, err := sProceed.Durability(t.Context()); err == nil || storage.Unavailable(err) || !strings.Contains(err.Error(), "on_timeout proceed") {
			t.Fatalf("facts without the replica, proceed: %v; want an error that is not unavailable", err)
		}
		f := d.(DurabilityFacts)
		if f.Option["replicas"] != 1 || f.Option["on_timeout"] != "fail" || f.Option["timeout"] != "1s" || f.Option["command"] != "WAIT" {
			t.Fatalf("option %v", f.Option)
		}
		if len(f.Nodes) != 1 {
			t.Fatalf("nodes %+v, want the primary", f.Nodes)
		}
		n := f.Nodes[0]
		if n.Addr != primary.Addr || n.Role != "master" || n.ConnectedReplicas != "0" || n.AppendOnly != "no" ||
			n.AppendFsync == unknown || n.MinReplicasToWrite != "0" || n.Version == unknown || n.Error != "" {
			t.Fatalf("facts %+v", n)
		}
	})

	replica.Restart(t)
	t.Run("BackInSync", func(t *testing.T) {
		key := storage.Key{Scope: "s", ID: "resynced-" + redistest.RandomHex(4)}
		// The restarted replica reconnects and syncs again: until then
		// reservations fall short.
		var tok storage.Token
		deadline := time.Now().Add(30 * time.Second)
		for {
			res, err := s.Reserve(t.Context(), key, fp, time.Minute)
			if err == nil {
				tok = res.Token
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("Reserve with the replica back: %v", err)
			}
			s.Release(t.Context(), key, res.Token)
		}
		short.take()
		if err := s.Complete(t.Context(), key, tok, textResponse("x"), time.Hour); err != nil {
			t.Fatal(err)
		}
		if got := short.take(); got != "" {
			t.Fatalf("shortfalls in sync: %q", got)
		}
		d, err := s.Durability(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		f := d.(DurabilityFacts)
		if f.Nodes[0].ConnectedReplicas != "1" {
			t.Fatalf("facts %+v, want one connected replica", f.Nodes[0])
		}
	})
}

// TestDurabilityCheck covers the option's rules.
func TestDurabilityCheck(t *testing.T) {
	for _, c := range []struct {
		d       Durability
		timeout time.Duration
		want    string
	}{
		{Durability{}, 0, ""},
		{Durability{Replicas: 1}, 2 * time.Second, ""},
		{Durability{Replicas: 2, Timeout: 500 * time.Millisecond}, time.Second, ""},
		{Durability{Replicas: -1}, 0, "must not be negative"},
		{Durability{Replicas: 1, Timeout: -time.Second}, 0, "must be positive"},
		{Durability{Replicas: 1, Timeout: time.Microsecond}, 0, "at least 1ms"},
		{Durability{Replicas: 1}, time.Second, "must be shorter than timeout"},
		{Durability{Replicas: 1, Timeout: 3 * time.Second}, 2 * time.Second, "must be shorter than timeout"},
	} {
		err := c.d.Check(c.timeout)
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v, timeout %v: %v, want %q", c.d, c.timeout, err, c.want)
		}
	}
}

// BenchmarkDurability measures a new key (Reserve, then Complete) on a
// private primary with one replica, without durability and with
// durability replicas 1: from one goroutine (the latency WAIT adds) and
// from 64 (the throughput it costs, batches sharing one WAIT).
//
//	bin/testservers -- go test ./storage/redis -run '^$' -bench Durability -benchtime 20000x
func BenchmarkDurability(b *testing.B) {
	primary := redistest.StartServer(b)
	redistest.StartReplica(b, primary)
	var n atomic.Int64
	newKey := func(b *testing.B, s *Store) {
		key := storage.Key{Scope: "bench", ID: fmt.Sprintf("k%d", n.Add(1))}
		res, err := s.Reserve(b.Context(), key, fp, time.Minute)
		if err != nil || res.Outcome != storage.Acquired {
			b.Fatalf("Reserve: %v %v", res.Outcome, err)
		}
		if err := s.Complete(b.Context(), key, res.Token, textResponse("x"), time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	for _, replicas := range []int{0, 1} {
		s := newTestStore(b, primary.Addr, Options{Timeout: 2 * time.Second, Durability: Durability{Replicas: replicas, Timeout: time.Second}})
		b.Run(fmt.Sprintf("serial/replicas=%d", replicas), func(b *testing.B) {
			for b.Loop() {
				newKey(b, s)
			}
		})
		b.Run(fmt.Sprintf("parallel/replicas=%d", replicas), func(b *testing.B) {
			b.SetParallelism(64 / max(1, runtime.GOMAXPROCS(0)))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					newKey(b, s)
				}
			})
		})
	}
}

// TestDurabilityOnCluster runs the store with durability replicas 1 on a
// private Cluster of three primaries, each with a replica: the
// conformance suite passes without a shortfall, the WAIT goes to the
// node that took the write, right behind it, and with one replica killed
// only the writes of its primary fall short.
func TestDurabilityOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster with replicas")
	}
	addrs := redistest.StartCluster(t, 3)
	replicas := redistest.AddClusterReplicas(t, addrs)
	var short shortfalls
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs})
	s := New(cc, Options{KeyPrefix: testPrefix(), Timeout: 4 * time.Second,
		Durability: Durability{Replicas: 1, Timeout: time.Second, OnShortfall: short.add}})
	t.Cleanup(func() { s.Close() })

	t.Run("Suite", func(t *testing.T) { storagetest.Run(t, s) })
	if got := short.take(); got != "" {
		t.Fatalf("shortfalls with every replica in sync: %s", got)
	}

	// keyOn returns a key, named after tag, whose record lives on the
	// primary at addr.
	keyOn := func(t *testing.T, tag, addr string) storage.Key {
		for i := 0; ; i++ {
			key := storage.Key{Scope: "s", ID: fmt.Sprintf("%s-%s-%d", tag, addr, i)}
			node, err := cc.MasterForKey(t.Context(), s.keyName(key))
			if err != nil {
				t.Fatal(err)
			}
			if node.Options().Addr == addr {
				return key
			}
		}
	}

	t.Run("WaitGoesToTheNodeOfTheWrite", func(t *testing.T) {
		for _, addr := range addrs {
			key := keyOn(t, "waited", addr)
			mon := redistest.NewMonitor(t, addr)
			cmds := mon.Commands(func() { acquire(t, s, key, time.Minute) })
			if got, want := names(cmds), "evalsha[TIME HMGET HSET PEXPIRE], wait"; got != want {
				t.Fatalf("node %s: commands %q, want %q", addr, got, want)
			}
		}
	})

	replicas[0].Kill()
	t.Run("OnlyTheNodeWithoutItsReplicaFallsShort", func(t *testing.T) {
		short.take()
		if _, err := s.Reserve(t.Context(), keyOn(t, "short", addrs[0]), fp, time.Minute); !errors.Is(err, ErrNotReplicated) {
			t.Fatalf("Reserve on the primary without its replica: %v, want ErrNotReplicated", err)
		}
		for _, addr := range addrs[1:] {
			acquire(t, s, keyOn(t, "short", addr), time.Minute)
		}
		if got := short.take(); got != "reserve:0" {
			t.Fatalf("shortfalls %q, want one reserve:0", got)
		}
		// Reservations that go out in one batch: each node's share gets
		// its own WAIT, which counts that node's replicas.
		batch := make([]*call, len(addrs))
		for i, addr := range addrs {
			key := keyOn(t, "batch", addr)
			batch[i] = &call{ctx: t.Context(), script: reserveScript, keys: []string{s.keyName(key)},
				args: []any{fp, uint64(storage.NewToken()), int64(60000), int64(120000)}, durable: true, acked: -1, done: make(chan struct{})}
		}
		s.pipe.flush(batch)
		for i, c := range batch {
			want := 1
			if i == 0 {
				want = 0
			}
			if c.err != nil || c.acked != want {
				t.Errorf("batched reservation on %s: %d replicas acknowledged, %v; want %d", addrs[i], c.acked, c.err, want)
			}
		}
	})
}

// TestProceedProceedsWhileReplicasAreShort: with too few replicas every
// WAIT blocks for its whole timeout, and on_timeout proceed must still
// proceed, within the store's timeout: after a script flush (NOSCRIPT,
// then EVAL with a WAIT of its own, which gets only what is left of the
// first one's time), and for many reservations at once (a batch whose WAIT
// blocks holds no pipeline worker, so the calls behind it are not queued
// past their timeout).
func TestProceedProceedsWhileReplicasAreShort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a primary")
	}
	primary := redistest.StartServer(t)
	var shortfallCount atomic.Int64
	// Two whole WAITs (3s) would be past the store's timeout; one is 1s
	// short of it.
	s := newTestStore(t, primary.Addr, Options{KeyPrefix: testPrefix(), Timeout: 2500 * time.Millisecond, Durability: Durability{
		Replicas: 1, Timeout: 1500 * time.Millisecond, Proceed: true,
		OnShortfall: func(string, int) { shortfallCount.Add(1) }}})
	admin := goredis.NewClient(&goredis.Options{Addr: primary.Addr})
	defer admin.Close()

	if err := admin.ScriptFlush(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	key := storage.Key{Scope: "s", ID: "after-flush-" + redistest.RandomHex(4)}
	if res, err := s.Reserve(t.Context(), key, fp, time.Minute); err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("Reserve after a script flush: %v, %v; want Acquired (on_timeout proceed)", res.Outcome, err)
	}

	const n = 100
	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	for i := range n {
		wg.Go(func() {
			key := storage.Key{Scope: "s", ID: fmt.Sprintf("many-%d-%s", i, redistest.RandomHex(4))}
			res, err := s.Reserve(t.Context(), key, fp, time.Minute)
			if err != nil || res.Outcome != storage.Acquired {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, fmt.Sprintf("%v, %v", res.Outcome, err))
			}
		})
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		t.Fatalf("%d of %d concurrent reservations did not proceed (first: %v)", f, n, firstErr.Load())
	}
	if got := shortfallCount.Load(); got != n+1 {
		t.Fatalf("%d shortfalls counted, want %d", got, n+1)
	}
}

// replicaOf points the server at addr with REPLICAOF (addr "": NO ONE,
// a primary of its own).
func replicaOf(t *testing.T, server, addr string) {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: server})
	defer c.Close()
	host, port := "NO", "ONE"
	if addr != "" {
		host, port, _ = strings.Cut(addr, ":")
	}
	if err := c.ReplicaOf(t.Context(), host, port).Err(); err != nil {
		t.Fatalf("REPLICAOF %s %s on %s: %v", host, port, server, err)
	}
}

// TestACompletionShortOfItsReplicasIsSentAgainUntilOneHasIt: the replica
// is cut off (it leaves its primary, holding what it had: the
// reservation) before a request's completion: the completion's WAIT falls
// short, and Complete fails as not replicated, though the primary has the
// record and serves its replay; sent again while the replica is away, it
// fails so again. A replica promoted meanwhile would hold the reservation
// in flight under the request's lease, and the completion sent there
// lands. Once the replica follows the primary again, the completion sent
// again is acknowledged: Complete answers that the lease completed the
// record already, and the replica has it. Before the fix, the first
// Complete succeeded and nobody sent it again.
func TestACompletionShortOfItsReplicasIsSentAgainUntilOneHasIt(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a primary and a replica")
	}
	primary := redistest.StartServer(t)
	replica := redistest.StartReplica(t, primary)
	var short shortfalls
	prefix := testPrefix()
	opts := Options{KeyPrefix: prefix, Timeout: 4 * time.Second, Durability: Durability{Replicas: 1, Timeout: 300 * time.Millisecond, OnShortfall: short.add}}
	s := newTestStore(t, primary.Addr, opts)
	key := storage.Key{Scope: "s", ID: "resent-" + redistest.RandomHex(4)}
	tok := acquire(t, s, key, time.Minute)
	if got := short.take(); got != "" {
		t.Fatalf("shortfalls with the replica in sync: %s", got)
	}

	replicaOf(t, replica.Addr, "")
	err := s.Complete(t.Context(), key, tok, textResponse("done"), time.Hour)
	if !errors.Is(err, ErrNotReplicated) || !storage.Unavailable(err) {
		t.Fatalf("Complete with the replica cut off: %v; want ErrNotReplicated and ErrUnavailable", err)
	}
	if res, err := s.Reserve(t.Context(), key, fp, time.Minute); err != nil || res.Outcome != storage.Replay {
		t.Fatalf("a retry on the primary: %v, %v; want the replay", res.Outcome, err)
	}
	err = s.Complete(t.Context(), key, tok, textResponse("done"), time.Hour)
	if !errors.Is(err, ErrNotReplicated) || !storage.Unavailable(err) {
		t.Fatalf("the completion sent again with the replica still cut off: %v; want ErrNotReplicated and ErrUnavailable", err)
	}
	if got := short.take(); got != "complete:0 complete:0" {
		t.Fatalf("shortfalls %q, want complete:0 twice", got)
	}

	// The replica, a primary of its own now, is what a failover would
	// have promoted: it holds the reservation in flight, under the lease.
	onReplica := newTestStore(t, replica.Addr, Options{KeyPrefix: prefix, Timeout: 4 * time.Second})
	rec, err := onReplica.Get(t.Context(), key, false)
	if err != nil || rec.State != storage.InFlight || rec.Token != tok {
		t.Fatalf("the cut-off replica holds %+v, %v; want the reservation in flight under the lease", rec, err)
	}
	if err := onReplica.Complete(t.Context(), key, tok, textResponse("done"), time.Hour); err != nil {
		t.Fatalf("the completion sent again to the promoted replica: %v", err)
	}

	// Back as the primary's replica (a full resync: what it wrote alone
	// is dropped for the primary's data).
	replicaOf(t, replica.Addr, primary.Addr)
	testutil.Eventually(t, 30*time.Second, "the completion sent again acknowledged by the replica back in sync", func() bool {
		err = s.Complete(t.Context(), key, tok, textResponse("done"), time.Hour)
		return !errors.Is(err, ErrNotReplicated)
	})
	if !errors.Is(err, storage.ErrLeaseLost) || storage.Unavailable(err) {
		t.Fatalf("the completion sent again with the replica back: %v; want ErrLeaseLost (completed by this lease already)", err)
	}
	rec, err = onReplica.Get(t.Context(), key, true)
	if err != nil || rec.State != storage.Completed || string(rec.Response.Body) != "done" {
		t.Fatalf("the replica holds %+v, %v; want the completed record", rec, err)
	}
	// A stale lease's completion is still refused, and writes nothing.
	if err := s.Complete(t.Context(), key, tok+1, textResponse("other"), time.Hour); !errors.Is(err, storage.ErrLeaseLost) || errors.Is(err, errCompletedByLease) {
		t.Fatalf("Complete with another token: %v; want plain ErrLeaseLost", err)
	}
}
