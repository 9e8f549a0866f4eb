package idempotency

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/memory"
)

// testKeeper is a handler's keeper over a fresh memory store, without a
// handler: the store conversation on its own.
func testKeeper(t *testing.T, backend string) (*keeper, storage.Store) {
	t.Helper()
	s := memory.New(memory.Options{})
	t.Cleanup(func() { s.Close() })
	k := newKeeper(keeperOptions{store: instrument(s, backend, nil), lockTimeout: time.Minute, ttl: time.Hour, logger: zap.NewNop()})
	return k, s
}

// opCount is how many calls of op the latency histogram has seen for
// backend.
func opCount(t *testing.T, backend, op string) uint64 {
	t.Helper()
	var m dto.Metric
	if err := metrics.storeDuration.WithLabelValues(backend, op).(prometheus.Histogram).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// TestKeeperConversationWithoutAHandler runs a request's conversation
// with the store through a keeper alone: the first claim takes the key,
// a second conflicts and awaits, the completion wakes it with a replay;
// every call, the wait included, is observed in the latency histogram.
func TestKeeperConversationWithoutAHandler(t *testing.T) {
	const backend = "keeper-test"
	k, _ := testKeeper(t, backend)
	key, fp := storage.Key{Scope: "s", ID: "conversation"}, []byte("fp")
	ctx := context.Background()

	first, err := k.claim(ctx, key, fp)
	if err != nil || first.Outcome != storage.Acquired {
		t.Fatalf("first reserve: %v %v", first.Outcome, err)
	}
	l := k.holdLease(key, first.Token)
	second, err := k.claim(ctx, key, fp)
	if err != nil || second.Outcome != storage.Conflict {
		t.Fatalf("second reserve: %v %v", second.Outcome, err)
	}

	waited := make(chan storage.Reservation, 1)
	waitsBefore := opCount(t, backend, "wait")
	go func() {
		res, err := k.await(ctx, key, fp, second, time.Minute)
		if err != nil {
			t.Error(err)
		}
		waited <- res
	}()
	// Whether the waiter is registered before the completion or not
	// (the memory store's Wait returns at once for a completed record),
	// it looks again and finds the replay.
	k.complete(withLease(ctx, l), key, first.Token, &storage.Response{Status: 201, Body: []byte("done")})
	l.stop()
	res := <-waited
	if res.Outcome != storage.Replay || string(res.Record.Response.Body) != "done" {
		t.Fatalf("await: %v, want the replay of the completed record", res.Outcome)
	}
	if opCount(t, backend, "wait") == waitsBefore {
		t.Error("the wait on the store was not observed")
	}
	for _, op := range []string{"reserve", "complete"} {
		if opCount(t, backend, op) == 0 {
			t.Errorf("no %s observed", op)
		}
	}
}

// TestKeeperReleaseFreesTheKey releases a reservation through the keeper:
// the next claim takes the key again.
func TestKeeperReleaseFreesTheKey(t *testing.T) {
	k, _ := testKeeper(t, "keeper-test")
	key, fp := storage.Key{Scope: "s", ID: "release"}, []byte("fp")
	res, err := k.claim(context.Background(), key, fp)
	if err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("reserve: %v %v", res.Outcome, err)
	}
	k.release(context.Background(), key, res.Token, "test")
	if res, err := k.claim(context.Background(), key, fp); err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("reserve after release: %v %v, want the key free", res.Outcome, err)
	}
}

type detachKey struct{}

func TestDetachedContextIsWithoutCancel(t *testing.T) {
	parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), detachKey{}, "v"))
	d := detach(parent)
	cancel(errors.New("client gone"))
	if d.Err() != nil || d.Done() != nil {
		t.Fatalf("detached context: Err %v, Done %v; want neither", d.Err(), d.Done())
	}
	if _, ok := d.Deadline(); ok {
		t.Fatal("detached context has a deadline")
	}
	if cause := context.Cause(d); cause != nil {
		t.Fatalf("context.Cause of the detached context = %v, want nil as WithoutCancel's", cause)
	}
	if v := d.Value(detachKey{}); v != "v" {
		t.Fatalf("value %v, want the parent's", v)
	}
	child, stop := context.WithCancel(d)
	defer stop()
	if child.Err() != nil {
		t.Fatal("a child of the detached context is cancelled with the parent")
	}
	if detach(d) != d {
		t.Fatal("detaching a detached context makes another")
	}
}
