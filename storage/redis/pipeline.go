package redis

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// pipeliner sends the scripts of concurrent operations together. Each
// worker takes the next queued operation and whatever else is queued by
// then, and sends them as one pipeline: one write and one read for the
// lot. Alone, an operation goes out at once (there is no waiting window);
// under load, many share the system calls and the network round trip,
// which on loopback or a fast LAN cost more than the scripts themselves.
// Every operation is still one command, answered on its own.
type pipeliner struct {
	client goredis.UniversalClient
	queue  chan *call
	stop   chan struct{}
	wg     sync.WaitGroup

	// closing guards the queue: no call is queued once close has begun,
	// so none is left behind unanswered.
	closing sync.RWMutex
	closed  bool
}

// call is one queued operation.
type call struct {
	ctx    context.Context
	script *goredis.Script
	keys   []string
	args   []any
	val    any
	err    error
	done   chan struct{}
}

const (
	// pipelineWorkers is how many pipelines can be in flight at once: a
	// few keep latency low while one batch waits for its reply.
	pipelineWorkers = 2
	// maxBatch bounds one pipeline, so a burst cannot build a huge reply.
	maxBatch = 128
)

var errStoreClosed = errors.New("redis store is closed")

func newPipeliner(client goredis.UniversalClient) *pipeliner {
	p := &pipeliner{client: client, queue: make(chan *call, 4*maxBatch), stop: make(chan struct{})}
	p.wg.Add(pipelineWorkers)
	for range pipelineWorkers {
		go p.work()
	}
	return p
}

// do runs script on keys with args, batched with concurrent operations.
func (p *pipeliner) do(ctx context.Context, script *goredis.Script, keys []string, args []any) (any, error) {
	c := &call{ctx: ctx, script: script, keys: keys, args: args, done: make(chan struct{})}
	p.closing.RLock()
	if p.closed {
		p.closing.RUnlock()
		return nil, errStoreClosed
	}
	select {
	case p.queue <- c: // the workers run until close holds the lock
	case <-ctx.Done():
		p.closing.RUnlock()
		return nil, ctx.Err()
	}
	p.closing.RUnlock()
	select {
	case <-c.done:
		return c.val, c.err
	case <-ctx.Done():
		// The command may still run; as with an unbatched command whose
		// caller gave up, the store's fencing keeps that safe.
		return nil, ctx.Err()
	}
}

func (p *pipeliner) work() {
	defer p.wg.Done()
	batch := make([]*call, 0, maxBatch)
	for {
		select {
		case c := <-p.queue:
			batch = append(batch[:0], c)
		case <-p.stop:
			return
		}
		// Let the request goroutines that are ready to run queue their
		// calls first: under load they join this pipeline instead of
		// paying for one of their own; alone, this returns at once.
		runtime.Gosched()
	drain:
		for len(batch) < maxBatch {
			select {
			case c := <-p.queue:
				batch = append(batch, c)
			default:
				break drain
			}
		}
		p.flush(batch)
	}
}

// flush sends a batch and hands each call its own reply. A call whose
// caller has given up already is answered at once and not sent.
func (p *pipeliner) flush(batch []*call) {
	live := batch[:0]
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.err = err
			close(c.done)
			continue
		}
		live = append(live, c)
	}
	batch = live
	switch len(batch) {
	case 0:
		return
	case 1:
		c := batch[0]
		c.val, c.err = c.script.Run(c.ctx, p.client, c.keys, c.args...).Result()
		close(c.done)
		return
	}
	ctx, cancel := batchContext(batch)
	defer cancel()
	pipe := p.client.Pipeline()
	cmds := make([]*goredis.Cmd, len(batch))
	for i, c := range batch {
		cmds[i] = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	// The script cache was flushed (or a failover happened): the
	// commands that met NOSCRIPT go again as EVAL, which loads the
	// script again, together in one more pipeline rather than one round
	// trip each (on a Redis 30 ms away, a batch of a hundred would
	// otherwise take six seconds).
	var again goredis.Pipeliner
	for i, c := range batch {
		if goredis.HasErrorPrefix(cmds[i].Err(), "NOSCRIPT") {
			if again == nil {
				again = p.client.Pipeline()
			}
			cmds[i] = c.script.Eval(ctx, again, c.keys, c.args...)
		}
	}
	if again != nil {
		_, _ = again.Exec(ctx)
	}
	for i, c := range batch {
		c.val, c.err = cmds[i].Result()
		close(c.done)
	}
}

// batchContext bounds a batch by the latest deadline among its calls, and
// by none (the client's own read and write timeouts) when one of them
// has none. One pipeline is one write and one read, so it has one
// deadline; were it the earliest, a renewal's short deadline would fail
// the reservations and completions sent with it while they still had
// time. With the latest, no command fails before its own deadline
// because of another, and no caller waits past its own either: do
// returns when the caller's context is done, whatever the batch does.
func batchContext(batch []*call) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, c := range batch {
		dl, ok := c.ctx.Deadline()
		if !ok {
			return context.Background(), func() {}
		}
		if dl.After(latest) {
			latest = dl
		}
	}
	return context.WithDeadline(context.Background(), latest)
}

// close stops the workers; queued calls not yet taken fail.
func (p *pipeliner) close() {
	p.closing.Lock()
	p.closed = true
	p.closing.Unlock()
	close(p.stop)
	p.wg.Wait()
	for {
		select {
		case c := <-p.queue:
			c.err = errStoreClosed
			close(c.done)
		default:
			return
		}
	}
}
