package idempotency

import (
	"sync/atomic"
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/memory"
)

type closeCounter struct {
	storage.Store
	closed atomic.Int32
}

func (c *closeCounter) Close() error { c.closed.Add(1); return c.Store.Close() }

func TestPooledStoreClosesAfterItsLastRunningRequest(t *testing.T) {
	inner := &closeCounter{Store: memory.New(memory.Options{})}
	s, err := acquireStore("test", "test:deferred-close", func() (storage.Store, error) { return inner, nil })
	if err != nil {
		t.Fatal(err)
	}
	p := pooledFor(s)
	if p == nil {
		t.Fatal("a pooled store is not registered")
	}
	release, ok := p.hold()
	if !ok {
		t.Fatal("hold failed on an open store")
	}
	if err := releaseStore("test:deferred-close"); err != nil { // the last handler goes
		t.Fatal(err)
	}
	if n := inner.closed.Load(); n != 0 {
		t.Fatalf("closed %d times while a request still runs on it", n)
	}
	release()
	if n := inner.closed.Load(); n != 1 {
		t.Fatalf("closed %d times after the last request, want 1", n)
	}
	if pooledFor(s) != nil {
		t.Fatal("a closed store is still registered")
	}
	if _, ok := p.hold(); ok {
		t.Fatal("hold succeeded on a closed store")
	}
}

func TestPooledStoreWithoutRunningRequestsClosesAtOnce(t *testing.T) {
	inner := &closeCounter{Store: memory.New(memory.Options{})}
	if _, err := acquireStore("test", "test:idle-close", func() (storage.Store, error) { return inner, nil }); err != nil {
		t.Fatal(err)
	}
	if err := releaseStore("test:idle-close"); err != nil {
		t.Fatal(err)
	}
	if n := inner.closed.Load(); n != 1 {
		t.Fatalf("closed %d times, want 1", n)
	}
}
