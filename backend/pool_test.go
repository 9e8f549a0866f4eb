package backend

import (
	"sync/atomic"
	"testing"

	"go.uber.org/zap"

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
