package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

// sqlCounter counts the statements a pool sends, by a word of their text.
type sqlCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

func (c *sqlCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts[strings.Fields(data.SQL)[0]]++
	return ctx
}

func (*sqlCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// total returns how many statements were sent, and resets the count.
func (c *sqlCounter) total() (n int, by map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range c.counts {
		n += k
	}
	by, c.counts = c.counts, make(map[string]int)
	return n, by
}

// TestWaitersShareOnePollPerKey puts many waiters on a few in-flight keys
// of one store: the store reads each key on its own schedule, whatever
// the number of waiters (without sharing, each waiter polling would cost
// a statement per waiter per poll), and wakes them all when the record is
// completed.
func TestWaitersShareOnePollPerKey(t *testing.T) {
	const (
		keys      = 3
		perKey    = 50
		waitFor   = 2 * time.Second
		wakeBound = 5 * time.Second
	)
	dsn := pgtest.Require(t)
	cfg, err := postgres.NewPoolConfig(dsn, 8)
	ok(t, err)
	counter := &sqlCounter{counts: make(map[string]int)}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	ok(t, err)
	s := openStore(t, pool, postgres.Options{Table: pgtest.Table(t, dsn), CreateTable: true, CleanupInterval: -1})
	ctx := t.Context()

	var tokens [keys]storage.Token
	var inFlight [keys]storage.Key
	for i := range keys {
		inFlight[i] = storage.Key{Scope: "waiters", ID: fmt.Sprint(i)}
		tokens[i] = acquire(t, s, inFlight[i], fpA, time.Hour)
	}
	counter.total()

	var woken atomic.Int64
	var wg sync.WaitGroup
	began := time.Now()
	for i := range keys * perKey {
		wg.Go(func() {
			if err := s.Wait(ctx, inFlight[i%keys], time.Minute); err != nil {
				t.Errorf("waiter %d: %v", i, err)
			}
			woken.Add(1)
		})
	}
	for i := range keys {
		testutil.Eventually(t, wakeBound, "a poller listening", func() bool { return s.Listening(inFlight[i]) })
	}
	time.Sleep(waitFor)
	if n := woken.Load(); n != 0 {
		t.Fatalf("%d waiters returned before anything happened", n)
	}
	polls, by := counter.total()
	waited := time.Since(began)
	// Each key's poller reads at once, then after 10ms, 20ms, ... up to
	// 250ms apart: a slower machine only reads less.
	bound := keys * (6 + int(waited/(250*time.Millisecond)) + 1)
	t.Logf("%d waiters on %d keys for %v: %d statements %v (bound %d)", keys*perKey, keys, waited.Round(time.Millisecond), polls, by, bound)
	if polls > bound {
		t.Errorf("%d waiters on %d keys sent %d statements in %v, want at most %d", keys*perKey, keys, polls, waited, bound)
	}

	for i := range keys {
		ok(t, s.Complete(ctx, inFlight[i], tokens[i], &storage.Response{Status: 201}, time.Hour))
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(wakeBound):
		t.Fatalf("%d of %d waiters woken %v after the completions", woken.Load(), keys*perKey, wakeBound)
	}
}

// TestWaiterSeesATakeoverBetweenTwoWaits: a waiter that returned (a false
// alarm, or its own timeout) and waits again must learn of a takeover that
// happened in between, not take the new lease for the one it waited on.
func TestWaiterSeesATakeoverBetweenTwoWaits(t *testing.T) {
	s := newStore(t, postgres.Options{})
	ctx := t.Context()
	key := storage.Key{Scope: "between", ID: "k"}
	acquire(t, s, key, fpA, 150*time.Millisecond)
	ok(t, s.Wait(ctx, key, 100*time.Millisecond)) // times out: still in flight
	testutil.Eventually(t, 5*time.Second, "the lease to lapse", func() bool {
		_, err := s.Get(ctx, key, false)
		return err != nil
	})
	acquire(t, s, key, fpB, time.Hour) // another request takes it over
	began := time.Now()
	ok(t, s.Wait(ctx, key, 5*time.Second))
	if took := time.Since(began); took > 2*time.Second {
		t.Fatalf("Wait after a takeover it did not see took %v, want it to return at once", took)
	}
}
