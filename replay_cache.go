package idempotency

import (
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/cache"
)

// defaultReplayCacheTTL bounds how long a cached record is served before
// the shared store is asked again.
const defaultReplayCacheTTL = 10 * time.Second

// ReplayCache keeps completed records in this Caddy process in front of a
// shared store (Redis, PostgreSQL), so that repeated replays of a key cost
// no store round trip. Completed records never change, so a cached replay
// is the stored one; but a record deleted on another instance (through the
// admin API) is still replayed here until the entry's ttl ends. Off unless
// configured.
type ReplayCache struct {
	// The most records kept, oldest dropped first. Required.
	MaxEntries int `json:"max_entries,omitempty"`

	// How long a cached record is served before the store is asked again
	// (never beyond the record's own expiry). Default: 10s.
	TTL caddy.Duration `json:"ttl,omitempty"`
}

// config returns the cache's settings for the store's pool key, nil when
// there is no cache.
func (rc *ReplayCache) config() *cache.Options {
	if rc == nil {
		return nil
	}
	ttl := time.Duration(rc.TTL)
	if ttl == 0 {
		ttl = defaultReplayCacheTTL
	}
	return &cache.Options{MaxEntries: rc.MaxEntries, TTL: ttl}
}

func (rc *ReplayCache) validate() error {
	if rc == nil {
		return nil
	}
	if rc.MaxEntries <= 0 {
		return fmt.Errorf("replay_cache: max_entries must be positive, got %d", rc.MaxEntries)
	}
	if rc.TTL < 0 {
		return fmt.Errorf("replay_cache: ttl must be positive, got %s", time.Duration(rc.TTL))
	}
	return nil
}

// wrapCache puts the cache described by opts in front of s.
func wrapCache(s storage.Store, opts *cache.Options) storage.Store {
	if opts == nil {
		return s
	}
	return cache.New(s, *opts)
}

// parseReplayCache parses `replay_cache <max_entries> [<ttl>]`.
func parseReplayCache(d *caddyfile.Dispenser) (*ReplayCache, error) {
	args := d.RemainingArgs()
	if len(args) < 1 || len(args) > 2 {
		return nil, d.ArgErr()
	}
	rc := new(ReplayCache)
	if _, err := fmt.Sscan(args[0], &rc.MaxEntries); err != nil || rc.MaxEntries <= 0 {
		return nil, d.Errf("replay_cache: max_entries must be a positive integer, got '%s'", args[0])
	}
	if len(args) == 2 {
		ttl, err := caddy.ParseDuration(args[1])
		if err != nil || ttl <= 0 {
			return nil, d.Errf("replay_cache: ttl must be a positive duration, got '%s'", args[1])
		}
		rc.TTL = caddy.Duration(ttl)
	}
	return rc, nil
}
