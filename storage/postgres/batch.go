package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// A new key costs two durable commits (its reservation, then its record),
// and each commit waits for its WAL flush. Under load, many requests wait
// for their own flush at the same moment; a batcher sends the statements
// of one kind (reserves, or completions) that are waiting at the same
// moment as one pipeline, which PostgreSQL runs as one implicit
// transaction: one round trip, one commit, one flush for the batch. A
// request that finds the sender free and nobody queued sends its own
// statement at once, so that an idle store adds no delay (a request alone
// is a batch of one); the requests that come while a batch is out queue,
// and the next batch takes them all, so that a busy store amortises its
// flushes.
//
// At most two batches of a kind are in flight at a time (maxBatches),
// and a batch never waits for a
// row another transaction holds: the reserve and complete statements try
// their row with SKIP LOCKED first (statements.reserve, .complete), and a
// row held elsewhere is a per-key answer, "locked", at once. Such a
// statement waits in the process, not on the server: it goes again in a
// later batch, a pause later, until it gets its row or the store's lock
// wait (Options.LockWait) has passed since its first "locked", and then
// its request, and every request for the same key queued meanwhile, gets
// an error wrapping storage.ErrBusy. A batch holds at most one statement
// per (scope, key): the later ones for a key wait in the queue for the
// answer of the one out, so that however many requests for a locked key
// arrive at once, they cost one statement per batch, and no other key
// waits for them. Only a statement that meets a row inserted by a
// transaction still open (a new key, whose INSERT must wait to learn
// whether it conflicts) can still wait on the server; the guard
// (statements.guard) bounds that wait to the lock wait, and then the
// statement is the culprit (see below).
//
// The guarantees of the single statements hold:
//
//   - One winner per key: a batch holds one statement per key; a reserve
//     in another batch, or another instance's, waits for (or, when it
//     cannot lock the row at once, is told "locked" about) the first
//     batch's row, then sees it. Fencing is each statement's own (the
//     token in its WHERE).
//   - No deadlock between batches: each batch takes its rows in the order
//     of (scope, key), as every other batch does, a single statement holds
//     one row, and the batches' statements take no row they cannot have
//     at once (SKIP LOCKED), except a new key's insert, in that order.
//   - A batch's result counts only once it committed. A batch the server
//     refused (a statement failed, so the transaction rolled back) changed
//     nothing: each of its statements runs again on its own, as before
//     batching, and meets what it would have met alone. A statement that
//     waited for a locked row for the lock wait (lock_not_available) is
//     the culprit: its request, and those queued for its key, get an
//     error wrapping storage.ErrBusy at once, without running again (it
//     would only wait again), and the other statements of its batch,
//     rolled back with it, go again at once as a batch of their own, with
//     the time their requests have left. A batch whose outcome is unknown
//     (the connection broke, the deadline passed) is that error for each
//     of its statements, as the statement alone would have been. Store.run
//     is the one place where a batch's commit result is known.
//   - Deadlines and cancellation stay per request: a request stops waiting
//     at its own deadline (its statement's outcome is then unknown, as a
//     statement cut off by its deadline is); the batch runs until the
//     latest deadline among its statements. A request whose deadline
//     passed while its statement was still queued, with the server
//     answering other batches meanwhile, did not find the store
//     unreachable: its error wraps storage.ErrBusy (nothing was sent), so
//     that fail_open does not pass it on.

// batchItem is one statement of a batch.
type batchItem struct {
	sql   string
	args  []any
	order string // (scope, key), which orders a batch's statements

	// read reads the statement's result from the batch, in order; its
	// error is the statement's own (pgx.ErrNoRows, a scan error), or
	// errRowLocked when the statement's row was held elsewhere.
	read     func(pgx.BatchResults) error
	deadline time.Time
	queued   time.Time // when its request queued it

	// Guarded by batcher.mu:
	sent     *sentBatch // the batch it went out in; nil while queued
	gone     bool       // its request stopped waiting
	holds    bool       // it is the statement out for its key (batcher.out)
	locked   time.Time  // its first "locked" answer, if any
	retryAt  time.Time  // after a "locked" answer, when it goes again
	isolated bool       // rolled back with a culprit: goes in a batch of its own

	result error         // read's error, errBatchRolledBack, or the batch's error
	done   chan struct{} // closed once result is set

	// answer is where read puts the statement's answer, for the
	// statements that follow it (a reserve's *existingRow), or nil.
	answer any

	// follow, when set, answers the statement from the committed answer
	// of the statement out for its key before it (the leader), without a
	// round trip, and reports whether it could: what the statement
	// would have met had it gone next (see Store.Reserve). Called with
	// batcher.mu held.
	follow func(leader *batchItem) bool
}

// sentBatch is a batch on its way: it is cancelled when every request
// in it has stopped waiting.
type sentBatch struct {
	cancel  context.CancelFunc
	waiting atomic.Int32
}

// errBatchRolledBack: the server refused the batch, so none of its
// statements changed anything; each runs again on its own.
var errBatchRolledBack = errors.New("postgres: batch rolled back")

// errRowLocked is a statement's answer when its row was held by another
// transaction: it changed nothing, and did not wait.
var errRowLocked = errors.New("postgres: the row is locked by another transaction")

// lockedPause is how long a statement told "locked" waits before it goes
// again: short against the lock wait, long against a batch's round trip.
func lockedPause(lockWait time.Duration) time.Duration {
	return min(max(lockWait/16, time.Millisecond), 20*time.Millisecond)
}

// maxBatches is how many batches of a kind are on their way at once, at
// most: two, so that the server works on one while the other's commit
// waits for its WAL flush, and no more, so that each batch takes what
// queued meanwhile (at 32 clients, half a commit per new key; with four,
// two thirds and no more throughput; with one, a fifth, but half the
// throughput). A pool of fewer than 4 connections sends one at a time.
const maxBatches = 2

// batcher sends the statements of one kind, in batches, limit at a time.
type batcher struct {
	s     *Store
	limit int // batches on their way at once (maxBatches, or fewer for a small pool)

	mu      sync.Mutex
	queue   []*batchItem
	out     map[string]*batchItem // the statement out (or pausing) for each key
	culprit map[string]time.Time  // keys whose statement waited the lock wait on the server, until when they go alone
	sending int                   // batches on their way (at most limit)
	timer   *time.Timer           // wakes the sender for a pausing statement
	batches int                   // batches sent (for tests)
	largest int                   // most statements in one batch (for tests)
}

// do runs item in a batch and returns its result, or ctx's error when ctx
// ends first: then a statement still queued is never sent, and one
// already sent has an unknown outcome (as a statement alone cut off by
// its deadline), its batch cancelled once no request waits for it.
//
// A request that finds the sender free and nobody queued is alone: it
// sends its statement itself, under its own ctx, exactly as it would
// without batching (its cancellation cancels the statement on the
// server). The requests that queue go out together, sent by a goroutine.
func (b *batcher) do(ctx context.Context, item *batchItem) error {
	item.done = make(chan struct{})
	if d, ok := ctx.Deadline(); ok {
		item.deadline = d
	}
	item.queued = time.Now()
	b.mu.Lock()
	if b.out == nil {
		b.out = make(map[string]*batchItem)
	}
	if b.sending < b.limit && len(b.queue) == 0 && b.out[item.order] == nil {
		b.sending++
		b.hold(item)
		b.count(1)
		b.mu.Unlock()
		// A batch of one has nobody to send again.
		b.s.runBatch(ctx, []*batchItem{item})
		b.mu.Lock()
		b.sending--
		b.settle([]*batchItem{item}, nil)
		b.wake()
		b.mu.Unlock()
	} else {
		b.queue = append(b.queue, item)
		b.wake()
		b.mu.Unlock()
	}
	select {
	case <-item.done:
		return item.result
	case <-ctx.Done():
	}
	b.mu.Lock()
	select {
	case <-item.done: // answered meanwhile
		b.mu.Unlock()
		return item.result
	default:
	}
	item.gone = true
	err := ctx.Err()
	if item.sent == nil {
		b.queue = slices.DeleteFunc(b.queue, func(it *batchItem) bool { return it == item })
		if item.holds {
			b.let(item)
			b.wake()
		}
		if errors.Is(err, context.DeadlineExceeded) && b.s.answeredSince(item.queued) {
			// Nothing was sent, and the server kept answering: the store
			// was not unreachable, it was busy.
			err = fmt.Errorf("%w: the request's deadline passed while its statement waited for a batch (the server answered others meanwhile): %w",
				storage.ErrBusy, context.Cause(ctx))
		}
	} else if item.sent.waiting.Add(-1) == 0 {
		item.sent.cancel()
	}
	b.mu.Unlock()
	return err
}

// hold makes item the statement out for its key; b.mu is held.
func (b *batcher) hold(item *batchItem) {
	item.holds = true
	b.out[item.order] = item
}

// let ends item's hold on its key; b.mu is held.
func (b *batcher) let(item *batchItem) {
	item.holds = false
	if b.out[item.order] == item {
		delete(b.out, item.order)
	}
}

// count counts a batch of n statements going out; b.mu is held.
func (b *batcher) count(n int) {
	b.batches++
	b.largest = max(b.largest, n)
}

// wake starts a goroutine to send the queue when it holds statements
// ready to go and no batch is on its way; b.mu is held.
func (b *batcher) wake() {
	if b.sending >= b.limit || len(b.queue) == 0 {
		return
	}
	b.sending++
	go b.drain()
}

// next takes the next batch from the queue: the statements rolled back
// with a culprit, alone, or else every statement ready, at most one per
// key. It returns nil when none is ready, having set the timer for the
// first pausing one, if any. b.mu is held.
func (b *batcher) next() []*batchItem {
	now := time.Now()
	var batch, rest []*batchItem
	isolated := slices.ContainsFunc(b.queue, func(it *batchItem) bool { return it.isolated })
	var wakeAt time.Time
	for _, it := range b.queue {
		switch {
		case isolated && !it.isolated:
			rest = append(rest, it)
		case it.holds && it.retryAt.After(now):
			// Pausing after a "locked" answer.
			if wakeAt.IsZero() || it.retryAt.Before(wakeAt) {
				wakeAt = it.retryAt
			}
			rest = append(rest, it)
		case it.holds:
			batch = append(batch, it)
		case b.out[it.order] == nil && b.culprit[it.order].After(now):
			// Its key's statement waited the lock wait on the server a
			// moment ago: it goes alone, on a connection of its own, so
			// that it never holds up a batch.
			b.hold(it)
			it.isolated = false
			go b.solo(it)
		case b.out[it.order] == nil:
			b.hold(it)
			batch = append(batch, it)
		default:
			rest = append(rest, it) // another statement for its key is out
		}
	}
	b.queue = rest
	for _, it := range batch {
		it.isolated = false
	}
	if len(batch) == 0 && !wakeAt.IsZero() {
		if b.timer != nil {
			b.timer.Stop()
		}
		b.timer = time.AfterFunc(time.Until(wakeAt), func() {
			b.mu.Lock()
			b.wake()
			b.mu.Unlock()
		})
	}
	return batch
}

// solo sends item alone (see next), under its request's deadline, and
// settles it.
func (b *batcher) solo(item *batchItem) {
	ctx, cancel := context.WithCancel(context.Background())
	if !item.deadline.IsZero() {
		ctx, cancel = context.WithDeadline(context.Background(), item.deadline)
	}
	sent := &sentBatch{cancel: cancel}
	sent.waiting.Store(1)
	b.mu.Lock()
	item.sent = sent
	b.mu.Unlock()
	b.s.runBatch(ctx, []*batchItem{item})
	cancel()
	b.mu.Lock()
	b.settle([]*batchItem{item}, nil)
	b.wake()
	b.mu.Unlock()
}

// culpritFor is how long a key whose statement waited the lock wait on
// the server sends its statements alone, in lock waits.
const culpritFor = 10

// drain sends batches until none is ready.
func (b *batcher) drain() {
	for {
		b.mu.Lock()
		batch := b.next()
		if len(batch) == 0 {
			b.sending--
			b.mu.Unlock()
			return
		}
		b.count(len(batch))
		// The latest deadline; none when a statement has none (its
		// request waits as long as it takes).
		var deadline time.Time
		for _, it := range batch {
			if it.deadline.IsZero() {
				deadline = time.Time{}
				break
			}
			if it.deadline.After(deadline) {
				deadline = it.deadline
			}
		}
		var ctx context.Context
		var cancel context.CancelFunc
		if deadline.IsZero() {
			ctx, cancel = context.WithCancel(context.Background())
		} else {
			ctx, cancel = context.WithDeadline(context.Background(), deadline)
		}
		sent := &sentBatch{cancel: cancel}
		sent.waiting.Store(int32(len(batch)))
		for _, it := range batch {
			it.sent = sent
		}
		b.mu.Unlock()
		again := b.s.runBatch(ctx, batch)
		cancel()

		b.mu.Lock()
		b.settle(batch, again)
		b.mu.Unlock()
	}
}

// settle takes what became of the statements of a batch that came back:
// again are those rolled back with a culprit, which go again at once in a
// batch of their own; a statement told "locked" goes again after a pause,
// or, once the lock wait has passed, answers storage.ErrBusy with every
// statement queued for its key; the others are answered. b.mu is held.
func (b *batcher) settle(batch, again []*batchItem) {
	rerun := make(map[*batchItem]bool, len(again))
	for _, it := range again {
		rerun[it] = true
	}
	now := time.Now()
	var requeue []*batchItem
	for _, it := range batch {
		it.sent = nil
		switch {
		case it.gone:
			b.let(it) // nobody waits for its answer
		case rerun[it]:
			it.isolated = true
			requeue = append(requeue, it)
		case errors.Is(it.result, errRowLocked):
			if it.locked.IsZero() {
				it.locked = now
			}
			lockWait := b.s.opts.LockWait
			if now.Sub(it.locked) < lockWait && (it.deadline.IsZero() || now.Before(it.deadline)) {
				it.retryAt = now.Add(lockedPause(lockWait))
				requeue = append(requeue, it)
				continue
			}
			b.busy(it, fmt.Errorf("%w: the row stayed locked for %s", storage.ErrBusy, lockWait))
		case errors.Is(it.result, storage.ErrBusy):
			// The culprit of a batch (it waited the lock wait on the
			// server): the statements queued for its key get the same
			// answer, and the key's next ones go alone for a while.
			if b.culprit == nil {
				b.culprit = make(map[string]time.Time)
			}
			for k, until := range b.culprit {
				if until.Before(now) {
					delete(b.culprit, k)
				}
			}
			b.culprit[it.order] = now.Add(culpritFor * b.s.opts.LockWait)
			b.busy(it, it.result)
		default:
			b.let(it)
			b.follow(it) // before done: its request may reuse it then
			close(it.done)
		}
	}
	b.queue = append(requeue, b.queue...)
}

// follow answers the statements queued for leader's key that can take
// its committed answer (batchItem.follow), so that a crowd of requests
// for one key, which go out one at a time (one statement per key a
// batch), costs one round trip rather than one each; b.mu is held.
func (b *batcher) follow(leader *batchItem) {
	if leader.result != nil {
		return
	}
	b.queue = slices.DeleteFunc(b.queue, func(it *batchItem) bool {
		if it.order != leader.order || it.holds || it.follow == nil || !it.follow(leader) {
			return false
		}
		it.result = nil
		close(it.done)
		return true
	})
}

// busy answers item and every statement queued for its key with err, an
// error wrapping storage.ErrBusy; b.mu is held.
func (b *batcher) busy(item *batchItem, err error) {
	b.let(item)
	item.result = err
	close(item.done)
	b.queue = slices.DeleteFunc(b.queue, func(it *batchItem) bool {
		if it.order != item.order || it.holds {
			return false
		}
		it.result = err
		close(it.done)
		return true
	})
}

// runBatch runs batch as one pipeline on one READ COMMITTED session,
// after the guard, and sets each item's result; it returns the items
// rolled back because another statement of the batch waited for a locked
// row for the lock wait, which must be sent again (never any of a batch
// of one).
func (s *Store) runBatch(ctx context.Context, batch []*batchItem) (again []*batchItem) {
	slices.SortStableFunc(batch, func(x, y *batchItem) int { return strings.Compare(x.order, y.order) })
	return s.run(ctx, batch)
}

// run runs batch, and is the one place where a batch's commit result is
// known (br.Close's error): a check of the commit belongs there.
func (s *Store) run(ctx context.Context, batch []*batchItem) (again []*batchItem) {
	all := func(err error) []*batchItem {
		for _, it := range batch {
			it.result = err
		}
		return nil
	}
	c, err := s.acquire(ctx)
	if err != nil {
		return all(err)
	}
	defer c.Release()
	var pb pgx.Batch
	pb.Queue(s.sql.guard)
	for _, it := range batch {
		pb.Queue(it.sql, it.args...)
	}
	br := c.SendBatch(ctx, &pb)
	if _, err := br.Exec(); err != nil {
		// Nothing ran: the table is missing, not ours to use, or locked
		// (for longer than the DSN's lock_timeout), or the connection
		// broke. Each statement alone would meet the same.
		br.Close()
		return all(err)
	}
	// The first statement the server refused is the culprit: the others
	// after it only report the same error, and the transaction rolled back.
	culprit := -1
	var pgErr *pgconn.PgError
	for i, it := range batch {
		it.result = it.read(br)
		if culprit < 0 && errors.As(it.result, &pgErr) {
			culprit = i
		}
	}
	err = br.Close() // the batch's commit result
	if err == nil || errors.As(err, &pgErr) {
		s.answered()
	}
	err = replicated(c, err)
	var refused error
	switch {
	case culprit >= 0 && lockTimedOut(batch[culprit].result):
		// It waited for a row another transaction holds for the lock
		// wait: its key is busy. Running it again would only wait again.
		batch[culprit].result = fmt.Errorf("%w: %w", storage.ErrBusy, batch[culprit].result)
		for i, it := range batch {
			if i != culprit {
				again = append(again, it)
			}
		}
		return again
	case culprit >= 0:
		refused = batch[culprit].result
	case err != nil && errors.As(err, &pgErr):
		refused = err // refused at commit
	case err != nil:
		return all(err) // the outcome is unknown
	default:
		return nil // committed: each result is the statement's own answer
	}
	if len(batch) == 1 {
		return all(refused) // it ran alone: its error is its own
	}
	return all(fmt.Errorf("%w: %w", errBatchRolledBack, refused)) // retryable when refused is
}

// alone runs one statement on its own (after the guard, as every
// statement of a batch), and returns its error. A statement told
// "locked" goes again after a pause, until the lock wait has passed;
// then its error wraps storage.ErrBusy.
func (s *Store) alone(ctx context.Context, item *batchItem) error {
	var locked time.Time
	for {
		s.run(ctx, []*batchItem{item})
		if !errors.Is(item.result, errRowLocked) {
			return item.result
		}
		now := time.Now()
		if locked.IsZero() {
			locked = now
		}
		if now.Sub(locked) >= s.opts.LockWait {
			return fmt.Errorf("%w: the row stayed locked for %s", storage.ErrBusy, s.opts.LockWait)
		}
		if !sleep(ctx, lockedPause(s.opts.LockWait)) {
			return ctx.Err()
		}
	}
}

// answered notes that the server answered a statement (refusals
// included), for the requests whose deadline passes in the queue.
func (s *Store) answered() { s.lastAnswer.Store(time.Now().UnixNano()) }

// answeredSince reports whether the server answered a statement after t.
func (s *Store) answeredSince(t time.Time) bool { return s.lastAnswer.Load() > t.UnixNano() }
