package idempotency

import (
	"context"
	"time"
)

// detachedContext is context.WithoutCancel's context, as a pointer that
// can live inside the exchange: WithoutCancel allocates, and its Value
// boxes the context again on every lookup (a store call looks up its
// span, the lease and the logger's fields several times).
type detachedContext struct{ parent context.Context }

// detach returns ctx without its cancellation and deadline, and with its
// values.
func detach(ctx context.Context) context.Context {
	if d, ok := ctx.(*detachedContext); ok {
		return d
	}
	return &detachedContext{parent: ctx}
}

func (*detachedContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*detachedContext) Done() <-chan struct{}       { return nil }
func (*detachedContext) Err() error                  { return nil }

// Value is the parent's, but for the context package's own lookup of the
// cancelable context above (context.Cause, AfterFunc): a *int key whose
// value is a context. A detached context has none, as WithoutCancel's.
func (c *detachedContext) Value(key any) any {
	v := c.parent.Value(key)
	if _, isContext := v.(context.Context); isContext {
		if _, isIntPointer := key.(*int); isIntPointer {
			return nil
		}
	}
	return v
}

func (c *detachedContext) String() string { return "idempotency.detached" }
