package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// Waiting polls, once per key and store for all the waiters of that key.
//
// Without a Waiter, every waiting request would poll Reserve on its own:
// a transaction per waiter per poll (150 waiters on one key cost about
// 590 transactions a second). Here the waiters of a key share one poller:
// it reads the key's state, lease token and remaining lease (a cheap
// primary-key read: no lock, no write), at once and then at growing
// intervals, and wakes every waiter together when the record is not in
// flight under a live lease (completed, released, deleted, or its lease
// lapsed: the poller sleeps no longer than the lease has left, by the
// server's clock) or is in flight under another lease than it last saw
// (taken over). It stops when it woke them or when the last waiter left.
// The last lease seen is remembered for a while after that, so that a
// waiter that comes back (after a false alarm, or a wait that timed out)
// learns of a takeover that happened in between, instead of taking the new
// lease for the one it waited on.
//
// LISTEN/NOTIFY would wake waiters sooner, but every Complete and Release
// would then NOTIFY, and PostgreSQL serialises the commits of notifying
// transactions on one cluster-wide lock, a cost every request would pay
// for the few that wait; it also needs a dedicated session per store,
// which transaction-pooling proxies such as PgBouncer do not keep. A poll
// costs only the waiting: at most about 1/maxPollGap statements a second
// per key and instance, whatever the number of waiters.

const (
	// firstPollGap is the pause after a poller's first read, doubling
	// up to maxPollGap, within which waiters learn of a change.
	firstPollGap = 10 * time.Millisecond
	maxPollGap   = 250 * time.Millisecond

	// remember is how long a key's last lease is kept once nobody
	// waits on it.
	remember = 5 * time.Second
)

var _ storage.Waiter = (*Store)(nil)

// Wait implements storage.Waiter. It returns nil once the record for key
// is not in flight under a live lease (at once when it is not), or is
// under another lease than the poller last saw; after maxWait; or
// ctx.Err() when ctx is done. It returns an error when reading the record
// failed, so that the caller falls back to looking itself.
func (s *Store) Wait(ctx context.Context, key storage.Key, maxWait time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if maxWait <= 0 {
		return nil
	}
	if s.closed.Load() {
		return fmt.Errorf("postgres wait: %w: store closed", storage.ErrUnavailable)
	}
	timer := time.NewTimer(maxWait)
	defer timer.Stop()
	w, woken := s.watches.join(s, key)
	defer s.watches.leave(w)
	select {
	case <-woken.done:
		return woken.err
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// watches holds the keys waited on. The zero value is ready.
type watches struct {
	mu sync.Mutex
	m  map[storage.Key]*watch
}

// watch is one key: its waiters, its poller and what it last read. All
// fields are guarded by watches.mu.
type watch struct {
	key  storage.Key
	refs int // waiters

	// stop stops the running poller; nil when none runs.
	stop context.CancelFunc
	// woken wakes the waiters that joined since the last wake-up.
	woken *wakeUp
	// token is the last live lease read (0: none yet); listening says
	// that the running poller read it and watches for a change.
	token     int64
	listening bool
	// forget deletes the watch once nobody waited on it for remember.
	forget *time.Timer
}

// wakeUp wakes a group of waiters: done is closed when they must return,
// err (set before) says why.
type wakeUp struct {
	done chan struct{}
	err  error
}

// join adds a waiter on key, starting a poller when none runs, and returns
// the watch and what wakes the waiter. Each join must be paired with
// leave.
func (ws *watches) join(s *Store, key storage.Key) (*watch, *wakeUp) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w := ws.m[key]
	if w == nil {
		w = &watch{key: key, woken: &wakeUp{done: make(chan struct{})}}
		if ws.m == nil {
			ws.m = make(map[storage.Key]*watch)
		}
		ws.m[key] = w
	}
	if w.forget != nil {
		w.forget.Stop()
		w.forget = nil
	}
	w.refs++
	if w.stop == nil {
		ctx, stop := context.WithCancel(context.Background())
		w.stop = stop
		go s.poll(ctx, w)
	}
	return w, w.woken
}

// leave removes a waiter. The last one stops the poller; the watch is
// forgotten later, unless someone waits on the key again meanwhile.
func (ws *watches) leave(w *watch) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if w.refs--; w.refs > 0 {
		return
	}
	ws.stopLocked(w)
	w.forget = time.AfterFunc(remember, func() {
		ws.mu.Lock()
		defer ws.mu.Unlock()
		if w.refs == 0 && ws.m[w.key] == w {
			delete(ws.m, w.key)
		}
	})
}

// stopLocked stops w's poller; the caller holds ws.mu.
func (ws *watches) stopLocked(w *watch) {
	if w.stop != nil {
		w.stop()
		w.stop = nil
	}
	w.listening = false
}

// listening reports whether a poller has read key in flight and watches
// it for a change.
func (ws *watches) listening(key storage.Key) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w := ws.m[key]
	return w != nil && w.listening
}

// saw records what the poller running under ctx read and reports whether
// it goes on: false when its waiters were woken (then it stops) or when
// it was stopped meanwhile.
func (ws *watches) saw(ctx context.Context, w *watch, f *flight, err error) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ctx.Err() != nil {
		return false // stopped: what it read concerns nobody
	}
	changed := err != nil || f == nil || f.left <= 0 || (w.token != 0 && f.token != w.token)
	if f != nil && f.left > 0 {
		w.token = f.token
	}
	if !changed {
		w.listening = true
		return true
	}
	w.woken.err = err
	close(w.woken.done)
	w.woken = &wakeUp{done: make(chan struct{})}
	ws.stopLocked(w)
	return false
}

// poll reads w's record until it changes (see saw) or the poller is
// stopped.
func (s *Store) poll(ctx context.Context, w *watch) {
	for gap := firstPollGap; ; gap = min(2*gap, maxPollGap) {
		f, err := s.look(ctx, w.key)
		if !s.watches.saw(ctx, w, f, err) {
			return
		}
		if !sleep(ctx, min(gap, f.left)) {
			return
		}
	}
}

// flight is what the poller reads of an in-flight record: its lease's
// token, and how long the lease has left by the server's clock (at most
// MaxDuration; zero or less once it lapsed).
type flight struct {
	token int64
	left  time.Duration
}

// look reads key's in-flight record: nil when it is absent or completed.
func (s *Store) look(ctx context.Context, key storage.Key) (*flight, error) {
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	if err := s.ensureSchema(ctx); err != nil {
		return nil, s.fail(ctx, "wait", err)
	}
	var (
		state int16
		f     flight
		left  int64
	)
	select {
	case s.polls <- struct{}{}:
	case <-ctx.Done():
		return nil, s.fail(ctx, "wait", ctx.Err())
	}
	err := retry(ctx, func() error {
		return s.queryRow(ctx, []any{&state, &f.token, &left}, s.sql.watch, key.Scope, key.ID)
	})
	<-s.polls
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, s.fail(ctx, "wait", err)
	case state != stateInFlight:
		return nil, nil
	}
	f.left = fromMicros(left)
	return &f, nil
}

// sleep waits for d, or returns false when ctx ends first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
