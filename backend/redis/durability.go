package redis

import (
	"strconv"
	"sync"
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
	// option. A completion is never failed for it (the record is written
	// and the answer given). Either way it is counted in
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
		l := &shortfallLog{logger: logger, store: id, replicas: d.Replicas, proceed: d.Proceed, after: afterFunc}
		d.OnShortfall = l.add
	}
	return d
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

// shortfallLogEvery is how often at most a store's durability timeouts
// are logged.
const shortfallLogEvery = time.Second

// shortfallLog counts a store's durability timeouts and logs them: the
// first at once, the next ones held back and written as one line a
// second, with how many it stands for (a replica down under a thousand
// requests a second would otherwise write a thousand lines a second).
type shortfallLog struct {
	logger   *zap.Logger
	store    string
	replicas int
	proceed  bool
	// after runs f once d has passed (time.AfterFunc; tests replace it).
	after func(d time.Duration, f func())

	mu     sync.Mutex
	timing bool           // a line was written within the last second
	held   map[string]int // per op, since the last line
	acked  int            // the last shortfall's acknowledgements
}

func (l *shortfallLog) add(op string, acked int) {
	backend.CountDurabilityTimeout("redis", l.store, op)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.timing {
		if l.held == nil {
			l.held = make(map[string]int)
		}
		l.held[op]++
		l.acked = acked
		return
	}
	l.timing = true
	l.write(map[string]int{op: 1}, acked)
	l.after(shortfallLogEvery, l.flush)
}

// afterFunc is time.AfterFunc without its result.
func afterFunc(d time.Duration, f func()) { time.AfterFunc(d, f) }

// flush writes what was held back, and waits another second; with
// nothing held, the next shortfall logs at once.
func (l *shortfallLog) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.held) == 0 {
		l.timing = false
		return
	}
	l.write(l.held, l.acked)
	l.held = nil
	l.after(shortfallLogEvery, l.flush)
}

func (l *shortfallLog) write(ops map[string]int, acked int) {
	msg := "too few Redis replicas acknowledged idempotency writes in time; reservations fail as store errors (on_storage_error)"
	if l.proceed {
		msg = "too few Redis replicas acknowledged idempotency writes in time; going on (on_timeout proceed): a failover now may lose them"
	}
	l.logger.Warn(msg, zap.String("backend", "redis"), zap.String("store", l.store),
		zap.Int("reservations", ops["reserve"]), zap.Int("completions", ops["complete"]),
		zap.Int("replicas_wanted", l.replicas), zap.Int("replicas_acked", acked))
}
