// Package redis is an idempotency store on Redis (go-redis v9): a single
// node, Redis Cluster or Sentinel, whatever goredis.UniversalClient it is
// given. Every Caddy instance pointing at the same Redis shares the records.
//
// # Round trips
//
// Each operation is one Lua script run with EVALSHA (EVAL once after the
// server's script cache was flushed), so it is atomic and costs one round
// trip: a new key costs two (Reserve, Complete), a replay one (Reserve).
// Reserve answers with everything its caller needs (the outcome and, for a
// replay, the recorded response), and never ships a body it does not need
// (Mismatch, Conflict, Get without the body).
//
// The scripts of concurrent operations share pipelines (pipeline.go).
// Lease renewals take a path of their own (renew.go): RenewBatch sends
// the renewals of every lease due as one pipeline, which costs one round
// trip per node whatever their number, through a client of their own
// (Options.RenewClient) whose sockets wait as long as the caller allows.
//
// # Data layout
//
// One Redis hash per record, under KeyPrefix plus the hex of the first 16
// bytes of SHA-256 over the scope and the key. Key names have a fixed
// length and carry no client bytes: the key cannot be read back from Redis,
// and a client's braces can never become a Cluster hash tag that piles
// records onto one slot. Each script touches that one key, so all of them
// run on Cluster. Fields:
//
//	f  request fingerprint
//	t  lease token (in flight only: its absence means completed)
//	c  creation time, Unix milliseconds
//	e  lease lapse (in flight) or expiry (completed), Unix milliseconds
//	h  recorded status and headers (storage.AppendResponse without the body)
//	b  recorded body, raw bytes
//	d  the response's Detail (absent when empty)
//	w  until when some instance waits on the record, Unix milliseconds
//
// Times come from the Redis server (TIME inside the scripts), so instances
// with skewed clocks agree on when a lease lapses. Expiry is native: a
// completed record lives for its TTL (PEXPIRE). An in-flight record lives
// past its lease, for as long again and at least a minute more, because
// its owner may still renew, complete or release a lapsed lease that
// nobody took over; until then the lapsed record counts as absent to
// Reserve, Get and Delete, which compare e with the server's clock.
//
// # Sharing
//
// Records that Reserve and Get return hold their body without a copy of
// the reply: callers must treat them as read-only, as the storage.Store
// contract says.
package redis

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/opterr"
)

// DefaultKeyPrefix starts the name of every key and channel the store uses
// when Options.KeyPrefix is empty.
const DefaultKeyPrefix = "idempotency:"

// lapsedGrace is the least time an in-flight record outlives its lease, so
// that an owner whose renewals failed for a while (a Redis failover, a
// network blip) can still renew or complete when nobody took the key over.
const lapsedGrace = time.Minute

// errClosed is returned by operations on a closed Store's waiter.
var errClosed = errors.New("redis store is closed")

// Options configures a Store.
type Options struct {
	// KeyPrefix starts every key and pub/sub channel name (default
	// DefaultKeyPrefix). Stores with different prefixes on one Redis never
	// see each other's records.
	KeyPrefix string

	// Timeout bounds each operation, retries and reconnection included,
	// when the caller's context has no earlier deadline; zero leaves only
	// the client's own timeouts. It has effect on socket reads and writes
	// only when the client has ContextTimeoutEnabled. RenewBatch takes
	// its caller's deadline instead, however long, and this one only
	// when the caller gives none.
	Timeout time.Duration

	// RenewClient is the client RenewBatch sends lease renewals through:
	// the same deployment as the Store's client, on connections of its
	// own, so that renewals never queue behind reservations and
	// completions (build it with NewRenewClient). The Store takes
	// ownership of it: Close closes it. Nil: renewals share the Store's
	// client (still one pipeline per node and batch).
	RenewClient goredis.UniversalClient

	// Secrets are scrubbed from every error's message, besides the
	// client's own password: those go-redis does not give back, such as
	// a Sentinel's (ClientOptions.Secrets lists them all).
	Secrets []string

	// Durability makes reservations and completions wait until replicas
	// acknowledged them (durability.go); the zero value waits for none.
	Durability Durability
}

// Check reports what is wrong with o. A KeyPrefix must not hold a brace:
// on Redis Cluster, a {...} in a key name is a hash tag, and a prefix
// holding one would put every record in one slot, on one node. An error
// names its option (an *opterr.Error), as ClientOptions.Check's do.
func (o Options) Check() error {
	switch {
	case strings.ContainsAny(o.KeyPrefix, "{}"):
		return opterr.Errorf("key_prefix", "redis storage: key_prefix must not contain '{' or '}' (on Redis Cluster it would be a hash tag putting every record in one slot), got %q", o.KeyPrefix)
	case o.Timeout < 0:
		return opterr.Errorf("timeout", "redis storage: timeout must be positive, got %v", o.Timeout)
	}
	return o.Durability.Check(o.Timeout)
}

// Store is a storage.Store and storage.Waiter on Redis. It owns its client:
// Close closes it.
type Store struct {
	client  goredis.UniversalClient
	renewer goredis.UniversalClient // RenewBatch's client: Options.RenewClient, or client
	prefix  string
	timeout time.Duration
	// durability is Options.Durability.
	durability Durability
	hub        *hub
	pipe       *pipeliner
	invalid    error // why the options are refused; nil when they are not

	// secrets are the client's passwords, which errors are scrubbed of.
	secrets []string

	renewTrips atomic.Int64 // pipelines of renewals sent to a node

	closeOnce sync.Once
	closeErr  error
}

var (
	_ storage.Store        = (*Store)(nil)
	_ storage.Waiter       = (*Store)(nil)
	_ storage.Pinger       = (*Store)(nil)
	_ storage.BatchRenewer = (*Store)(nil)
)

// New returns a Store that keeps its records through client and takes
// ownership of it, and of opts.RenewClient. It does not talk to Redis:
// the first operation connects, so New succeeds while Redis is down.
// Check opts first: with options that Options.Check refuses, every
// operation fails with that error, wrapping storage.ErrInvalid.
//
// The Caddy module builds its store as
//
//	client, _ := NewClient(o)
//	renew, _ := NewRenewClient(o)
//	s := New(client, Options{KeyPrefix: prefix, Timeout: o.Timeout, RenewClient: renew})
func New(client goredis.UniversalClient, opts Options) *Store {
	if opts.KeyPrefix == "" {
		opts.KeyPrefix = DefaultKeyPrefix
	}
	s := &Store{
		client:     client,
		renewer:    client,
		prefix:     opts.KeyPrefix,
		timeout:    opts.Timeout,
		durability: opts.Durability,
		hub:        newHub(client),
		pipe:       newPipeliner(client, opts.Durability),
		secrets:    append(secretsOf(client), opts.Secrets...),
	}
	if opts.RenewClient != nil {
		s.renewer = opts.RenewClient
	}
	if err := opts.Check(); err != nil {
		s.invalid = fmt.Errorf("%w: %w", storage.ErrInvalid, err)
	}
	countRenewalTrips(s.renewer, &s.renewTrips)
	return s
}

// Close stops waiting requests (their Wait returns an error), closes the
// pub/sub connection, the client and the renewal client. It is idempotent: later calls return
// the first call's result. Operations after Close fail.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.hub.close()
		s.pipe.close()
		s.closeErr = s.client.Close()
		if s.renewer != s.client {
			s.closeErr = cmp.Or(s.closeErr, s.renewer.Close())
		}
	})
	return s.closeErr
}

// Ping implements storage.Pinger: every node answers PING.
func (s *Store) Ping(ctx context.Context) error {
	if s.invalid != nil {
		return s.invalid
	}
	// Bounded like every operation: go-redis retries a failed dial
	// max_retries times, with backoffs, for as long as the context lets it.
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	if cc, ok := s.client.(*goredis.ClusterClient); ok {
		return s.classify(cc.ForEachShard(ctx, func(ctx context.Context, c *goredis.Client) error { return c.Ping(ctx).Err() }))
	}
	return s.classify(s.client.Ping(ctx).Err())
}

// keyName returns the Redis key of a record: the prefix and the hex of the
// first 16 bytes of the key's Digest.
func (s *Store) keyName(key storage.Key) string {
	sum := key.Digest()
	var buf [128]byte // on the stack for usual prefixes: the string is the one allocation
	return string(hex.AppendEncode(append(buf[:0], s.prefix...), sum[:16]))
}

// channelName returns the pub/sub channel on which the scripts announce
// that the in-flight record under keyName changed. It must match the
// channel built in the scripts' prelude.
func channelName(keyName string) string {
	return keyName + channelSuffix
}

// opContext applies the store's operation timeout to ctx.
func (s *Store) opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.timeout <= 0 {
		return ctx, func() {}
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= s.timeout {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.timeout)
}

// millis converts d, clamped to storage.MaxDuration, to whole
// milliseconds, rounding up so that a positive duration never becomes
// zero (PEXPIRE 0 would delete the key). Clamping first keeps the
// rounding, and keepMillis's doubling, clear of int64 overflow: a
// negative PEXPIRE deletes the key too.
func millis(d time.Duration) int64 {
	d = storage.Clamp(d)
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// keepMillis is how long an in-flight record with the given lease stays in
// Redis: the lease, then as long again and at least lapsedGrace.
func keepMillis(lease time.Duration) int64 {
	lease = storage.Clamp(lease)
	return millis(lease) + millis(max(lease, lapsedGrace))
}
