package backend

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/memory"
)

type closeCounter struct {
	storage.Store
	closed atomic.Int32
}

func (c *closeCounter) Close() error { c.closed.Add(1); return c.Store.Close() }

func TestPooledStoreClosesAfterItsLastHold(t *testing.T) {
	inner := &closeCounter{Store: memory.New(memory.Options{})}
	var b Pooled
	if err := b.Acquire(zap.NewNop(), "test", "deferred-close", "", func() (storage.Store, error) { return inner, nil }); err != nil {
		t.Fatal(err)
	}
	release, ok := b.HoldStore()
	if !ok {
		t.Fatal("hold failed on an open store")
	}
	if err := b.Cleanup(); err != nil { // the last handler goes
		t.Fatal(err)
	}
	if n := inner.closed.Load(); n != 0 {
		t.Fatalf("closed %d times while a request still holds it", n)
	}
	release()
	if n := inner.closed.Load(); n != 1 {
		t.Fatalf("closed %d times after the last hold, want 1", n)
	}
	if _, ok := b.HoldStore(); ok {
		t.Fatal("hold succeeded on a closed store")
	}
}

func TestPooledStoreWithoutHoldsClosesAtOnce(t *testing.T) {
	inner := &closeCounter{Store: memory.New(memory.Options{})}
	var b Pooled
	if err := b.Acquire(zap.NewNop(), "test", "idle-close", "", func() (storage.Store, error) { return inner, nil }); err != nil {
		t.Fatal(err)
	}
	if err := b.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if n := inner.closed.Load(); n != 1 {
		t.Fatalf("closed %d times, want 1", n)
	}
	if err := b.Cleanup(); err != nil { // a second Cleanup deletes nothing
		t.Fatal(err)
	}
}

func TestPooledBackendsShareOneStorePerConfiguration(t *testing.T) {
	opened := 0
	open := func() (storage.Store, error) { opened++; return memory.New(memory.Options{}), nil }
	var a, b, c Pooled
	for _, x := range []struct {
		b   *Pooled
		cfg any
	}{{&a, "one"}, {&b, "one"}, {&c, "two"}} {
		if err := x.b.Acquire(zap.NewNop(), "test", x.cfg, "", open); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { x.b.Cleanup() })
	}
	if a.Store() != b.Store() || a.Store() == c.Store() || opened != 2 {
		t.Fatalf("stores: a==b %v, a==c %v, opened %d; want one store per configuration", a.Store() == b.Store(), a.Store() == c.Store(), opened)
	}
}

// slowPinger is a store whose Ping answers err once let go, unless the
// store was closed first ("closed pool", as pgxpool says).
type slowPinger struct {
	storage.Store
	pinging, answer chan struct{}
	closed          atomic.Bool
	err             error
}

func (s *slowPinger) Ping(ctx context.Context) error {
	close(s.pinging)
	<-s.answer
	if s.closed.Load() {
		return errors.New("closed pool")
	}
	return s.err
}

func (s *slowPinger) Close() error { s.closed.Store(true); return s.Store.Close() }

// A configuration unloaded while its store's first ping is out (caddy
// validate unloads it at once) closes the store only once the ping is
// done, so that the warning names what the ping found, not the pool
// closed under it (issue 28).
func TestAStoreIsNotClosedUnderItsStartPing(t *testing.T) {
	inner := &slowPinger{Store: memory.New(memory.Options{}), pinging: make(chan struct{}), answer: make(chan struct{}),
		err: fmt.Errorf("%w: password authentication failed", storage.ErrUnavailable)}
	core, logs := observer.New(zap.WarnLevel)
	var b Pooled
	if err := b.Acquire(zap.New(core), "test", "slow-ping", "", func() (storage.Store, error) { return inner, nil }); err != nil {
		t.Fatal(err)
	}
	<-inner.pinging
	cleaned := make(chan error)
	go func() { cleaned <- b.Cleanup() }()
	select {
	case err := <-cleaned:
		t.Fatalf("Cleanup returned (%v) while the start ping was out", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(inner.answer)
	if err := <-cleaned; err != nil {
		t.Fatal(err)
	}
	if !inner.closed.Load() {
		t.Error("the store was not closed after the ping")
	}
	var got []string
	for _, e := range logs.All() {
		got = append(got, e.Message+": "+e.ContextMap()["error"].(string))
	}
	if len(got) != 1 || !strings.Contains(got[0], "password authentication failed") {
		t.Errorf("warnings %q, want one naming the ping's cause", got)
	}
}

// factsStore is a store that pings and says err about its durability.
type factsStore struct {
	storage.Store
	err error
}

func (factsStore) Ping(context.Context) error { return nil }
func (s factsStore) Durability(context.Context) (any, error) {
	return map[string]any{"replicas": 1}, s.err
}

// The start-up line of a store that answered but cannot keep its records
// as configured warns, and says that requests follow on_storage_error
// only when they will (the error is unavailable: a standby, a Redis
// primary short of the replicas that durability waits for with
// on_timeout fail); otherwise (on_timeout proceed) it says they go on.
func TestAStoreShortOfItsDurabilityWarnsAtStart(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: 0 connected replicas", storage.ErrUnavailable), "requests using it follow on_storage_error"},
		{errors.New("0 connected replicas, then runs unreplicated (on_timeout proceed)"), "requests using it go on"},
	} {
		core, logs := observer.New(zap.WarnLevel)
		var b Pooled
		if err := b.Acquire(zap.New(core), "test", "facts-"+tc.want, "", func() (storage.Store, error) {
			return factsStore{Store: memory.New(memory.Options{}), err: tc.err}, nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := b.Cleanup(); err != nil { // waits for the start ping
			t.Fatal(err)
		}
		got := logs.All()
		if len(got) != 1 || !strings.Contains(got[0].Message, tc.want) || got[0].ContextMap()["error"] != tc.err.Error() {
			t.Errorf("%v: warnings %+v, want one saying %q", tc.err, got, tc.want)
		}
	}
}

// outOfOrderStore answers the first Ping and the first Durability it is
// asked only once let go, and every later one at once: the first answers
// "up" (no error, facts of call 1), the later ones "down".
type outOfOrderStore struct {
	storage.Store
	pings, facts    atomic.Int32
	asked, answered chan struct{}
}

func (s *outOfOrderStore) Ping(context.Context) error {
	if s.pings.Add(1) == 1 {
		s.asked <- struct{}{}
		<-s.answered
		return nil
	}
	return storage.ErrUnavailable
}

func (s *outOfOrderStore) Durability(context.Context) (any, error) {
	n := s.facts.Add(1)
	if n == 1 {
		s.asked <- struct{}{}
		<-s.answered
	}
	return map[string]any{"call": n}, nil
}

// TestTheLastAskedIsTheLastResult: a ping or a durability question asked
// before another and answered after it (a store that went down between
// them) does not replace the other's answer: the admin API would show a
// store that is down as up, or facts older than those it showed before.
func TestTheLastAskedIsTheLastResult(t *testing.T) {
	s := &outOfOrderStore{Store: memory.New(memory.Options{}), asked: make(chan struct{}), answered: make(chan struct{})}
	p := &pooledStore{Store: s, backend: "test"}
	ctx := t.Context()
	for _, ask := range []func(){func() { p.ping(ctx) }, func() { p.durability(ctx) }} {
		done := make(chan struct{})
		go func() { ask(); close(done) }()
		<-s.asked // the first question is out
		ask()     // the second is answered first
		s.answered <- struct{}{}
		<-done
	}
	if got := p.lastPing; got.Err == nil {
		t.Errorf("last ping %+v: the first ping's late answer replaced the second's", got)
	}
	if got := p.lastDurability; got.Facts.(map[string]any)["call"] != int32(2) {
		t.Errorf("last durability %+v: the first question's late answer replaced the second's", got)
	}
}

// A store constructor that panics (go-redis on a negative pool size did)
// is a configuration error, and leaves the pool's entry free: caddy's
// UsagePool unlocks an entry only when its constructor returns, so the
// next Acquire of the same configuration (a second POST /load) waited
// for ever, and with it GET /config/, POST /stop and SIGTERM (issue 38).
func TestAPanickingStoreConstructorIsAnErrorAndFreesItsEntry(t *testing.T) {
	var p Pooled
	err := p.Acquire(zap.NewNop(), "test", "panics", "", func() (storage.Store, error) { panic("makechan: size out of range") })
	if err == nil || !strings.Contains(err.Error(), "test storage: building the store panicked") || !strings.Contains(err.Error(), "makechan") {
		t.Fatalf("acquire with a panicking constructor: %v, want an error saying so", err)
	}
	done := make(chan error, 1)
	var q Pooled
	go func() {
		done <- q.Acquire(zap.NewNop(), "test", "panics", "", func() (storage.Store, error) { return memory.New(memory.Options{}), nil })
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("acquiring the same configuration again: %v", err)
		}
		q.Cleanup()
	case <-time.After(10 * time.Second):
		t.Fatal("acquiring the same configuration again after a panic did not return within 10s: the pool's entry stayed locked")
	}
}

// TestAClosedStoresSeriesAreForgotten: a store that closes (no config uses
// it) takes its durability timeouts' series with it, as its health
// series; before, each store a reload replaced stayed in the metrics.
func TestAClosedStoresSeriesAreForgotten(t *testing.T) {
	var b Pooled
	if err := b.Acquire(zap.NewNop(), "test", "forgotten-series", "", func() (storage.Store, error) { return memory.New(memory.Options{}), nil }); err != nil {
		t.Fatal(err)
	}
	id := b.StoreID() // "" once released
	series := func() int {
		n := 0
		for _, op := range []string{"reserve", "complete"} {
			if durabilityTimeouts.DeleteLabelValues("test", id, op) {
				n++
				durabilityTimeouts.WithLabelValues("test", id, op) // put back, at zero
			}
		}
		return n
	}
	CountDurabilityTimeout("test", id, "reserve")
	CountDurabilityTimeout("test", id, "complete")
	if n := series(); n != 2 {
		t.Fatalf("%d durability series while the store is open, want 2", n)
	}
	if err := b.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if n := series(); n != 0 {
		t.Fatalf("%d durability series of the closed store left, want 0", n)
	}
}
