package redis

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
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
	wait   Durability // WAIT behind the durable calls of a batch (Replicas > 0)
	queue  chan *call
	stop   chan struct{}
	wg     sync.WaitGroup

	// closing guards the queue: no call is queued once close has begun,
	// so none is left behind unanswered.
	closing sync.RWMutex
	closed  bool

	// busy counts the calls queued or on their way; a call that finds
	// none goes out from its caller's goroutine.
	busy atomic.Int32
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

	// durable calls are followed by WAIT (durability.go); acked is how
	// many replicas acknowledged, -1 when no WAIT was sent.
	durable bool
	acked   int
}

const (
	// pipelineWorkers is how many pipelines can be in flight at once: a
	// few keep latency low while one batch waits for its reply.
	pipelineWorkers = 2
	// maxBatch bounds one pipeline, so a burst cannot build a huge reply.
	maxBatch = 128
)

var errStoreClosed = errors.New("redis store is closed")

func newPipeliner(client goredis.UniversalClient, wait Durability) *pipeliner {
	p := &pipeliner{client: client, wait: wait, queue: make(chan *call, 4*maxBatch), stop: make(chan struct{})}
	p.wg.Add(pipelineWorkers)
	for range pipelineWorkers {
		go p.work()
	}
	return p
}

// do runs script on keys with args, batched with concurrent operations.
// A durable call is followed by WAIT when the store asks for replicas;
// acked is how many acknowledged, -1 when no WAIT was sent.
func (p *pipeliner) do(ctx context.Context, script *goredis.Script, keys []string, args []any, durable bool) (v any, acked int, err error) {
	durable = durable && p.wait.Replicas > 0
	if !durable && p.busy.CompareAndSwap(0, 1) {
		// Nothing to share a pipeline with: send it from here, without
		// the hand-off to a worker and back (two goroutine wake-ups),
		// as a worker would send a batch of one.
		defer p.busy.Add(-1)
		p.closing.RLock() // close waits for it, as for a queued call
		defer p.closing.RUnlock()
		if p.closed {
			return nil, -1, errStoreClosed
		}
		v, err = script.Run(ctx, p.client, keys, args...).Result()
		return v, -1, err
	}
	p.busy.Add(1)
	defer p.busy.Add(-1)
	c := &call{ctx: ctx, script: script, keys: keys, args: args, done: make(chan struct{}), acked: -1,
		durable: durable}
	p.closing.RLock()
	if p.closed {
		p.closing.RUnlock()
		return nil, -1, errStoreClosed
	}
	select {
	case p.queue <- c: // the workers run until close holds the lock
	case <-ctx.Done():
		p.closing.RUnlock()
		return nil, -1, ctx.Err()
	}
	p.closing.RUnlock()
	select {
	case <-c.done:
		return c.val, c.acked, c.err
	case <-ctx.Done():
		// The command may still run; as with an unbatched command whose
		// caller gave up, the store's fencing keeps that safe.
		return nil, -1, ctx.Err()
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
		if p.wait.Replicas > 0 && slices.ContainsFunc(batch, func(c *call) bool { return c.durable }) {
			// Its WAIT may block for the whole durability timeout (too
			// few replicas): a worker held that long would leave the
			// calls queued behind it to reach the store's timeout before
			// their own WAIT is out. A new worker takes this one's place
			// (off the batch's path), and this one ends with its batch.
			p.wg.Add(1)
			go p.work()
			p.flush(batch)
			return
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
	if len(batch) == 0 {
		return
	}
	wait := slices.ContainsFunc(batch, func(c *call) bool { return c.durable })
	if len(batch) == 1 && !wait {
		c := batch[0]
		c.val, c.err = c.script.Run(c.ctx, p.client, c.keys, c.args...).Result()
		close(c.done)
		return
	}
	ctx, cancel := batchContext(batch)
	defer cancel()
	cc, cluster := p.client.(*goredis.ClusterClient)
	if !wait || !cluster {
		p.send(ctx, p.client.Pipeline, batch, wait)
		return
	}
	// WAIT counts the replicas of the node it is sent to, for the writes
	// of its own connection: each node's share of the batch goes to that
	// node, in a pipeline of its own, with its WAIT.
	nodes := make(map[*goredis.Client][]*call)
	for _, c := range batch {
		node, err := cc.MasterForKey(ctx, c.keys[0])
		if err != nil {
			c.err = err
			close(c.done)
			continue
		}
		nodes[node] = append(nodes[node], c)
	}
	var wg sync.WaitGroup
	for node, calls := range nodes {
		wg.Go(func() {
			p.send(ctx, node.Pipeline, calls, slices.ContainsFunc(calls, func(c *call) bool { return c.durable }))
			for _, c := range calls {
				if isMoved(c.err) {
					// The slot moved (a failover, a resharding): the
					// client learns the new map for the next batch.
					cc.ReloadState(ctx)
					break
				}
			}
		})
	}
	wg.Wait()
}

// send sends batch as one pipeline made by newPipe, followed by WAIT
// when wait is set, and hands each call its own reply.
func (p *pipeliner) send(ctx context.Context, newPipe func() goredis.Pipeliner, batch []*call, wait bool) {
	pipe := newPipe()
	cmds := make([]*goredis.Cmd, len(batch))
	for i, c := range batch {
		cmds[i] = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
	}
	sent := time.Now()
	waitCmd := p.waitCmd(ctx, pipe, wait, p.wait.timeout())
	_, _ = pipe.Exec(ctx) // each command carries its own error
	// The script cache was flushed (or a failover happened): the
	// commands that met NOSCRIPT go again as EVAL, which loads the
	// script again, together in one more pipeline rather than one round
	// trip each (on a Redis 30 ms away, a batch of a hundred would
	// otherwise take six seconds). That pipeline has a WAIT of its own,
	// for the writes of its connection, with what is left of the first
	// one's time: with too few replicas, the first one took all of it,
	// and two whole WAITs would take the operation past the store's
	// timeout, where on_timeout proceed cannot proceed.
	waits := make([]*goredis.Cmd, len(batch))
	var again goredis.Pipeliner
	for i, c := range batch {
		waits[i] = waitCmd
		if goredis.HasErrorPrefix(cmds[i].Err(), "NOSCRIPT") {
			if again == nil {
				again = newPipe()
			}
			cmds[i] = c.script.Eval(ctx, again, c.keys, c.args...)
			waits[i] = nil
		}
	}
	if again != nil {
		againWait := p.waitCmd(ctx, again, wait, max(time.Millisecond, p.wait.timeout()-time.Since(sent)))
		_, _ = again.Exec(ctx)
		for i := range waits {
			if waits[i] == nil {
				waits[i] = againWait
			}
		}
	}
	for i, c := range batch {
		c.val, c.err = cmds[i].Result()
		if c.err == nil && c.durable && waits[i] != nil {
			// A WAIT that failed leaves the write's fate unknown, as a
			// lost reply does: the call fails.
			n, err := waits[i].Int()
			c.acked, c.err = n, err
		}
		close(c.done)
	}
}

// waitCmd queues WAIT on pipe, for at most timeout (0 would block for
// ever: callers give at least a millisecond), when wait is set; nil
// otherwise.
func (p *pipeliner) waitCmd(ctx context.Context, pipe goredis.Pipeliner, wait bool, timeout time.Duration) *goredis.Cmd {
	if !wait {
		return nil
	}
	return pipe.Do(ctx, "WAIT", p.wait.Replicas, max(1, timeout.Milliseconds()))
}

// isMoved reports whether err is a Cluster redirection.
func isMoved(err error) bool {
	return goredis.HasErrorPrefix(err, "MOVED") || goredis.HasErrorPrefix(err, "ASK")
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
