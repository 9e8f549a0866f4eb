package redis

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// Renewals in batches. The leases of the requests running on an instance
// are renewed together, once per tick: one pipeline of the renew script,
// one command per lease, which go-redis's ClusterClient splits by node
// and sends to the nodes in parallel, so a batch costs one round trip per
// node whatever the number of leases. A single script over all the leases
// cannot do it: on Cluster their keys live in different slots.
//
// The batches go through the renewal client (Options.RenewClient), on
// connections that reservations and completions never use, so they never
// wait behind the pipeliner's queue or for one of its connections, and
// that client has no socket timeout shorter than the caller's deadline: a
// reply that comes late within it keeps its connection. A renewal that
// lands late is harmless, because only a takeover fences a lease, and a
// takeover replaces the token the renewal carries.

// RenewBatch implements storage.BatchRenewer. Each lease's Err is nil
// when it was renewed, storage.ErrLeaseLost when its token no longer
// names the lease, or the error of its command (wrapping
// storage.ErrUnavailable when its node could not be reached or did not
// answer in time). RenewBatch returns an error, and sets every Err to it,
// when no command got an answer: Redis could not be reached, ctx ended;
// when some nodes answered and others did not, it returns nil and each
// lease carries its own answer.
//
// The batch is bounded by ctx's deadline alone, however long (a caller
// allows half a lease, say), and by Options.Timeout only when ctx has
// none.
func (s *Store) RenewBatch(ctx context.Context, batch []storage.Renewal) error {
	if s.invalid != nil {
		return failBatch(batch, s.invalid)
	}
	if err := ctx.Err(); err != nil {
		return failBatch(batch, err)
	}
	if _, ok := ctx.Deadline(); !ok && s.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.timeout)
		defer cancel()
	}
	ctx = context.WithValue(ctx, renewalKey{}, true)

	cmds := make([]*goredis.Cmd, len(batch))
	pipe := s.renewer.Pipeline()
	for i := range batch {
		r := &batch[i]
		switch {
		case r.Lease <= 0:
			r.Err = fmt.Errorf("redis renew: %w: lease %v is not positive", storage.ErrInvalid, r.Lease)
		case r.Token == 0:
			r.Err = storage.ErrLeaseLost
		default:
			r.Err = nil
			cmds[i] = renewScript.EvalSha(ctx, pipe, []string{s.keyName(r.Key)}, renewArgs(r)...)
		}
	}
	if pipe.Len() == 0 {
		return nil
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error

	// A node that lost its script cache (SCRIPT FLUSH, a failover to a
	// replica that never ran it) answers NOSCRIPT: those commands go
	// again as EVAL, which caches the script, in one more pipeline.
	var again goredis.Pipeliner
	for i, c := range cmds {
		if c != nil && goredis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			if again == nil {
				again = s.renewer.Pipeline()
			}
			cmds[i] = renewScript.Eval(ctx, again, []string{s.keyName(batch[i].Key)}, renewArgs(&batch[i])...)
		}
	}
	if again != nil {
		_, _ = again.Exec(ctx)
	}

	var unanswered error // the first error of a command that got no answer
	answered := false
	for i, c := range cmds {
		if c == nil {
			continue
		}
		v, err := c.Result()
		switch {
		case err != nil:
			err = s.classify(err)
			if errors.Is(err, storage.ErrUnavailable) || ctx.Err() != nil {
				if unanswered == nil {
					unanswered = err
				}
			} else {
				answered = true
			}
			batch[i].Err = fmt.Errorf("redis renew: %w", err)
		case v == int64(1):
			answered = true
		case v == int64(0):
			answered = true
			batch[i].Err = storage.ErrLeaseLost
		default:
			answered = true
			batch[i].Err = fmt.Errorf("redis renew: %w: reply of type %T", storage.ErrCorrupt, v)
		}
	}
	if !answered && unanswered != nil {
		return failBatch(batch, fmt.Errorf("redis renew: %w", unanswered))
	}
	return nil
}

// renewArgs are the renew script's arguments for r.
func renewArgs(r *storage.Renewal) []any {
	return []any{uint64(r.Token), millis(r.Lease), keepMillis(r.Lease)}
}

// failBatch sets every lease's Err to err, and returns it.
func failBatch(batch []storage.Renewal, err error) error {
	for i := range batch {
		batch[i].Err = err
	}
	return err
}

// RenewalRoundTrips returns how many pipelines of renewals RenewBatch
// has sent to a Redis node (a round trip each: one write, one read), for
// tests and metrics: one per node and batch, and one more per node that
// had to be sent the script again; neither the handshake of a new
// connection nor go-redis's own retry of a pipeline on a fresh connection,
// after one broke, is counted. On Cluster, only
// the nodes the renewal client met after New are counted (with a client
// from NewRenewClient: all of them).
func (s *Store) RenewalRoundTrips() int64 {
	return s.renewTrips.Load()
}

// renewalKey marks the context of RenewBatch's pipelines, so that the
// counting hook tells them from the others a shared client sends.
type renewalKey struct{}

// countRenewalTrips adds a hook to c that counts, in n, the pipelines of
// renewals sent to a node: on each node's client for a Cluster (a
// pipeline is split by node below the ClusterClient), on the client
// itself otherwise.
func countRenewalTrips(c goredis.UniversalClient, n *atomic.Int64) {
	h := tripCounter{n}
	if nc, ok := c.(interface{ OnNewNode(func(*goredis.Client)) }); ok {
		nc.OnNewNode(func(node *goredis.Client) { node.AddHook(h) })
		return
	}
	c.AddHook(h)
}

type tripCounter struct{ n *atomic.Int64 }

func (tripCounter) DialHook(next goredis.DialHook) goredis.DialHook          { return next }
func (tripCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }

func (h tripCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		// A new connection's handshake (HELLO, AUTH, SELECT) is a
		// pipeline under the same context: not counted.
		if len(cmds) > 0 && ctx.Value(renewalKey{}) != nil {
			if name := cmds[0].Name(); name == "evalsha" || name == "eval" {
				h.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}
