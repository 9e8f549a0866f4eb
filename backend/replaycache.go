package backend

import (
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/backend/cfargs"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/cache"
)

// defaultReplayCacheTTL bounds how long a cached record is served before
// the shared store is asked again.
const defaultReplayCacheTTL = 10 * time.Second

// The bounds of the replay cache's ttl. Below a second the cache saves
// next to nothing (retries come seconds apart), and such a value is most
// likely a unit mix-up (a JSON duration given as a bare number is
// nanoseconds); beyond a day an instance may go on replaying a record
// deleted elsewhere for longer than records are usually kept at all.
const (
	minReplayCacheTTL = time.Second
	maxReplayCacheTTL = 24 * time.Hour
)

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
	// (never beyond the record's own expiry). Default: 10s; 1s to 24h.
	TTL caddy.Duration `json:"ttl,omitempty"`
}

// Options returns the cache's settings, defaults filled in; nil when
// there is no cache.
func (rc *ReplayCache) Options() *cache.Options {
	if rc == nil {
		return nil
	}
	ttl := time.Duration(rc.TTL)
	if ttl == 0 {
		ttl = defaultReplayCacheTTL
	}
	return &cache.Options{MaxEntries: rc.MaxEntries, TTL: ttl}
}

// Check reports configuration errors of the cache of the backend named
// n, each about the option replay_cache (n.OptionErrorf). A nil cache is
// none, and fine.
func (rc *ReplayCache) Check(n Name) error {
	const opt = "replay_cache"
	switch {
	case rc == nil:
		return nil
	case rc.MaxEntries <= 0:
		return n.OptionErrorf(opt, "replay_cache: max_entries must be positive, got %d", rc.MaxEntries)
	case rc.TTL != 0 && rc.TTL < caddy.Duration(minReplayCacheTTL):
		return n.OptionErrorf(opt, "replay_cache: ttl must be at least %s, got %s", minReplayCacheTTL, time.Duration(rc.TTL))
	case rc.TTL > caddy.Duration(maxReplayCacheTTL):
		return n.OptionErrorf(opt, "replay_cache: ttl must be at most %s, got %s", maxReplayCacheTTL, time.Duration(rc.TTL))
	}
	return nil
}

// Wrap puts the cache described by opts (see Options) in front of s; a
// nil opts returns s.
func Wrap(s storage.Store, opts *cache.Options) storage.Store {
	if opts == nil {
		return s
	}
	return cache.New(s, *opts)
}

// ParseReplayCache parses the arguments of `replay_cache <max_entries>
// [<ttl>]`, the dispenser on the option's name; the values are checked
// by ReplayCache.Check.
func ParseReplayCache(d *caddyfile.Dispenser) (*ReplayCache, error) {
	args := d.RemainingArgs()
	if len(args) < 1 || len(args) > 2 {
		return nil, d.ArgErr()
	}
	rc := new(ReplayCache)
	n, err := strconv.Atoi(args[0])
	if err != nil {
		return nil, d.Errf("replay_cache: max_entries must be an integer, got '%s'", args[0])
	}
	rc.MaxEntries = n
	if len(args) == 2 {
		ttl, err := cfargs.ParseDuration("replay_cache ttl", args[1])
		if err != nil {
			return nil, d.Err(err.Error())
		}
		rc.TTL = caddy.Duration(ttl)
	}
	return rc, nil
}
