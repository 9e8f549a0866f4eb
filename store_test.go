package idempotency

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/memory"
)

// TestObservedStoreSeesOptionalInterfaces: an observed store does not hide what the store
// can do beyond storage.Store (the wrapper it replaced did): the memory
// store notifies waiters and finds records by key hash, and a store that
// cannot makes Wait say so.
func TestObservedStoreSeesOptionalInterfaces(t *testing.T) {
	k, _ := testKeeper(t, "keeper-test")
	if k.store.waiter == nil || k.store.finder == nil {
		t.Fatalf("waiter %v, finder %v: the memory store is both", k.store.waiter, k.store.finder)
	}
	plain := instrument(struct{ storage.Store }{memory.New(memory.Options{})}, "keeper-test", nil)
	if err := plain.Wait(context.Background(), storage.Key{Scope: "s", ID: "k"}, time.Millisecond); !errors.Is(err, errCannotWait) {
		t.Fatalf("Wait on a store that cannot notify: %v", err)
	}
	if recs, err := plain.GetByHash(context.Background(), "00", false); recs != nil || err != nil {
		t.Fatalf("GetByHash on a store that cannot: %v %v", recs, err)
	}
}

// requestsOf is the requests field of a store error's log line.
func requestsOf(e observer.LoggedEntry) int64 {
	n, _ := e.ContextMap()["requests"].(int64)
	return n
}

// TestStoreErrorLinesAreOneASecondWithACount: a hundred requests' store
// errors within a second are two lines: the first at once (requests 1,
// its key_hash), the other 99 a second later in one line (requests 99,
// the last one's key_hash and error); a second with none writes nothing,
// and the next error is logged at once again. Another store, or another
// message, has lines of its own.
func TestStoreErrorLinesAreOneASecondWithACount(t *testing.T) {
	clock := newFakeClock()
	l := newStoreErrorLog(clock, time.Second)
	core, logs := observer.New(zapcore.InfoLevel)
	logger := zap.New(core)
	a, b := memory.New(memory.Options{}), memory.New(memory.Options{})
	defer a.Close()
	defer b.Close()
	const msg = "idempotency store unavailable; rejecting the request (fail_closed)"
	fields := func(i int) []zap.Field {
		return []zap.Field{zap.Int("i", i), zap.Error(errUnreachable)}
	}
	lines := func(want int) []observer.LoggedEntry {
		t.Helper()
		var got []observer.LoggedEntry
		testutil.Eventually(t, 5*time.Second, "the log lines", func() bool {
			got = logs.All()
			return len(got) >= want
		})
		time.Sleep(10 * time.Millisecond) // and no more
		if got = logs.All(); len(got) != want {
			t.Fatalf("%d log lines, want %d: %v", len(got), want, got)
		}
		return got
	}

	for i := range 100 {
		l.log(a, logger, zapcore.ErrorLevel, msg, fields(i))
	}
	got := lines(1)
	if e := got[0]; e.Message != msg || e.Level != zapcore.ErrorLevel || requestsOf(e) != 1 || e.ContextMap()["i"] != int64(0) {
		t.Fatalf("first line: %v %v %v, want the first request's, at once, requests 1", e.Level, e.Message, e.ContextMap())
	}
	clock.advance(time.Second)
	got = lines(2)
	if e := got[1]; requestsOf(e) != 99 || e.ContextMap()["i"] != int64(99) || e.ContextMap()["error"] == nil {
		t.Fatalf("second line: %v, want requests 99 with the last request's fields", e.ContextMap())
	}
	clock.advance(time.Second) // a quiet second: nothing to say, the window ends
	lines(2)
	clock.advance(time.Second)
	l.log(a, logger, zapcore.ErrorLevel, msg, fields(200))
	if e := lines(3)[2]; requestsOf(e) != 1 || e.ContextMap()["i"] != int64(200) {
		t.Fatalf("after a quiet second: %v, want the request's line at once", e.ContextMap())
	}

	// Another store and another message are lines of their own.
	l.log(b, logger, zapcore.ErrorLevel, msg, fields(300))
	l.log(a, logger, zapcore.WarnLevel, "idempotency store unavailable; passing the request on without idempotency (fail_open)", fields(301))
	lines(5)
}

// TestStoreOutageLogsAboutOneLineASecond: requests sent without pause
// for 2.5 s to a handler whose store is down get their 503s, and the
// handler's log has about one line a second (4: at once, then after 1, 2
// and 3 s), whose requests add up to every 503; the line of the last
// requests comes a second after the previous one, without a request
// after it.
func TestStoreOutageLogsAboutOneLineASecond(t *testing.T) {
	h := isolated(t, &Handler{})
	store := withFlakyStore(h)
	core, logs := observer.New(zapcore.InfoLevel)
	h.logger = zap.New(core)
	store.down.Store(true)

	var refused atomic.Int64
	stop := time.Now().Add(2500 * time.Millisecond)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				if w := serve(h, &upstream{}, request("outage", `{}`)); w.Code != http.StatusServiceUnavailable {
					t.Errorf("during the outage: %d, want 503", w.Code)
					return
				}
				refused.Add(1)
			}
		})
	}
	wg.Wait()
	var lines []observer.LoggedEntry
	testutil.Eventually(t, 5*time.Second, "every 503 to be counted in a log line", func() bool {
		lines = logs.FilterMessage("idempotency store unavailable; rejecting the request (fail_closed)").All()
		var sum int64
		for _, e := range lines {
			sum += requestsOf(e)
		}
		return sum == refused.Load()
	})
	if n := len(lines); n < 3 || n > 5 || refused.Load() < 100 {
		t.Fatalf("%d requests refused in 2.5 s logged %d lines, want about one a second (3 to 5) for at least 100", refused.Load(), n)
	}
	for i := 1; i < len(lines); i++ {
		if gap := lines[i].Time.Sub(lines[i-1].Time); gap < 900*time.Millisecond {
			t.Fatalf("lines %d and %d %v apart, want a second", i-1, i, gap)
		}
	}
	if last := lines[len(lines)-1]; last.ContextMap()["key_hash"] == "" || last.ContextMap()["error"] == nil || last.ContextMap()["backend"] != "memory" {
		t.Fatalf("a held-back line lacks the last request's fields: %v", last.ContextMap())
	}
	t.Logf("%d requests refused, %d lines", refused.Load(), len(lines))
}
