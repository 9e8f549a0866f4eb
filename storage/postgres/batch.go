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
// request that finds a sender free and nobody queued sends its own
// statement at once, so that an idle store adds no delay (a request alone
// is a batch of one); the requests that come while every sender is busy
// queue, and the next sender free takes them all, so that a busy store
// amortises its flushes.
//
// Several batches of a kind may be in flight at once (maxSenders, half
// the pool), and every pipeline starts with the guard (statements.guard),
// which bounds each statement's wait for a row another transaction holds
// to the store's lock wait: a batch that meets such a row is held for that
// long at most, and never holds up the statements that come after it,
// which go out in other batches meanwhile.
//
// The guarantees of the single statements hold:
//
//   - One winner per key: the statements run one after the other in the
//     transaction, each with a new snapshot (READ COMMITTED), so a second
//     reserve of a key in the same batch sees the first's row, in flight,
//     and answers Conflict; one in another batch waits for the first
//     batch's row lock, then sees its row. Fencing is each statement's
//     own (the token in its WHERE).
//   - No deadlock between batches: each batch takes its rows in the order
//     of (scope, key), as every other batch does, and a single statement
//     holds one row.
//   - A batch's result counts only once it committed. A batch the server
//     refused (a statement failed, so the transaction rolled back) changed
//     nothing: each of its statements runs again on its own, as before
//     batching, and meets what it would have met alone. A statement that
//     waited for a locked row for the lock wait (lock_not_available) is
//     the culprit: its request gets an error wrapping storage.ErrBusy at
//     once, without running again (it would only wait again), and the
//     other statements of its batch, rolled back with it, queue again for
//     the next batch, with the time their requests have left. A batch
//     whose outcome is unknown (the connection broke, the deadline passed)
//     is that error for each of its statements, as the statement alone
//     would have been.
//   - Deadlines and cancellation stay per request: a request stops waiting
//     at its own deadline (its statement's outcome is then unknown, as a
//     statement cut off by its deadline is); the batch runs until the
//     latest deadline among its statements.

// batchItem is one statement of a batch.
type batchItem struct {
	sql   string
	args  []any
	order string // (scope, key), which orders a batch's statements

	// read reads the statement's result from the batch, in order; its
	// error is the statement's own (pgx.ErrNoRows, a scan error).
	read     func(pgx.BatchResults) error
	deadline time.Time

	sent   *sentBatch    // the batch it went out in; nil while queued (guarded by batcher.mu)
	gone   bool          // its request stopped waiting (guarded by batcher.mu)
	result error         // read's error, errBatchRolledBack, or the batch's error
	done   chan struct{} // closed once result is set
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

// batcher sends the statements of one kind, in batches, from at most
// maxSenders requests or goroutines at a time.
type batcher struct {
	s          *Store
	maxSenders int

	mu      sync.Mutex
	queue   []*batchItem
	senders int // requests sending their own statement, and drain goroutines
	batches int // batches sent (for tests)
	largest int // most statements in one batch (for tests)
}

// do runs item in a batch and returns its result, or ctx's error when ctx
// ends first: then a statement still queued is never sent, and one
// already sent has an unknown outcome (as a statement alone cut off by
// its deadline), its batch cancelled once no request waits for it.
//
// A request that finds a sender free and nobody queued is alone: it sends
// its statement itself, under its own ctx, exactly as it would without
// batching (its cancellation cancels the statement on the server). The
// requests that queue go out together, sent by goroutines of their own.
func (b *batcher) do(ctx context.Context, item *batchItem) error {
	item.done = make(chan struct{})
	if d, ok := ctx.Deadline(); ok {
		item.deadline = d
	}
	b.mu.Lock()
	if len(b.queue) == 0 && b.senders < b.maxSenders {
		b.senders++
		b.count(1)
		b.mu.Unlock()
		// A batch of one has nobody to send again.
		b.s.runBatch(ctx, []*batchItem{item})
		b.mu.Lock()
		b.senders--
		b.wake()
		b.mu.Unlock()
		return item.result
	}
	b.queue = append(b.queue, item)
	b.wake()
	b.mu.Unlock()
	select {
	case <-item.done:
		return item.result
	case <-ctx.Done():
	}
	b.mu.Lock()
	item.gone = true
	if item.sent == nil {
		b.queue = slices.DeleteFunc(b.queue, func(it *batchItem) bool { return it == item })
	} else if item.sent.waiting.Add(-1) == 0 {
		item.sent.cancel()
	}
	b.mu.Unlock()
	return ctx.Err()
}

// count counts a batch of n statements going out; b.mu is held.
func (b *batcher) count(n int) {
	b.batches++
	b.largest = max(b.largest, n)
}

// wake starts a goroutine to send the queue when it holds statements and
// a sender is free; b.mu is held.
func (b *batcher) wake() {
	if len(b.queue) > 0 && b.senders < b.maxSenders {
		b.senders++
		go b.drain()
	}
}

// drain sends batches until none is queued.
func (b *batcher) drain() {
	for {
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.senders--
			b.mu.Unlock()
			return
		}
		batch := b.queue
		b.queue = nil
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

		// The statements rolled back with a culprit queue again, first,
		// unless their requests stopped waiting.
		b.mu.Lock()
		var requeue []*batchItem
		for _, it := range again {
			if it.gone {
				close(it.done)
				continue
			}
			it.sent = nil
			requeue = append(requeue, it)
		}
		b.queue = append(requeue, b.queue...)
		b.mu.Unlock()
	}
}

// runBatch runs batch as one pipeline on one READ COMMITTED session,
// after the guard, sets each item's result and closes its done, except
// for the items it returns: those were rolled back because another
// statement of the batch met a locked row, and must be sent again (never
// any of a batch of one).
func (s *Store) runBatch(ctx context.Context, batch []*batchItem) (again []*batchItem) {
	slices.SortStableFunc(batch, func(x, y *batchItem) int { return strings.Compare(x.order, y.order) })
	again = s.run(ctx, batch)
	if len(again) == 0 {
		for _, it := range batch {
			close(it.done)
		}
		return nil
	}
	rerun := make(map[*batchItem]bool, len(again))
	for _, it := range again {
		rerun[it] = true
	}
	for _, it := range batch {
		if !rerun[it] {
			close(it.done) // the culprit
		}
	}
	return again
}

// run is runBatch without closing done.
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
	err = br.Close()
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
// statement of a batch), and returns its error.
func (s *Store) alone(ctx context.Context, item *batchItem) error {
	s.run(ctx, []*batchItem{item})
	return item.result
}
