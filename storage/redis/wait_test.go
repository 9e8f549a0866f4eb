package redis

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/redistest"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// waitResult is what one Wait call returned, and after how long.
type waitResult struct {
	err  error
	took time.Duration
}

func waitAsync(s *Store, key storage.Key, maxWait time.Duration) <-chan waitResult {
	ch := make(chan waitResult, 1)
	go func() {
		start := time.Now()
		err := s.Wait(context.Background(), key, maxWait)
		ch <- waitResult{err, time.Since(start)}
	}()
	return ch
}

// waitingOn reports once some waiter has registered on the record, so
// that a test acts only when the waiter listens.
func waitingOn(t *testing.T, s *Store, key storage.Key) {
	t.Helper()
	admin := adminClient(t, redistest.Addr())
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if admin.HExists(t.Context(), s.keyName(key), "w").Val() {
			return
		}
	}
	t.Fatal("no waiter registered within 3s")
}

func TestWaitAcrossStoresWakesOnComplete(t *testing.T) {
	// Two stores with their own clients and pub/sub connections stand for
	// two Caddy instances.
	addr := redistest.Addr()
	prefix := testPrefix()
	owner := newTestStore(t, addr, Options{KeyPrefix: prefix})
	other := newTestStore(t, addr, Options{KeyPrefix: prefix})
	key := storage.Key{Scope: "scope", ID: "across"}
	tok := acquire(t, owner, key, time.Minute)

	const waiters = 20
	results := make([]<-chan waitResult, waiters)
	for i := range results {
		results[i] = waitAsync(other, key, 10*time.Second)
	}
	waitingOn(t, other, key)
	time.Sleep(50 * time.Millisecond) // let the other waiters join too
	if err := owner.Complete(t.Context(), key, tok, textResponse("done"), time.Minute); err != nil {
		t.Fatal(err)
	}
	for i, ch := range results {
		r := <-ch
		if r.err != nil || r.took > 2*time.Second {
			t.Errorf("waiter %d: %v after %v, want woken at once", i, r.err, r.took)
		}
	}
}

func TestWaitWakesWhenTheLeaseLapses(t *testing.T) {
	s := newTestStore(t, redistest.Addr(), Options{})
	key := storage.Key{Scope: "scope", ID: "lapse"}
	acquire(t, s, key, 300*time.Millisecond) // an owner that crashed
	r := <-waitAsync(s, key, 10*time.Second)
	if r.err != nil || r.took < 200*time.Millisecond || r.took > 2*time.Second {
		t.Fatalf("Wait: %v after %v, want nil after about 300ms", r.err, r.took)
	}
	res, err := s.Reserve(t.Context(), key, fp, time.Minute)
	if err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("Reserve after the lapse: %v %v, want acquired", res.Outcome, err)
	}
}

func TestWaitWakesOnDeleteAndTakeover(t *testing.T) {
	s := newTestStore(t, redistest.Addr(), Options{})
	ctx := t.Context()

	deleted := storage.Key{Scope: "scope", ID: "deleted"}
	acquire(t, s, deleted, time.Minute)
	ch := waitAsync(s, deleted, 10*time.Second)
	waitingOn(t, s, deleted)
	if err := s.Delete(ctx, deleted); err != nil {
		t.Fatal(err)
	}
	if r := <-ch; r.err != nil || r.took > 2*time.Second {
		t.Fatalf("Wait across Delete: %v after %v", r.err, r.took)
	}

	// A waiter whose lapse timer is far off (it saw a long lease that was
	// later shortened by a renewal) still hears the takeover.
	taken := storage.Key{Scope: "scope", ID: "taken"}
	tok := acquire(t, s, taken, time.Minute)
	ch = waitAsync(s, taken, 10*time.Second)
	waitingOn(t, s, taken)
	if err := s.Renew(ctx, taken, tok, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if res, err := s.Reserve(ctx, taken, fp, time.Minute); err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("takeover: %v %v", res.Outcome, err)
	}
	if r := <-ch; r.err != nil || r.took > 2*time.Second {
		t.Fatalf("Wait across a takeover: %v after %v", r.err, r.took)
	}
}

func TestNoPublishWithoutWaiters(t *testing.T) {
	srv := redistest.StartServer(t)
	s := newTestStore(t, srv.Addr, Options{})
	mon := redistest.NewMonitor(t, srv.Addr)
	ctx := t.Context()
	cmds := mon.Commands(func() {
		for i, id := range []string{"a", "b", "c"} {
			key := storage.Key{Scope: "scope", ID: id}
			tok := acquire(t, s, key, time.Minute)
			switch i {
			case 0:
				s.Complete(ctx, key, tok, textResponse("x"), time.Minute)
			case 1:
				s.Release(ctx, key, tok)
			case 2:
				s.Delete(ctx, key)
			}
		}
	})
	for _, c := range cmds {
		for _, inner := range c.Script {
			if inner == "PUBLISH" {
				t.Fatalf("%s published with nobody waiting: %+v", c.Name, cmds)
			}
		}
	}
}

func TestWaitFailsWhenPubSubBreaks(t *testing.T) {
	srv := redistest.StartServer(t)
	s := newTestStore(t, srv.Addr, Options{Timeout: time.Second})
	key := storage.Key{Scope: "scope", ID: "broken"}
	acquire(t, s, key, time.Minute)
	admin := adminClient(t, srv.Addr)
	ch := waitAsync(s, key, 20*time.Second)
	for deadline := time.Now().Add(3 * time.Second); !admin.HExists(t.Context(), s.keyName(key), "w").Val(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no waiter registered")
		}
	}
	srv.Kill()
	// Messages may be lost with the connection: the waiter must hear of
	// it at once and poll, not sit out its 20s.
	r := <-ch
	if r.err == nil || r.took > 5*time.Second {
		t.Fatalf("Wait during an outage: %v after %v, want an error at once", r.err, r.took)
	}
	// Later waits fail fast too, without a dial per waiting request.
	start := time.Now()
	if err := s.Wait(context.Background(), key, 20*time.Second); err == nil || time.Since(start) > 3*time.Second {
		t.Fatalf("second Wait during the outage: %v after %v", err, time.Since(start))
	}
}

func TestWaitersShareOneSubscription(t *testing.T) {
	s := newTestStore(t, redistest.Addr(), Options{})
	key := storage.Key{Scope: "scope", ID: "shared"}
	tok := acquire(t, s, key, time.Minute)
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for range 50 {
		wg.Go(func() {
			errs <- s.Wait(context.Background(), key, 10*time.Second)
		})
	}
	waitingOn(t, s, key)
	s.hub.mu.Lock()
	subs := 0
	if s.hub.conn != nil {
		subs = len(s.hub.conn.subs)
	}
	s.hub.mu.Unlock()
	if subs != 1 {
		t.Errorf("%d subscriptions for one key, want 1", subs)
	}
	if err := s.Release(t.Context(), key, tok); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	// Everyone left: the channel is unsubscribed.
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	if n := len(s.hub.conn.subs); n != 0 {
		t.Errorf("%d channels still subscribed after all waiters left", n)
	}
}

func TestWaitReturnsOnCancel(t *testing.T) {
	s := newTestStore(t, redistest.Addr(), Options{})
	key := storage.Key{Scope: "scope", ID: "cancel"}
	acquire(t, s, key, time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	err := s.Wait(ctx, key, 10*time.Second)
	if !errors.Is(err, context.Canceled) || time.Since(start) > 2*time.Second {
		t.Fatalf("Wait: %v after %v, want context.Canceled soon after 200ms", err, time.Since(start))
	}
}
