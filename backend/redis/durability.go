package redis

import (
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
	"github.com/caddy-idempotency/caddy-idempotency/backend/cfargs"
	redisstore "github.com/caddy-idempotency/caddy-idempotency/storage/redis"
)

// What a durability timeout does (Durability.OnTimeout).
const (
	onTimeoutFail    = "fail"
	onTimeoutProceed = "proceed"
)

// Durability makes each reservation and completion wait until replicas
// of the Redis primary that took it acknowledged it (WAIT, sent right
// behind the write on its connection: no extra round trip), so that a
// failover to one of them keeps it. On Cluster, each node waits for its
// own replicas. Releases and lease renewals are not waited for.
type Durability struct {
	// How many replicas must acknowledge each reservation and completion.
	// At least 1.
	Replicas int `json:"replicas,omitempty"`

	// How long to wait for them (WAIT's timeout). Default: 1s; it must be
	// shorter than the storage's timeout.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// What a reservation that too few replicas acknowledged in time does:
	// "fail" (default) makes it a store error, which the handler's
	// on_storage_error decides on (fail_closed answers 503 and releases
	// the reservation; fail_open passes the request on without
	// idempotency); "proceed" runs the request on it, as without this
	// option. A completion that falls short, either way, is recorded on
	// the primary and its answer given, and is sent again in the
	// background, its lease kept alive, until a replica acknowledges it
	// (or a new primary has it): a failover meanwhile would otherwise
	// bring the record back in flight, and the retry would run again once
	// its lease lapsed. Each is counted in
	// caddy_http_idempotency_store_durability_timeouts_total and logged,
	// at most once a second per store.
	OnTimeout string `json:"on_timeout,omitempty"`
}

// durabilityConfig is the durability part of a redisConfig, in the
// store's terms (and hashed into the pool's key, so without functions).
type durabilityConfig struct {
	Replicas int
	Timeout  time.Duration
	Proceed  bool
}

// store returns c as the store's Durability, its shortfalls counted and
// logged as the store named id.
func (c durabilityConfig) store(logger *zap.Logger, id string) redisstore.Durability {
	d := redisstore.Durability{Replicas: c.Replicas, Timeout: c.Timeout, Proceed: c.Proceed}
	if d.Replicas > 0 {
		d.OnShortfall = shortfallLog(logger, id, d.Replicas, d.Proceed).Add
	}
	return d
}

// shortfallLog is the log and the count of a store's durability timeouts.
func shortfallLog(logger *zap.Logger, id string, replicas int, proceed bool) *backend.DurabilityLog {
	msg := "too few Redis replicas acknowledged idempotency writes in time; reservations fail as store errors (on_storage_error), completions are sent again until replicas have them"
	if proceed {
		msg = "too few Redis replicas acknowledged idempotency writes in time; reservations go on (on_timeout proceed): a failover now may lose them; completions are sent again until replicas have them"
	}
	return &backend.DurabilityLog{Logger: logger, Backend: name, Store: id, Message: msg,
		Fields: func(acked int) []zap.Field {
			return []zap.Field{zap.Int("replicas_wanted", replicas), zap.Int("replicas_acked", acked)}
		}}
}

// parseDurability parses `durability replicas <n> [<timeout>] [on_timeout fail|proceed]`.
func parseDurability(d *caddyfile.Dispenser) (*Durability, error) {
	args := d.RemainingArgs()
	if len(args) < 2 || args[0] != "replicas" {
		return nil, d.Err("durability: want 'durability replicas <n> [<timeout>] [on_timeout fail|proceed]'")
	}
	out := new(Durability)
	n, err := strconv.Atoi(args[1])
	if err != nil {
		return nil, d.Errf("durability: replicas must be an integer, got '%s'", args[1])
	}
	out.Replicas = n
	rest := args[2:]
	if len(rest) > 0 && rest[0] != "on_timeout" {
		t, err := cfargs.ParseDuration("durability timeout", rest[0])
		if err != nil {
			return nil, d.Err(err.Error())
		}
		if t <= 0 {
			// Zero would otherwise read as "not given" (the default,
			// 1s), as a negative one reads as "not positive" in compile.
			return nil, d.Errf("durability timeout must be positive, got '%s'", rest[0])
		}
		out.Timeout = caddy.Duration(t)
		rest = rest[1:]
	}
	switch {
	case len(rest) == 0:
	case len(rest) == 2 && rest[0] == "on_timeout":
		out.OnTimeout = rest[1]
	default:
		return nil, d.Err("durability: want 'durability replicas <n> [<timeout>] [on_timeout fail|proceed]'")
	}
	return out, nil
}
