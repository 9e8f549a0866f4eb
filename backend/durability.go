package backend

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// DurabilityResult is what a store said, when last asked, about what
// protects its records across a failover (storage.DurabilityReporter).
type DurabilityResult struct {
	// At is when it was asked; zero when never (or the store cannot
	// tell).
	At time.Time
	// Facts are the store's facts, a value encoding/json writes as an
	// object; nil when it did not answer. They may come with Err (a
	// PostgreSQL standby says what it is, and that it refuses writes).
	Facts any
	// Err is why the store cannot keep records there, or did not answer.
	Err error
}

// durability asks the store for its facts (if it can tell), records the
// result and returns it.
func (p *pooledStore) durability(ctx context.Context) DurabilityResult {
	d, ok := p.Store.(storage.DurabilityReporter)
	if !ok {
		return DurabilityResult{}
	}
	r := DurabilityResult{At: time.Now()}
	r.Facts, r.Err = d.Durability(ctx)
	if r.Facts == nil && r.Err == nil {
		return DurabilityResult{} // a wrapper around a store that cannot tell
	}
	p.mu.Lock()
	if !r.At.Before(p.lastDurability.At) { // the last one asked, as for pings
		p.lastDurability = r
	}
	p.mu.Unlock()
	return r
}

// logDurability logs what protects the records of a store just opened and
// pinged, and warns when it cannot keep them where it is connected.
func (p *pooledStore) logDurability(ctx context.Context, logger *zap.Logger, id, where string) {
	r := p.durability(ctx)
	if r.At.IsZero() {
		return
	}
	fields := []zap.Field{zap.String("backend", p.backend), zap.String("store", id), zap.String("address", where), zap.Any("durability", r.Facts)}
	switch {
	case r.Err != nil && errors.Is(r.Err, storage.ErrUnavailable):
		logger.Warn("idempotency store cannot keep records where it is connected; requests using it follow on_storage_error", append(fields, zap.Error(r.Err))...)
		return
	case r.Err != nil:
		// It can keep them, but may lose some without a fault of its own
		// (a Redis that evicts, or keeps nothing on disk and has no
		// replica; a PostgreSQL with fsync or synchronous_commit off), or
		// less durably than configured (a Redis primary short of
		// replicas, with on_timeout proceed). The error says which, and
		// the fix.
		logger.Warn("idempotency store may lose records where it is connected; requests using it go on", append(fields, zap.Error(r.Err))...)
		return
	}
	logger.Info("idempotency store durability", fields...)
}

// LastDurability is the store's facts when last asked: at start, or by
// the last Durability.
func (s LiveStore) LastDurability() DurabilityResult {
	s.entry.mu.Lock()
	defer s.entry.mu.Unlock()
	return s.entry.lastDurability
}

// Durability asks the store now what protects its records across a
// failover (a zero result for a store that cannot tell), and records the
// result as its last.
func (s LiveStore) Durability(ctx context.Context) DurabilityResult { return s.entry.durability(ctx) }

// durabilityLogEvery is how often at most a store's durability timeouts
// are logged.
const durabilityLogEvery = time.Second

// DurabilityLog counts a store's durability timeouts (writes that fewer
// replicas or standbys than it waits for acknowledged in time) in
// caddy_http_idempotency_store_durability_timeouts_total, and logs them:
// the first at once, the next ones held back and written as one line a
// second, with how many of each op it stands for (a replica down under a
// thousand requests a second would otherwise write a thousand lines a
// second).
type DurabilityLog struct {
	Logger  *zap.Logger
	Backend Name   // the backend's name
	Store   string // the store's (Pooled.StoreID)
	Message string // what a line says
	// Fields, when set, adds fields to each line, from the detail the
	// last timeout came with (a Redis store's acknowledgements).
	Fields func(detail int) []zap.Field
	// After runs f once d has passed; nil: time.AfterFunc (tests replace
	// it).
	After func(d time.Duration, f func())

	once  sync.Once
	lines LineLimiter[struct{}, timeouts]
}

// timeouts is what one line of a DurabilityLog stands for.
type timeouts struct {
	reserves, completes int
	detail              int // the last timeout's
}

// Add counts and logs one timeout of op ("reserve", "complete") with
// its detail. It does not block.
func (l *DurabilityLog) Add(op string, detail int) {
	CountDurabilityTimeout(l.Backend, l.Store, op)
	l.once.Do(func() {
		l.lines.Write, l.lines.Every, l.lines.After = l.write, durabilityLogEvery, l.After
	})
	l.lines.Add(struct{}{}, func(t *timeouts) {
		switch op {
		case "reserve":
			t.reserves++
		case "complete":
			t.completes++
		}
		t.detail = detail
	})
}

func (l *DurabilityLog) write(_ struct{}, t timeouts) {
	fields := []zap.Field{zap.String("backend", string(l.Backend)), zap.String("store", l.Store),
		zap.Int("reservations", t.reserves), zap.Int("completions", t.completes)}
	if l.Fields != nil {
		fields = append(fields, l.Fields(t.detail)...)
	}
	l.Logger.Warn(l.Message, fields...)
}
