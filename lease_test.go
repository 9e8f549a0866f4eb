package idempotency

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/memory"
)

// fakeClock is a clock that moves only when the test advances it. Due
// timers run in goroutines of their own, as time.AfterFunc's do.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c       *fakeClock
	at      time.Time
	f       func()
	stopped bool
}

func newFakeClock() *fakeClock {
	// Anchored at the wall clock, so that the deadlines of attempts
	// (context.WithDeadline) are real and far off with a long lease.
	return &fakeClock{now: time.Now()}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) stopper {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.stopped
	t.stopped = true
	return was
}

// advance moves the clock by d and fires the timers due by then.
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due, rest []*fakeTimer
	for _, t := range c.timers {
		switch {
		case t.stopped:
		case !t.at.After(c.now):
			t.stopped = true
			due = append(due, t)
		default:
			rest = append(rest, t)
		}
	}
	c.timers = rest
	c.mu.Unlock()
	for _, t := range due {
		go t.f()
	}
}

// pending is when the timers not yet fired nor stopped are due.
func (c *fakeClock) pending() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	var at []time.Time
	for _, t := range c.timers {
		if !t.stopped {
			at = append(at, t.at)
		}
	}
	return at
}

// renewal is one Renew call a hangingStore received.
type renewal struct {
	deadline time.Time
	answer   chan error // what the call returns, once sent
}

// hangingStore's Renew hangs until the test answers it, whatever its
// context says: a black-holed store that ignores deadlines, the worst
// case for the cadence.
type hangingStore struct {
	storage.Store
	renewals chan renewal
}

func newHangingStore(t *testing.T) *hangingStore {
	mem := memory.New(memory.Options{})
	t.Cleanup(func() { mem.Close() })
	return &hangingStore{Store: mem, renewals: make(chan renewal, 100)}
}

func (s *hangingStore) Renew(ctx context.Context, _ storage.Key, _ storage.Token, _ time.Duration) error {
	dl, _ := ctx.Deadline()
	r := renewal{deadline: dl, answer: make(chan error, 1)}
	s.renewals <- r
	return <-r.answer
}

// nextRenewal waits for the next Renew call. The wait is for an event
// the test caused; its bound only keeps a broken lease from hanging the
// test.
func (s *hangingStore) nextRenewal(t *testing.T, what string) renewal {
	t.Helper()
	select {
	case r := <-s.renewals:
		return r
	case <-time.After(10 * time.Second):
		t.Fatalf("no renewal attempt: %s", what)
		return renewal{}
	}
}

// noRenewal fails if a Renew call is queued now.
func (s *hangingStore) noRenewal(t *testing.T, what string) {
	t.Helper()
	select {
	case <-s.renewals:
		t.Fatalf("a renewal attempt started: %s", what)
	default:
	}
}

// testLength is the lease of these tests: long, so that the real
// deadlines of attempts never pass while a test runs.
const testLength = time.Hour

func testLease(t *testing.T, c *fakeClock, store storage.Store) *lease {
	t.Helper()
	l := holdLeaseOn(c, store, zap.NewNop(), storage.Key{Scope: "s", ID: "k"}, 1, testLength)
	t.Cleanup(func() {
		for l.holding() {
			l.stop()
		}
	})
	return l
}

func (l *lease) holding() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.holders > 0
}

// tick advances c by one cadence and waits until the lease has decided
// what to do about it: the next timer is set (or renewal has ended).
func tick(t *testing.T, c *fakeClock, l *lease) {
	t.Helper()
	due := c.Now().Add(l.every)
	c.advance(l.every)
	testutil.Eventually(t, 10*time.Second, "the lease to schedule its next attempt", func() bool {
		for _, at := range c.pending() {
			if at.After(due) {
				return true
			}
		}
		return false
	})
}

func (l *lease) outstanding() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.renewing
}

func TestRenewalsStartOnTheirCadenceWhateverEarlierOnesDo(t *testing.T) {
	c, store := newFakeClock(), newHangingStore(t)
	start := c.Now()
	l := testLease(t, c, store)
	if l.every != testLength/10 || l.timeout != testLength/20 {
		t.Fatalf("cadence %v, attempt timeout %v; want a tenth and a twentieth of the lease", l.every, l.timeout)
	}

	// Each attempt hangs; the next starts one cadence after the start of
	// the one before, with a deadline half a cadence after its own start.
	var hanging []renewal
	for i := 1; i <= maxRenewing; i++ {
		store.noRenewal(t, "before its time")
		tick(t, c, l)
		r := store.nextRenewal(t, "on its cadence while the earlier ones hang")
		if want := start.Add(time.Duration(i)*l.every + l.timeout); !r.deadline.Equal(want) {
			t.Fatalf("attempt %d: deadline %v after the lease began, want %v", i, r.deadline.Sub(start), want.Sub(start))
		}
		hanging = append(hanging, r)
	}

	// At the bound, a tick starts nothing but keeps the cadence.
	tick(t, c, l)
	if n := l.outstanding(); n != maxRenewing {
		t.Fatalf("%d attempts outstanding, want the bound %d", n, maxRenewing)
	}
	store.noRenewal(t, "with maxRenewing attempts outstanding")

	// One answers: the next tick starts an attempt again.
	hanging[0].answer <- context.DeadlineExceeded
	testutil.Eventually(t, 10*time.Second, "the answered attempt to be counted out", func() bool { return l.outstanding() == maxRenewing-1 })
	tick(t, c, l)
	hanging = append(hanging[1:], store.nextRenewal(t, "once below the bound"))
	for _, r := range hanging {
		r.answer <- nil
	}
}

// A process that stalls (a GC pause, a frozen VM) for several cadences
// renews once at once when it wakes up, then on its cadence again: no
// burst, no lost beat.
func TestRenewalAfterAStallIsAtOnceAndThenOnCadence(t *testing.T) {
	c, store := newFakeClock(), newHangingStore(t)
	l := testLease(t, c, store)
	c.advance(5 * l.every)
	r := store.nextRenewal(t, "when the process wakes up")
	wake := c.Now()
	if want := wake.Add(l.timeout); !r.deadline.Equal(want) {
		t.Fatalf("deadline %v after waking up, want %v", r.deadline.Sub(wake), l.timeout)
	}
	r.answer <- nil
	testutil.Eventually(t, 10*time.Second, "the next attempt to be scheduled", func() bool { return len(c.pending()) == 1 })
	if at := c.pending()[0]; !at.Equal(wake.Add(l.every)) {
		t.Fatalf("next attempt %v after waking up, want one cadence (%v)", at.Sub(wake), l.every)
	}
	store.noRenewal(t, "a burst after the stall")
}

func TestALostLeaseIsNoLongerRenewed(t *testing.T) {
	c, store := newFakeClock(), newHangingStore(t)
	l := testLease(t, c, store)
	tick(t, c, l)
	store.nextRenewal(t, "the first").answer <- storage.ErrLeaseLost
	testutil.Eventually(t, 10*time.Second, "renewal to end", func() bool { return len(c.pending()) == 0 })
	c.advance(10 * l.every)
	store.noRenewal(t, "after the lease was lost")
	if l.keep() != nil {
		t.Fatal("keep of a lost lease: a lease to keep alive")
	}
}

// The request and the chore that takes its write over each hold the
// lease; it is renewed until both have let go.
func TestALeaseIsRenewedUntilItsLastHolderStops(t *testing.T) {
	c, store := newFakeClock(), newHangingStore(t)
	l := testLease(t, c, store)
	chore := l.keep()
	if chore == nil {
		t.Fatal("keep of a live lease: nil")
	}
	l.stop() // the request is done
	tick(t, c, l)
	store.nextRenewal(t, "while the chore holds the lease").answer <- nil
	chore.stop()
	if len(c.pending()) != 0 {
		t.Fatal("a renewal is still scheduled after the last holder stopped")
	}
	c.advance(10 * l.every)
	store.noRenewal(t, "after the last holder stopped")
	chore.stop() // one stop too many changes nothing
	if l.holding() {
		t.Fatal("still held")
	}
}

// A chore owns its request's lease until its write is done with: renewed
// while the write waits, no longer once it succeeded, was fenced or was
// given up.
func TestAChoreKeepsItsLeaseUntilItsWriteIsDoneWith(t *testing.T) {
	for _, end := range []string{"written", "given up"} {
		t.Run(end, func(t *testing.T) {
			a, mem := newTestAftercare(t)
			store := &failingStore{Store: mem, down: true}
			a.store = store
			key := storage.Key{Scope: "s", ID: "k"}
			res, err := mem.Reserve(t.Context(), key, []byte("fp"), testLength)
			if err != nil {
				t.Fatal(err)
			}
			c := newFakeClock()
			l := holdLeaseOn(c, store, zap.NewNop(), key, res.Token, testLength)
			until := time.Now().Add(time.Hour)
			if end == "given up" {
				until = time.Now().Add(-time.Second) // at the worker's first look
				store.setDown(false)
			}
			a.add(&chore{kind: choreComplete, key: key, token: res.Token, resp: &storage.Response{Status: 201}, ttl: time.Hour, until: until, lease: l.keep()})
			l.stop() // the request is done; the chore holds on

			if end == "written" {
				tick(t, c, l)
				testutil.Eventually(t, 10*time.Second, "a renewal while the write waits", func() bool { return store.renewed() == 1 })
				store.setDown(false)
				testutil.Eventually(t, 10*time.Second, "the write to land", func() bool {
					rec, err := mem.Get(t.Context(), key, false)
					return err == nil && rec.State == storage.Completed
				})
			}
			testutil.Eventually(t, 10*time.Second, "the chore to let go of the lease", func() bool { return len(c.pending()) == 0 })
			before := store.renewed()
			c.advance(10 * l.every)
			if store.renewed() != before {
				t.Fatal("renewed after the chore was done with")
			}
		})
	}
}
