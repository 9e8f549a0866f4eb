// Package memory is the default idempotency store: records live in the
// memory of one process, so it suits a single Caddy instance (or tests).
//
// Records are held in a sharded map, one mutex per shard, so requests for
// different keys rarely contend. Expired records and lapsed leases count as
// absent at once; a janitor goroutine frees their memory later. The records
// are bounded in number (Options.MaxKeys) and in bytes (Options.MaxBytes):
// when full, expired records are swept first, then the oldest refusal
// records give way, and if that does not help Reserve fails with
// storage.ErrFull. No other live record is ever evicted, because
// forgetting one would let a retry run a second time.
//
// # Refusal records give way
//
// A completed record whose status is a refusal, 400-499, is kept and
// replayed as any other, but it gives way under pressure: a new key that
// finds the store full evicts the oldest refusal records (after the
// expired ones) before Reserve answers storage.ErrFull, and one that
// finds its scope past its share evicts the scope's own oldest refusal
// record before storage.ErrScopeFull. A refused request did nothing, so
// its retry running again cannot double an effect; records in flight and
// records of any other status never give way. Otherwise requests the
// upstream refuses (made-up credentials, each one a scope of its own,
// sent to a path that answers 404) would fill the store and shut every
// new key out. The store keeps its refusal records in lists, by age, in
// a slab of nodes without pointers: a refusal record costs about 75 bytes
// more (counted against MaxBytes), other records nothing, and a Reserve
// under pressure evicts in constant time. EvictedRefusals counts them.
//
// # One client among many
//
// So that one client (one scope) cannot deny service to the others, a
// scope gets a share of the store: Options.MaxKeysPerScope records
// (default a tenth of MaxKeys) and the same fraction of MaxBytes. The
// share binds only once the store is under pressure, holding half of
// MaxKeys or half of MaxBytes: until then a heavy client takes what it
// needs, since nobody else is short of room. Under pressure a scope past
// its share gets storage.ErrScopeFull for new keys (once its own refusal
// records, if it has any, have given way), and its completions
// keep status and headers without the body (as a response too large to
// record is kept); other scopes go on up to their own share. So one scope
// never holds much more than half the store, and the others always have
// the rest.
//
// Bytes are counted when they are taken: an entry when its key is
// reserved, the encoded response and detail when it is completed. A
// completion is never refused (the request ran; refusing its record would
// let a retry run it again): one that would take the store beyond
// MaxBytes keeps status and headers without the body, so MaxBytes is
// exceeded at most by the status lines and headers of the responses being
// recorded at that moment.
//
// A completed response is kept in storage's binary encoding, one
// pointer-free block per record, so that a store of a million records adds
// little to each garbage collection; a replay decodes it, sharing the body
// bytes rather than copying them. Callers must treat every returned
// Record, Response, body and fingerprint as read-only.
package memory

import (
	"crypto/sha256"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// Defaults used for Options fields that are zero or negative.
const (
	DefaultMaxKeys = 1_000_000
	// DefaultMaxBytes (1 GiB) holds the default MaxKeys of typical API
	// records (a few hundred bytes of entry and headers plus a body of a
	// few hundred bytes) with room to spare, so that with small responses
	// MaxKeys binds first; with large ones (up to the Caddy module's
	// default max_response_size of 1 MiB) it stops a few thousand records
	// from taking the memory of the machine.
	DefaultMaxBytes        = 1 << 30
	DefaultJanitorInterval = time.Minute
)

// DefaultScopeShare is the fraction of MaxKeys that MaxKeysPerScope
// defaults to: a tenth.
const DefaultScopeShare = 10

// numShards is a power of two so a hash picks a shard with a mask. 64 shards
// keep lock contention low on machines with dozens of cores while costing
// only a few KiB.
const numShards = 64

// minSweepGap bounds how often a full store sweeps on behalf of Reserve: a
// sweep walks every record, and a store that stays full of live records
// would otherwise sweep on every new key.
const minSweepGap = 100 * time.Millisecond

// Options configures a Store.
type Options struct {
	// MaxKeys bounds the records held, expired or not (default 1000000).
	MaxKeys int
	// MaxBytes bounds the bytes the records take, expired or not: each
	// record's entry, fingerprint, encoded response and detail (default
	// DefaultMaxBytes). See the package documentation.
	MaxBytes int64
	// MaxKeysPerScope is a scope's (one client's) share of the store:
	// this many records, and the same fraction of MaxBytes, once the store
	// is under pressure (see the package documentation); default MaxKeys
	// divided by DefaultScopeShare; negative: no share, one scope may fill
	// the store. Expired records count until the janitor frees them.
	MaxKeysPerScope int
	// JanitorInterval is how often expired records are deleted
	// (default 1 minute).
	JanitorInterval time.Duration
	// OnRemove, when set, is told of the records the store removed on
	// its own: n expired records and lapsed leases a sweep deleted
	// (expired true), or one refusal record evicted to make room
	// (expired false). It is called holding no record's lock, and must
	// be quick. Not part of the configuration (no JSON).
	OnRemove func(expired bool, n int64) `json:"-"`
}

// Store is an in-process storage.Store and storage.Waiter. Create it with
// New and stop its janitor with Close.
type Store struct {
	// base anchors all times to the monotonic clock: entries keep
	// nanoseconds since base, so wall-clock jumps never expire or revive a
	// record, and entries hold no pointers for times. elapsed is the
	// clock (time.Since(base); tests set their own).
	base          time.Time
	elapsed       func() time.Duration
	max           int64
	maxBytes      int64
	maxScope      int32        // a scope's share of records; 0: no share
	maxScopeBytes int64        // a scope's share of bytes
	count         atomic.Int64 // records held across all shards
	bytes         atomic.Int64 // their footprint (see entry.footprint)
	shards        [numShards]shard
	scopes        [numShards]scopeShard
	seed          maphash.Seed // for scope ids

	sweepMu   sync.Mutex // one sweep at a time
	lastSweep int64      // guarded by sweepMu; nanoseconds since base

	// refusals lists the refusal records, which give way under pressure
	// (refusal.go), when tracksRefusals.
	refusals       refusals
	tracksRefusals bool
	evicted        atomic.Int64 // refusal records evicted
	onRemove       func(expired bool, n int64)

	closeOnce   sync.Once
	stop        chan struct{} // closed by Close
	janitorDone chan struct{} // closed when the janitor has returned
}

// shard is one lock and the records whose key hashes to it.
type shard struct {
	shardState
	// Padding to two cache lines keeps neighbouring shards' locks from
	// sharing a line (and the adjacent-line prefetcher), which would make
	// independent keys contend after all.
	_ [128 - unsafe.Sizeof(shardState{})%128]byte
}

type shardState struct {
	mu sync.Mutex
	m  map[recordID]*entry
}

var (
	_ storage.Store  = (*Store)(nil)
	_ storage.Waiter = (*Store)(nil)
)

// New returns a Store and starts its janitor goroutine; call Close to stop
// it.
func New(opts Options) *Store {
	base := time.Now()
	return newStore(opts, base, func() time.Duration { return time.Since(base) })
}

// newStore is New on the clock elapsed, which tells the time since base
// (tests pass a clock they move by hand).
func newStore(opts Options, base time.Time, elapsed func() time.Duration) *Store {
	opts = opts.WithDefaults()
	if opts.MaxKeysPerScope < 0 || opts.MaxKeysPerScope > math.MaxInt32 {
		opts.MaxKeysPerScope = 0
	}
	s := &Store{
		base:     base,
		elapsed:  elapsed,
		max:      int64(opts.MaxKeys),
		maxBytes: opts.MaxBytes,
		maxScope: int32(opts.MaxKeysPerScope),
		// The same fraction of the bytes as of the records.
		maxScopeBytes: int64(float64(opts.MaxBytes) * min(1, float64(opts.MaxKeysPerScope)/float64(opts.MaxKeys))),
		seed:          maphash.MakeSeed(),
		// The first full store may sweep at once.
		lastSweep:      -int64(minSweepGap),
		tracksRefusals: int64(opts.MaxKeys) <= maxRefusals,
		onRemove:       opts.OnRemove,
		stop:           make(chan struct{}),
		janitorDone:    make(chan struct{}),
	}
	s.refusals.init(s.maxScope != 0)
	for i := range s.shards {
		s.shards[i].m = make(map[recordID]*entry)
		s.scopes[i].m = make(map[scopeID]scopeUse)
	}
	go s.janitor(opts.JanitorInterval)
	return s
}

// WithDefaults returns o with its zero and negative fields set to their
// defaults (a negative MaxKeysPerScope stays: no share).
func (o Options) WithDefaults() Options {
	if o.MaxKeys <= 0 {
		o.MaxKeys = DefaultMaxKeys
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.MaxKeysPerScope == 0 {
		o.MaxKeysPerScope = max(1, o.MaxKeys/DefaultScopeShare)
	}
	if o.JanitorInterval <= 0 {
		o.JanitorInterval = DefaultJanitorInterval
	}
	return o
}

// Close stops the janitor and waits for it to return. It is idempotent and
// always returns nil. The records stay usable: operations after Close still
// work, only expired records are no longer freed in the background.
func (s *Store) Close() error {
	s.closeOnce.Do(func() { close(s.stop) })
	<-s.janitorDone
	return nil
}

// Len returns the number of records held, expired or not yet swept
// included. It is meant for tests and metrics.
func (s *Store) Len() int {
	return int(s.count.Load())
}

// Bytes returns the bytes the records take as the store counts them
// against MaxBytes, expired or not yet swept included. It is meant for
// tests and metrics.
func (s *Store) Bytes() int64 {
	return s.bytes.Load()
}

// recordID names a record inside the store: its key's Digest. Maps keyed
// by it hold no pointers (the key's strings would be two per record for
// every garbage collection to scan), and its first byte, uniformly spread,
// picks the shard.
type recordID [sha256.Size]byte

// shardFor returns the shard and the id of key.
func (s *Store) shardFor(key storage.Key) (*shard, recordID) {
	id := recordID(key.Digest())
	return &s.shards[id[0]&(numShards-1)], id
}
