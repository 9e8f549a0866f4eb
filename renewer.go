package idempotency

// Lease renewal, per store: every lease held on a store is renewed by the
// store's renewer, which sends one batch per tick for all of them (one
// round trip per store node, storage.BatchRenewer), so that the cost of
// keeping leases alive does not grow with the requests in flight.

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// Renewal cadence. The leases of one length are renewed together every
// length/renewals, counted from the start of the batch before whatever
// became of it, so that a slow batch never delays the next. A batch may
// take up to half a lease (attemptShare): a store a network hop away, or
// busy, still renews in time, and a reply that comes late is harmless
// (only a takeover fences a lease, and it replaces the token) and costs no
// connection. The lease so outlives any interruption d (the store
// unreachable or stalled, or this process stalled) with
// d + length/renewals + δ < length, δ being how long a renewal takes to
// land: 9/10 of the lease less δ (docs/guarantees.md).
const (
	renewals     = 10
	attemptShare = 2

	// maxOutstanding bounds the batches of one cadence outstanding at
	// once, against a store that does not honour deadlines: an attempt of
	// one that does ends within length/attemptShare, so that at most
	// renewals/attemptShare are ever outstanding and the bound holds back
	// none of them.
	maxOutstanding = renewals/attemptShare + 1

	// maxRenewingAlone bounds the renewals in flight at once for a store
	// that cannot renew a batch (no storage.BatchRenewer): one Renew per
	// lease, this many at a time.
	maxRenewingAlone = 64

	// failureLogEvery is how often at most a renewer logs its failures:
	// one line a second with their count, however many leases fail.
	failureLogEvery = time.Second
)

// renewers holds the renewer of every store with leases to renew. A
// renewer leaves once it has none.
var renewers = struct {
	mu sync.Mutex
	m  map[storage.Store]*renewer
}{m: make(map[storage.Store]*renewer)}

// renewerFor returns the renewer of s's store, made with s's latency
// observer and logger if the store has none yet.
func renewerFor(s *instrumentedStore, logger *zap.Logger) *renewer {
	renewers.mu.Lock()
	defer renewers.mu.Unlock()
	r := renewers.m[s.store]
	if r == nil {
		r = newRenewer(wallClock{}, s.store, s.latency["renew"], logger)
		r.registered = true
		renewers.m[s.store] = r
	}
	return r
}

// renewer renews the leases held on one store, grouped by length: each
// group on its own cadence, one batch per tick.
type renewer struct {
	store   storage.Store
	batcher storage.BatchRenewer // nil: one Renew per lease
	latency prometheus.Observer  // one observation per batch
	logger  *zap.Logger
	clock   clock

	mu         sync.Mutex
	groups     map[time.Duration]*cadence
	registered bool // in renewers, to leave it once idle
	failing    bool // a failure was logged, and no batch went well since

	// lines are the failures' log lines: one a second while they last.
	lines backend.LineLimiter[struct{}, renewalLog]
}

func newRenewer(c clock, store storage.Store, latency prometheus.Observer, logger *zap.Logger) *renewer {
	r := &renewer{store: store, latency: latency, logger: logger, clock: c, groups: make(map[time.Duration]*cadence)}
	r.batcher, _ = store.(storage.BatchRenewer)
	r.lines.Every = failureLogEvery
	r.lines.After = func(d time.Duration, f func()) { c.AfterFunc(d, f) }
	r.lines.Write = func(_ struct{}, lg renewalLog) { lg.warn(logger) }
	return r
}

// cadence is the leases of one length and their timer.
type cadence struct {
	length, every, timeout time.Duration
	leases                 map[*lease]struct{}
	timer                  stopper
	outstanding            int // batches sent and not yet answered
}

// hold starts renewing the lease named by token on key for length; the
// caller holds it until it calls stop.
func (r *renewer) hold(key storage.Key, token storage.Token, length time.Duration) *lease {
	l := &lease{key: key, token: token, length: length, holders: 1}
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.groups[length]
	if c == nil {
		every := length / renewals
		c = &cadence{length: length, every: every, timeout: length / attemptShare, leases: make(map[*lease]struct{})}
		r.groups[length] = c
		c.timer = r.clock.AfterFunc(every, func() { r.tick(c) })
	}
	c.leases[l] = struct{}{}
	return l
}

// tick renews the live leases of c in one batch, having first scheduled
// the next tick: however long this batch takes, the next starts on time.
func (r *renewer) tick(c *cadence) {
	r.mu.Lock()
	start := r.clock.Now()
	batch := make([]storage.Renewal, 0, len(c.leases))
	leases := make([]*lease, 0, len(c.leases))
	for l := range c.leases {
		if !l.alive() {
			delete(c.leases, l)
			continue
		}
		batch = append(batch, storage.Renewal{Key: l.key, Token: l.token, Lease: l.length})
		leases = append(leases, l)
	}
	if len(leases) == 0 {
		// Nothing left to renew: the group ends, and the renewer with
		// its last group.
		delete(r.groups, c.length)
		idle := len(r.groups) == 0 && r.registered
		r.mu.Unlock()
		if idle {
			r.leaveIfIdle()
		}
		return
	}
	c.timer = r.clock.AfterFunc(c.every, func() { r.tick(c) })
	if c.outstanding >= maxOutstanding {
		r.mu.Unlock()
		r.note(func(lg *renewalLog) { lg.held += len(batch) })
		return
	}
	c.outstanding++
	r.mu.Unlock()

	ctx, cancel := context.WithDeadline(context.Background(), start.Add(c.timeout))
	err := r.renew(ctx, batch)
	cancel()

	r.mu.Lock()
	c.outstanding--
	r.mu.Unlock()
	r.takeAnswers(leases, batch, err)
}

// renew sends one batch: in one call when the store can take it, else
// one Renew per lease, maxRenewingAlone at a time.
func (r *renewer) renew(ctx context.Context, batch []storage.Renewal) error {
	if r.batcher != nil {
		start := time.Now()
		err := r.batcher.RenewBatch(ctx, batch)
		r.instrument(start)
		return err
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxRenewingAlone)
	for i := range batch {
		sem <- struct{}{}
		wg.Add(1)
		go func(rn *storage.Renewal) {
			defer func() { <-sem; wg.Done() }()
			start := time.Now()
			rn.Err = r.store.Renew(ctx, rn.Key, rn.Token, rn.Lease)
			r.instrument(start)
		}(&batch[i])
	}
	wg.Wait()
	return nil
}

func (r *renewer) instrument(start time.Time) {
	if r.latency != nil {
		r.latency.Observe(time.Since(start).Seconds())
	}
}

// takeAnswers takes the store's answers for the leases of one batch.
func (r *renewer) takeAnswers(leases []*lease, batch []storage.Renewal, err error) {
	var failed, busy, lost int
	var example string
	for i, l := range leases {
		e := batch[i].Err
		if err != nil && e == nil {
			e = err
		}
		switch {
		case e == nil:
		case errors.Is(e, storage.ErrLeaseLost):
			if l.renewed(e) {
				lost++
				example = l.key.Hash()
			}
		case errors.Is(e, storage.ErrBusy):
			busy++
		default:
			failed++
			if err == nil {
				err = e
			}
		}
	}
	if failed+busy+lost == 0 {
		r.recovered()
		return
	}
	renewed := len(leases) - failed - busy - lost
	r.note(func(lg *renewalLog) {
		lg.renewed += renewed
		lg.failed += failed
		lg.busy += busy
		lg.lost += lost
		if example != "" {
			lg.lostExample = example
		}
		if failed > 0 {
			lg.err = err
		}
	})
}

// renewalLog is what a line about renewals says: what happened since the
// last one.
type renewalLog struct {
	renewed     int
	failed      int // renewals the store did not answer (err says why)
	busy        int // leases whose record was locked (PostgreSQL): tried again next tick
	lost        int // leases lost while their request ran
	held        int // leases not sent: too many batches outstanding
	lostExample string
	err         error
}

// note logs a trouble of renewals: at once, or gathered into the next
// line, one a second while they last (backend.LineLimiter), however many
// leases it is about.
func (r *renewer) note(add func(lg *renewalLog)) {
	r.mu.Lock()
	r.failing = true
	r.mu.Unlock()
	r.lines.Add(struct{}{}, add)
}

// recovered says, once, that renewals work again after a trouble: the
// trouble's last line first.
func (r *renewer) recovered() {
	r.mu.Lock()
	was := r.failing
	r.failing = false
	r.mu.Unlock()
	if was {
		r.lines.Flush(struct{}{})
		r.logger.Info("renewing idempotency leases works again")
	}
}

// warn logs the troubles of lg in one line.
func (lg *renewalLog) warn(logger *zap.Logger) {
	if lg.lost > 0 && lg.failed+lg.busy+lg.held == 0 {
		// Deleted by an admin, or taken over after a lapse: the records
		// are someone else's now.
		logger.Warn("idempotency leases lost while their requests run; their responses will not be recorded",
			zap.Int("leases", lg.lost), zap.String("key_hash", lg.lostExample))
		return
	}
	fields := []zap.Field{zap.Int("failed", lg.failed), zap.Int("renewed", lg.renewed)}
	if lg.busy > 0 {
		fields = append(fields, zap.Int("locked", lg.busy))
	}
	if lg.held > 0 {
		fields = append(fields, zap.Int("held_back", lg.held))
	}
	if lg.lost > 0 {
		fields = append(fields, zap.Int("lost", lg.lost), zap.String("key_hash", lg.lostExample))
	}
	if lg.err != nil {
		fields = append(fields, zap.Error(lg.err))
	}
	logger.Warn("renewing idempotency leases failed; retrying on their cadence", fields...)
}

// leaveIfIdle takes the renewer out of renewers once it has no lease
// left; a lease held meanwhile keeps it.
func (r *renewer) leaveIfIdle() {
	renewers.mu.Lock()
	defer renewers.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.groups) == 0 && renewers.m[r.store] == r {
		delete(renewers.m, r.store)
		r.registered = false
	}
}
