// Package memory is the default idempotency store: records live in the
// memory of one process, so it suits a single Caddy instance (or tests).
//
// Records are held in a sharded map, one mutex per shard, so requests for
// different keys rarely contend. Expired records and lapsed leases count as
// absent at once; a janitor goroutine frees their memory later. The number of
// records is bounded by Options.MaxKeys: when full, expired records are swept
// first, and if that does not help Reserve fails with storage.ErrFull. A live
// record is never evicted, because forgetting one would let a retry run a
// second time.
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
	DefaultMaxKeys         = 1_000_000
	DefaultMaxKeysPerScope = 10_000
	DefaultJanitorInterval = time.Minute
)

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
	// MaxKeysPerScope bounds the records one scope (one client) holds,
	// expired or not, so that no client can fill the store for the others
	// (default 10000; negative: no bound). A scope at its bound gets
	// storage.ErrScopeFull for new keys until the janitor frees its
	// expired records.
	MaxKeysPerScope int
	// JanitorInterval is how often expired records are deleted
	// (default 1 minute).
	JanitorInterval time.Duration
}

// Store is an in-process storage.Store and storage.Waiter. Create it with
// New and stop its janitor with Close.
type Store struct {
	// base anchors all times to the monotonic clock: entries keep
	// nanoseconds since base, so wall-clock jumps never expire or revive a
	// record, and entries hold no pointers for times. elapsed is the
	// clock (time.Since(base); tests set their own).
	base     time.Time
	elapsed  func() time.Duration
	max      int64
	maxScope int32        // per scope; 0: unbounded
	count    atomic.Int64 // records held across all shards
	shards   [numShards]shard
	scopes   [numShards]scopeShard
	seed     maphash.Seed // for scope ids

	sweepMu   sync.Mutex // one sweep at a time
	lastSweep int64      // guarded by sweepMu; nanoseconds since base

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
	if opts.MaxKeys <= 0 {
		opts.MaxKeys = DefaultMaxKeys
	}
	if opts.JanitorInterval <= 0 {
		opts.JanitorInterval = DefaultJanitorInterval
	}
	switch {
	case opts.MaxKeysPerScope == 0:
		opts.MaxKeysPerScope = DefaultMaxKeysPerScope
	case opts.MaxKeysPerScope < 0 || opts.MaxKeysPerScope > math.MaxInt32:
		opts.MaxKeysPerScope = 0
	}
	s := &Store{
		base:     base,
		elapsed:  elapsed,
		max:      int64(opts.MaxKeys),
		maxScope: int32(opts.MaxKeysPerScope),
		seed:     maphash.MakeSeed(),
		// The first full store may sweep at once.
		lastSweep:   -int64(minSweepGap),
		stop:        make(chan struct{}),
		janitorDone: make(chan struct{}),
	}
	for i := range s.shards {
		s.shards[i].m = make(map[recordID]*entry)
		s.scopes[i].m = make(map[scopeID]int32)
	}
	go s.janitor(opts.JanitorInterval)
	return s
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
