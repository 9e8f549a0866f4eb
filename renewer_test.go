package idempotency

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
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
	// Anchored at the wall clock, so that the deadlines of batches
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

// batchCall is one RenewBatch call a hangingStore received.
type batchCall struct {
	deadline time.Time
	batch    []storage.Renewal
	answer   chan func([]storage.Renewal) error // how the call answers, once sent
}

// hangingStore's RenewBatch hangs until the test answers it, whatever its
// context says: a black-holed store that ignores deadlines, the worst
// case for the cadence.
type hangingStore struct {
	storage.Store
	calls chan batchCall
}

func newHangingStore(t *testing.T) *hangingStore {
	mem := memory.New(memory.Options{})
	t.Cleanup(func() { mem.Close() })
	return &hangingStore{Store: mem, calls: make(chan batchCall, 100)}
}

func (s *hangingStore) RenewBatch(ctx context.Context, batch []storage.Renewal) error {
	dl, _ := ctx.Deadline()
	c := batchCall{deadline: dl, batch: batch, answer: make(chan func([]storage.Renewal) error, 1)}
	s.calls <- c
	return (<-c.answer)(batch)
}

// renewed answers a batch: every lease renewed.
func renewed([]storage.Renewal) error { return nil }

// failedWith answers a batch: the batch failed with err.
func failedWith(err error) func([]storage.Renewal) error {
	return func(b []storage.Renewal) error {
		for i := range b {
			b[i].Err = err
		}
		return err
	}
}

// next waits for the next RenewBatch call. The wait is for an event the
// test caused; its bound only keeps a broken renewer from hanging the
// test.
func (s *hangingStore) next(t *testing.T, what string) batchCall {
	t.Helper()
	select {
	case c := <-s.calls:
		return c
	case <-time.After(10 * time.Second):
		t.Fatalf("no renewal batch: %s", what)
		return batchCall{}
	}
}

// none fails if a RenewBatch call is queued now.
func (s *hangingStore) none(t *testing.T, what string) {
	t.Helper()
	select {
	case <-s.calls:
		t.Fatalf("a renewal batch started: %s", what)
	default:
	}
}

// testLength is the lease of these tests: long, so that the real
// deadlines of batches never pass while a test runs.
const testLength = time.Hour

func testRenewer(t *testing.T, c *fakeClock, store storage.Store, logger *zap.Logger) *renewer {
	t.Helper()
	return newRenewer(c, store, nil, logger)
}

func holdTest(t *testing.T, r *renewer, id string, length time.Duration) *lease {
	t.Helper()
	l := r.hold(storage.Key{Scope: "s", ID: id}, storage.NewToken(), length)
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

func (r *renewer) cadenceOf(length time.Duration) *cadence {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.groups[length]
}

func (r *renewer) outstanding(length time.Duration) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.groups[length]; c != nil {
		return c.outstanding
	}
	return 0
}

// tick advances c by every and waits until the renewer has decided what
// to do about it: its next tick is set, or its groups have ended.
func tick(t *testing.T, c *fakeClock, r *renewer, every time.Duration) {
	t.Helper()
	due := c.Now().Add(every)
	c.advance(every)
	testutil.Eventually(t, 10*time.Second, "the renewer to schedule its next tick", func() bool {
		for _, at := range c.pending() {
			if at.After(due) {
				return true
			}
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.groups) == 0
	})
}

// One batch a tick renews every lease of a length, however many: the
// cost of renewing does not grow with the requests in flight.
func TestOneBatchATickRenewsEveryLease(t *testing.T) {
	c, store := newFakeClock(), newHangingStore(t)
	r := testRenewer(t, c, store, zap.NewNop())
	const n = 2000
	for i := range n {
		holdTest(t, r, fmt.Sprint(i), testLength)
	}
	every := testLength / renewals
	for round := range 3 {
		tick(t, c, r, every)
		call := store.next(t, "on the cadence")
		if len(call.batch) != n {
			t.Fatalf("round %d: a batch of %d leases, want all %d", round, len(call.batch), n)
		}
		call.answer <- renewed
		store.none(t, "a second batch in the same tick")
	}
}

func TestBatchesStartOnTheirCadenceWhateverEarlierOnesDo(t *testing.T) {
	c, store := newFakeClock(), newHangingStore(t)
	r := testRenewer(t, c, store, zap.NewNop())
	start := c.Now()
	holdTest(t, r, "k", testLength)
	cd := r.cadenceOf(testLength)
	if cd.every != testLength/10 || cd.timeout != testLength/2 {
		t.Fatalf("cadence %v, batch deadline %v; want a tenth and half of the lease", cd.every, cd.timeout)
	}

	// Each batch hangs; the next starts one cadence after the start of the
	// one before, with a deadline half a lease after its own start.
	var hanging []batchCall
	for i := 1; i <= maxOutstanding; i++ {
		store.none(t, "before its time")
		tick(t, c, r, cd.every)
		call := store.next(t, "on its cadence while the earlier ones hang")
		if want := start.Add(time.Duration(i)*cd.every + cd.timeout); !call.deadline.Equal(want) {
			t.Fatalf("batch %d: deadline %v after the lease began, want %v", i, call.deadline.Sub(start), want.Sub(start))
		}
		hanging = append(hanging, call)
	}

	// At the bound, a tick sends nothing but keeps the cadence.
	tick(t, c, r, cd.every)
	if n := r.outstanding(testLength); n != maxOutstanding {
		t.Fatalf("%d batches outstanding, want the bound %d", n, maxOutstanding)
	}
	store.none(t, "with maxOutstanding batches outstanding")

	// One answers: the next tick sends a batch again.
	hanging[0].answer <- failedWith(context.DeadlineExceeded)
	testutil.Eventually(t, 10*time.Second, "the answered batch to be counted out", func() bool { return r.outstanding(testLength) == maxOutstanding-1 })
	tick(t, c, r, cd.every)
	hanging = append(hanging[1:], store.next(t, "once below the bound"))
	for _, call := range hanging {
		call.answer <- renewed
	}
}

// A process that stalls (a GC pause, a frozen VM) for several cadences
// renews once at once when it wakes up, then on its cadence again: no
// burst, no lost beat.
func TestRenewalAfterAStallIsAtOnceAndThenOnCadence(t *testing.T) {
	c, store := newFakeClock(), newHangingStore(t)
	r := testRenewer(t, c, store, zap.NewNop())
	holdTest(t, r, "k", testLength)
	every := testLength / renewals
	c.advance(5 * every)
	call := store.next(t, "when the process wakes up")
	wake := c.Now()
	if want := wake.Add(testLength / attemptShare); !call.deadline.Equal(want) {
		t.Fatalf("deadline %v after waking up, want %v", call.deadline.Sub(wake), testLength/attemptShare)
	}
	call.answer <- renewed
	testutil.Eventually(t, 10*time.Second, "the next batch to be scheduled", func() bool { return len(c.pending()) == 1 })
	if at := c.pending()[0]; !at.Equal(wake.Add(every)) {
		t.Fatalf("next batch %v after waking up, want one cadence (%v)", at.Sub(wake), every)
	}
	store.none(t, "a burst after the stall")
}

// Leases of other lengths (handlers with other lock_timeouts on one
// store) keep their own cadence, a batch each.
func TestLeasesOfEachLengthKeepTheirOwnCadence(t *testing.T) {
	c, store := newFakeClock(), newHangingStore(t)
	r := testRenewer(t, c, store, zap.NewNop())
	holdTest(t, r, "long", testLength)
	holdTest(t, r, "short", testLength/2)
	tick(t, c, r, testLength/20)
	call := store.next(t, "the short leases' tick")
	if len(call.batch) != 1 || call.batch[0].Lease != testLength/2 {
		t.Fatalf("batch %+v, want the short lease alone", call.batch)
	}
	call.answer <- renewed
	tick(t, c, r, testLength/20)
	for range 2 {
		call := store.next(t, "both lengths' ticks")
		if len(call.batch) != 1 {
			t.Fatalf("batch of %d leases, want one of its length", len(call.batch))
		}
		call.answer <- renewed
	}
}

func TestALostLeaseIsNoLongerRenewed(t *testing.T) {
	c, store := newFakeClock(), newHangingStore(t)
	r := testRenewer(t, c, store, zap.NewNop())
	lost := holdTest(t, r, "lost", testLength)
	holdTest(t, r, "kept", testLength)
	every := testLength / renewals
	tick(t, c, r, every)
	store.next(t, "the first").answer <- func(b []storage.Renewal) error {
		for i := range b {
			if b[i].Key.ID == "lost" {
				b[i].Err = storage.ErrLeaseLost
			}
		}
		return nil
	}
	testutil.Eventually(t, 10*time.Second, "the loss to be taken", func() bool { return !lost.alive() })
	tick(t, c, r, every)
	call := store.next(t, "the second")
	if len(call.batch) != 1 || call.batch[0].Key.ID != "kept" {
		t.Fatalf("batch %+v, want the kept lease alone", call.batch)
	}
	call.answer <- renewed
	if lost.keep() != nil {
		t.Fatal("keep of a lost lease: a lease to keep alive")
	}
}

// The request and the chore that takes its write over each hold the
// lease; it is renewed until both have let go. With no lease left, the
// renewer stops ticking.
func TestALeaseIsRenewedUntilItsLastHolderStops(t *testing.T) {
	c, store := newFakeClock(), newHangingStore(t)
	r := testRenewer(t, c, store, zap.NewNop())
	l := holdTest(t, r, "k", testLength)
	every := testLength / renewals
	chore := l.keep()
	if chore == nil {
		t.Fatal("keep of a live lease: nil")
	}
	l.stop() // the request is done
	tick(t, c, r, every)
	store.next(t, "while the chore holds the lease").answer <- renewed
	chore.stop()
	tick(t, c, r, every)
	store.none(t, "after the last holder stopped")
	if len(c.pending()) != 0 || r.cadenceOf(testLength) != nil {
		t.Fatal("the renewer still ticks with no lease to renew")
	}
	chore.stop() // one stop too many changes nothing
	if l.holding() {
		t.Fatal("still held")
	}
}

// However many leases fail, and for however long, the log gets one line
// a second with their count, and one when renewals work again.
func TestRenewalFailuresAreLoggedOnceASecondWithTheirCount(t *testing.T) {
	c, store := newFakeClock(), newHangingStore(t)
	core, logs := observer.New(zapcore.InfoLevel)
	r := testRenewer(t, c, store, zap.New(core))
	const n = 500
	for i := range n {
		holdTest(t, r, fmt.Sprint(i), 2*time.Second) // a tick every 200ms
	}
	every := 200 * time.Millisecond
	for range 15 { // three seconds of failures
		tick(t, c, r, every)
		store.next(t, "on the cadence").answer <- failedWith(context.DeadlineExceeded)
		testutil.Eventually(t, 10*time.Second, "the batch to be taken", func() bool { return r.outstanding(2*time.Second) == 0 })
	}
	warned := logs.FilterMessage("renewing idempotency leases failed; retrying on their cadence").All()
	if len(warned) < 2 || len(warned) > 4 {
		t.Fatalf("%d warnings over three seconds of failing renewals, want one a second", len(warned))
	}
	total := 0
	for _, e := range warned {
		total += int(e.ContextMap()["failed"].(int64))
	}
	if total < 10*n || total > 15*n {
		t.Fatalf("the warnings count %d failed renewals, want those of the ticks they cover (%d to %d)", total, 10*n, 15*n)
	}
	tick(t, c, r, every)
	store.next(t, "once the store answers").answer <- renewed
	testutil.Eventually(t, 10*time.Second, "the recovery to be logged", func() bool {
		return logs.FilterMessage("renewing idempotency leases works again").Len() == 1
	})
}

// A store that cannot renew a batch (a third party's without
// storage.BatchRenewer) gets one Renew per lease.
func TestAStoreWithoutBatchesRenewsEachLease(t *testing.T) {
	mem := memory.New(memory.Options{})
	t.Cleanup(func() { mem.Close() })
	store := &failingStore{Store: mem}
	c := newFakeClock()
	r := testRenewer(t, c, store, zap.NewNop())
	var leases []*lease
	for i := range 3 {
		key := storage.Key{Scope: "s", ID: fmt.Sprint(i)}
		res, err := mem.Reserve(t.Context(), key, []byte("fp"), testLength)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, r.hold(key, res.Token, testLength))
	}
	tick(t, c, r, testLength/renewals)
	testutil.Eventually(t, 10*time.Second, "three renewals", func() bool { return store.renewed() == 3 })
	for _, l := range leases {
		l.stop()
	}
}

// A store's renewer leaves the registry once its last lease is done
// with, and a handler's next lease gets a renewer again.
func TestARenewerLeavesOnceIdle(t *testing.T) {
	k, _ := testKeeper(t, "renewer-test")
	key := storage.Key{Scope: "s", ID: "k"}
	res, err := k.claim(t.Context(), key, []byte("fp"))
	if err != nil {
		t.Fatal(err)
	}
	l := k.holdLease(key, res.Token)
	renewers.mu.Lock()
	r := renewers.m[k.store.store]
	renewers.mu.Unlock()
	if r == nil {
		t.Fatal("no renewer for a store with a lease")
	}
	l.stop()
	// Its group ends at its next tick (a second: lock_timeout is a
	// minute in testKeeper, too long to wait for; tick it now).
	r.tick(r.cadenceOf(time.Minute))
	renewers.mu.Lock()
	_, still := renewers.m[k.store.store]
	renewers.mu.Unlock()
	if still {
		t.Fatal("the renewer of a store without leases is still registered")
	}
	if k.holdLease(key, res.Token) == nil {
		t.Fatal("no lease once the renewer left")
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
			r := testRenewer(t, c, store, zap.NewNop())
			l := r.hold(key, res.Token, testLength)
			until := time.Now().Add(time.Hour)
			if end == "given up" {
				until = time.Now().Add(-time.Second) // at the worker's first look
				store.setDown(false)
			}
			a.add(&chore{kind: choreComplete, key: key, token: res.Token, resp: &storage.Response{Status: 201}, ttl: time.Hour, until: until, lease: l.keep()})
			l.stop() // the request is done; the chore holds on

			if end == "written" {
				tick(t, c, r, testLength/renewals)
				testutil.Eventually(t, 10*time.Second, "a renewal while the write waits", func() bool { return store.renewed() == 1 })
				store.setDown(false)
				testutil.Eventually(t, 10*time.Second, "the write to land", func() bool {
					rec, err := mem.Get(t.Context(), key, false)
					return err == nil && rec.State == storage.Completed
				})
			}
			testutil.Eventually(t, 10*time.Second, "the chore to let go of the lease", func() bool { return !l.alive() })
			before := store.renewed()
			tick(t, c, r, testLength/renewals)
			c.advance(10 * testLength / renewals)
			if store.renewed() != before {
				t.Fatal("renewed after the chore was done with")
			}
		})
	}
}
