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
)

// A new key costs two durable commits (its reservation, then its record),
// and each commit waits for its WAL flush. Under load, many requests wait
// for their own flush at the same moment; a batcher sends the statements
// of one kind (reserves, or completions) that are waiting at the same
// moment as one pipeline, which PostgreSQL runs as one implicit
// transaction: one round trip, one commit, one flush for the batch. A
// batch is sent as soon as the previous one is back, so that an idle
// store adds no delay (a request alone is a batch of one) and a busy one
// amortises its flushes.
//
// The guarantees of the single statements hold:
//
//   - One winner per key: the statements run one after the other in the
//     transaction, each with a new snapshot (READ COMMITTED), so a second
//     reserve of a key in the same batch sees the first's row, in flight,
//     and answers Conflict. Fencing is each statement's own (the token in
//     its WHERE).
//   - No deadlock between batches: each batch takes its rows in the order
//     of (scope, key), as every other batch does, and a single statement
//     holds one row.
//   - A batch's result counts only once it committed. A batch the server
//     refused (a statement failed, so the transaction rolled back) changed
//     nothing: each of its statements runs again on its own, as before
//     batching, and meets what it would have met alone. A batch whose
//     outcome is unknown (the connection broke, the deadline passed) is
//     that error for each of its statements, as the statement alone would
//     have been.
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

// batcher sends the statements of one kind, a batch at a time, from a
// goroutine that lives while there is a batch to send.
type batcher struct {
	s *Store

	mu      sync.Mutex
	queue   []*batchItem
	sending bool // the goroutine runs: new items wait for its next batch
	batches int  // batches sent (for tests)
	largest int  // most statements in one batch (for tests)

}

// do runs item in the next batch and returns its result, or ctx's error
// when ctx ends first: then a statement still queued is never sent, and
// one already sent has an unknown outcome (as a statement alone cut off
// by its deadline), its batch cancelled once no request waits for it.
//
// A request that finds no batch out is alone: it sends its statement
// itself, under its own ctx, exactly as it would without batching (its
// cancellation cancels the statement on the server). The requests that
// queue meanwhile go out together, sent by a goroutine of their own.
func (b *batcher) do(ctx context.Context, item *batchItem) error {
	item.done = make(chan struct{})
	if d, ok := ctx.Deadline(); ok {
		item.deadline = d
	}
	b.mu.Lock()
	if !b.sending {
		b.sending = true
		b.batches++
		b.largest = max(b.largest, 1)
		b.mu.Unlock()
		b.send(ctx, []*batchItem{item})
		b.mu.Lock()
		if len(b.queue) > 0 {
			go b.drain()
		} else {
			b.sending = false
		}
		b.mu.Unlock()
		return item.result
	}
	b.queue = append(b.queue, item)
	b.mu.Unlock()
	select {
	case <-item.done:
		return item.result
	case <-ctx.Done():
	}
	b.mu.Lock()
	if item.sent == nil {
		b.queue = slices.DeleteFunc(b.queue, func(it *batchItem) bool { return it == item })
	} else if item.sent.waiting.Add(-1) == 0 {
		item.sent.cancel()
	}
	b.mu.Unlock()
	return ctx.Err()
}

// drain sends batches until none is queued.
func (b *batcher) drain() {
	for {
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.sending = false
			b.mu.Unlock()
			return
		}
		batch := b.queue
		b.queue = nil
		b.batches++
		b.largest = max(b.largest, len(batch))
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
		b.send(ctx, batch)
		cancel()
	}
}

// send runs batch as one pipeline and sets each item's result.
func (b *batcher) send(ctx context.Context, batch []*batchItem) {
	slices.SortStableFunc(batch, func(x, y *batchItem) int { return strings.Compare(x.order, y.order) })
	err := b.run(ctx, batch)
	var pgErr *pgconn.PgError
	for _, it := range batch {
		switch {
		case err == nil:
			// Committed: it.result is the statement's own answer.
		case errors.As(err, &pgErr):
			it.result = fmt.Errorf("%w: %w", errBatchRolledBack, err) // retryable when err is
		default:
			it.result = err
		}
		close(it.done)
	}
}

// run sends batch on one READ COMMITTED session and reads every result;
// its error is the batch's (nil once it committed).
func (b *batcher) run(ctx context.Context, batch []*batchItem) error {
	c, err := b.s.acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	var pb pgx.Batch
	for _, it := range batch {
		pb.Queue(it.sql, it.args...)
	}
	br := c.SendBatch(ctx, &pb)
	var refused error // a statement the server refused: the transaction rolled back
	var pgErr *pgconn.PgError
	for _, it := range batch {
		it.result = it.read(br)
		if refused == nil && errors.As(it.result, &pgErr) {
			refused = it.result
		}
	}
	err = br.Close()
	switch {
	case refused != nil:
		return refused
	case err != nil:
		return err // refused too (a PgError), or the outcome is unknown
	}
	return nil
}
