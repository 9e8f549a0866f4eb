package redis

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
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

// Listening implements storagetest.WaitProbe for the conformance suite
// (redis_test.go): a waiter registers on the record (field w) once its
// subscription is confirmed.
func (s *Store) Listening(key storage.Key) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	listening, err := s.client.HExists(ctx, s.keyName(key), "w").Result()
	return err == nil && listening
}

// waitingOn returns once some waiter has registered on the record, so
// that a test acts only when the waiter listens.
func waitingOn(t *testing.T, s *Store, key storage.Key) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, "a waiter registered on "+key.ID, func() bool { return s.Listening(key) })
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
		results[i] = waitAsync(other, key, time.Minute)
	}
	// Waiters that have not joined by the completion see the record
	// completed when they look, and return at once as well.
	waitingOn(t, other, key)
	if err := owner.Complete(t.Context(), key, tok, textResponse("done"), time.Minute); err != nil {
		t.Fatal(err)
	}
	for i, ch := range results {
		r := <-ch
		// Well under the minute a waiter would sit out unwoken.
		if r.err != nil || r.took > 20*time.Second {
			t.Errorf("waiter %d: %v after %v, want woken at once", i, r.err, r.took)
		}
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
	ch := waitAsync(s, key, time.Minute)
	waitingOn(t, s, key)
	srv.Kill()
	// Messages may be lost with the connection: the waiter must hear of
	// it at once and poll, not sit out its minute.
	r := <-ch
	if r.err == nil || r.took > 20*time.Second {
		t.Fatalf("Wait during an outage: %v after %v, want an error at once", r.err, r.took)
	}
	// Later waits fail fast too, without a dial per waiting request.
	start := time.Now()
	if err := s.Wait(context.Background(), key, time.Minute); err == nil || time.Since(start) > 20*time.Second {
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
			errs <- s.Wait(context.Background(), key, time.Minute)
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
