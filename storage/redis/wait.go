package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// Waiting uses pub/sub rather than polling. A waiter learns of a
// completion within one network hop and costs Redis nothing while it
// waits; polling would either lag (long intervals) or load Redis with one
// script per waiter per interval, which is what a thundering herd of
// retries must not do. Keyspace notifications are not used: they need
// server configuration (notify-keyspace-events) that managed Redis often
// forbids.
//
// The complete, release, delete and takeover scripts publish on the
// record's channel, but only when a waiter registered (field w) until a
// time still to come, so the common case with nobody waiting publishes
// nothing. Classic PUBLISH, unlike SPUBLISH, may be called from a script on
// Cluster: it is broadcast to every node, so the one pub/sub connection,
// wherever go-redis's ClusterClient.Subscribe opened it, hears all of them.
//
// Each Store has at most one pub/sub connection, opened by the first Wait
// and shared by all its waiters; a channel is subscribed while someone
// waits on it. When the connection fails, every current Wait returns an
// error (the caller then polls) and the next Wait opens a new connection,
// no sooner than retryGap later: nothing published meanwhile is missed,
// because waiters never trust a connection that may have dropped messages.

// pingEvery is how long the pub/sub connection may stay silent before it
// is pinged; a ping unanswered for as long again gives the connection up.
const pingEvery = 5 * time.Second

// retryGap is how long Wait fails fast after the pub/sub connection
// failed, instead of dialling again for every waiting request.
const retryGap = time.Second

// listenSlack is added to how long a waiter says it listens, so that a
// completion right at the end of its wait is still announced.
const listenSlack = 100 * time.Millisecond

// Wait implements storage.Waiter. It returns nil at once when key has no
// live in-flight record; otherwise when the record is completed, released,
// deleted or taken over, when its lease lapses (server time), after
// maxWait, or when ctx is done (ctx.Err()). It returns an error when the
// pub/sub connection fails, so that the caller falls back to polling.
func (s *Store) Wait(ctx context.Context, key storage.Key, maxWait time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if maxWait <= 0 {
		return nil
	}
	if s.invalid != nil {
		return fmt.Errorf("redis wait: %w", s.invalid)
	}
	deadline := time.Now().Add(maxWait)
	timer := time.NewTimer(maxWait)
	defer timer.Stop()

	name := s.keyName(key)
	channel := channelName(name)
	conn, sub, err := s.hub.join(channel)
	if err != nil {
		return fmt.Errorf("redis wait: %w", s.classify(err))
	}
	defer s.hub.leave(conn, channel, sub)

	// Look at the record only once the subscription is confirmed: a
	// completion from then on is heard, one before it is seen.
	select {
	case <-sub.ready:
	case <-conn.failed:
		return fmt.Errorf("redis wait: %w", s.classify(conn.err))
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
	notified := s.hub.notifier(sub)
	lapse, inFlight, err := s.watch(ctx, name, time.Until(deadline)+listenSlack)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("redis wait: %w", err) // classified by runKey
	}
	if !inFlight {
		return nil
	}
	// A crashed owner never completes: wake up when its lease lapses, by
	// the server's clock, rather than sit out maxWait. A renewal meanwhile
	// only costs a spurious wake-up.
	if lapse < time.Until(deadline) {
		timer.Reset(lapse)
	}
	select {
	case <-notified:
		return nil
	case <-timer.C:
		return nil
	case <-conn.failed:
		return fmt.Errorf("redis wait: %w", s.classify(conn.err))
	case <-ctx.Done():
		return ctx.Err()
	}
}

// watch registers a waiter listening for d on the record under name and
// reports whether it is in flight and, if so, when its lease lapses.
func (s *Store) watch(ctx context.Context, name string, d time.Duration) (time.Duration, bool, error) {
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	v, err := s.runKey(ctx, watchScript, name, millis(d))
	if err != nil {
		return 0, false, err
	}
	r := reply{v: v}
	if r.int(0) == 0 {
		return 0, false, r.check(1)
	}
	lapse := time.Duration(r.int(1))*time.Millisecond + time.Millisecond
	return lapse, true, r.check(2)
}

// hub multiplexes the waiters of one Store onto one pub/sub connection.
type hub struct {
	client goredis.UniversalClient

	mu       sync.Mutex
	closed   bool
	conn     *psConn // nil before the first Wait and after a failure
	failedAt time.Time
	failErr  error
}

// psConn is one pub/sub connection and the channels subscribed on it. All
// fields but ps, ctx, cancel and failed are guarded by hub.mu.
type psConn struct {
	ps     *goredis.PubSub
	ctx    context.Context // cancelled when the connection is given up
	cancel context.CancelFunc
	failed chan struct{} // closed when the connection is given up
	err    error         // why; set before failed is closed

	subs map[string]*sub
	// pending counts SUBSCRIBE commands sent and not yet confirmed, per
	// channel: a channel left and joined again in quick succession gets
	// confirmations for both, and only the last one means the current
	// subscription is in place.
	pending map[string]int
}

// sub is one subscribed channel and its waiters. Its fields are guarded
// by hub.mu.
type sub struct {
	refs    int
	ready   chan struct{} // closed once the subscription is confirmed
	isReady bool
	notify  chan struct{} // closed, and replaced, on every message
}

func newHub(client goredis.UniversalClient) *hub {
	return &hub{client: client}
}

// join adds a waiter on channel, opening the connection and subscribing
// the channel when needed. Each successful join must be paired with leave.
func (h *hub) join(channel string) (*psConn, *sub, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, nil, errClosed
	}
	c := h.conn
	if c == nil {
		if h.failErr != nil && time.Since(h.failedAt) < retryGap {
			return nil, nil, fmt.Errorf("pub/sub unavailable: %w", h.failErr)
		}
		c = h.open()
	}
	sb := c.subs[channel]
	if sb == nil {
		sb = &sub{ready: make(chan struct{}), notify: make(chan struct{})}
		c.subs[channel] = sb
		c.pending[channel]++
		// Sent under h.mu, so that SUBSCRIBE and UNSUBSCRIBE of one
		// channel reach Redis in the order the waiters decided them.
		if err := c.ps.Subscribe(c.ctx, channel); err != nil {
			h.failLocked(c, fmt.Errorf("pub/sub subscribe: %w", err))
			return nil, nil, c.err
		}
	}
	sb.refs++
	return c, sb, nil
}

// leave drops a waiter added by join, unsubscribing the channel when it
// was the last one.
func (h *hub) leave(c *psConn, channel string, sb *sub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	sb.refs--
	if sb.refs > 0 || c.subs[channel] != sb {
		return
	}
	delete(c.subs, channel)
	if c.err != nil {
		return // the connection is gone, and its subscriptions with it
	}
	if err := c.ps.Unsubscribe(c.ctx, channel); err != nil {
		h.failLocked(c, fmt.Errorf("pub/sub unsubscribe: %w", err))
	}
}

// notifier returns the channel closed by the next message for sb.
func (h *hub) notifier(sb *sub) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return sb.notify
}

// open starts a connection and its dispatcher; h.mu is held. The PubSub
// connects on first use, in the dispatcher or in join's SUBSCRIBE.
func (h *hub) open() *psConn {
	ctx, cancel := context.WithCancel(context.Background())
	c := &psConn{
		ps:      h.client.Subscribe(ctx),
		ctx:     ctx,
		cancel:  cancel,
		failed:  make(chan struct{}),
		subs:    make(map[string]*sub),
		pending: make(map[string]int),
	}
	h.conn = c
	go h.dispatch(c)
	return c
}

// dispatch reads c until it fails or is closed, confirming subscriptions
// and waking waiters. It reads rather than using PubSub.Channel, which
// hides errors and reconnects on its own: a reconnected connection may
// have missed messages, and its waiters must know.
func (h *hub) dispatch(c *psConn) {
	pinged := false
	for {
		msg, err := c.ps.ReceiveTimeout(c.ctx, pingEvery)
		if c.ctx.Err() != nil {
			return
		}
		if err != nil {
			if isTimeout(err) && !pinged {
				pinged = true
				if err = c.ps.Ping(c.ctx); err == nil {
					continue
				}
			}
			if isTimeout(err) {
				err = fmt.Errorf("%w: pub/sub connection did not answer a ping within %v", storage.ErrUnavailable, pingEvery)
			}
			h.fail(c, err)
			return
		}
		pinged = false
		switch m := msg.(type) {
		case *goredis.Subscription:
			if m.Kind == "subscribe" {
				h.confirmed(c, m.Channel)
			}
		case *goredis.Message:
			h.notify(c, m.Channel)
		}
	}
}

// confirmed handles the confirmation of a SUBSCRIBE: once the last one
// sent for channel is confirmed, its waiters may look at the record.
func (h *hub) confirmed(c *psConn, channel string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch c.pending[channel] {
	case 0:
		// A confirmation nobody asked for: go-redis reconnected on its
		// own (a maintenance handoff) and subscribed again. Messages may
		// have been lost in between, so the waiters must not trust it.
		h.failLocked(c, fmt.Errorf("%w: pub/sub connection was re-established; messages may have been lost", storage.ErrUnavailable))
		return
	case 1:
		delete(c.pending, channel)
	default:
		c.pending[channel]--
		return
	}
	if sb := c.subs[channel]; sb != nil && !sb.isReady {
		sb.isReady = true
		close(sb.ready)
	}
}

// notify wakes the waiters on channel.
func (h *hub) notify(c *psConn, channel string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if sb := c.subs[channel]; sb != nil {
		close(sb.notify)
		sb.notify = make(chan struct{})
	}
}

// fail is failLocked for the dispatcher, which does not hold h.mu.
func (h *hub) fail(c *psConn, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failLocked(c, err)
}

// failLocked gives c up: its waiters return err, and the next join opens a
// new connection (after retryGap). h.mu is held.
func (h *hub) failLocked(c *psConn, err error) {
	if c.err != nil {
		return
	}
	c.err = err
	close(c.failed)
	c.cancel()
	if h.conn == c {
		h.conn = nil
		h.failedAt, h.failErr = time.Now(), err
	}
	// Not under h.mu: closing may wait for a reconnection go-redis started.
	go c.ps.Close()
}

// close gives the connection up for good; later joins fail.
func (h *hub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	if h.conn != nil {
		h.failLocked(h.conn, errClosed)
	}
}

// isTimeout reports whether err is a read that timed out.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
