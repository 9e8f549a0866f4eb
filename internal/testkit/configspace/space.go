package configspace

import (
	"strconv"
	"strings"
)

// Values shared by the numeric settings.
var (
	// hugeInts are at and past what an int32 holds, and past an int64.
	hugeInts = []string{"2147483647", "2147483648", "9223372036854775808"}
	// malformed numbers and durations.
	malformed = []string{"x", "1.5e", "--1"}
)

// param is a setting and its values by verdict.
type param struct {
	place           Place
	name            string
	kind            kind
	accept, refuse  []string
	either          []string
	caddyfileAccept []string // accepted values only the Caddyfile can say (a size such as 1MB)
}

// kind says how a value is written in JSON.
type kind uint8

const (
	kString   kind = iota // a JSON string
	kInt                  // a JSON number when it is one, else a string (refused by the JSON decoder)
	kBool                 // true/false
	kList                 // a JSON array of the Caddyfile's tokens
	kFlag                 // an option without argument: true
	kDuration             // a JSON string (Caddy's duration)
)

// ints is a numeric parameter with its accepted range [lo, hi] (the
// module's bounds): refused below and above, and malformed.
func ints(place Place, name string, lo, hi int64, accept ...string) param {
	p := param{place: place, name: name, kind: kInt, accept: accept}
	p.refuse = append(p.refuse, strconv.FormatInt(lo-1, 10), strconv.FormatInt(hi+1, 10))
	if lo == 1 && (place == Redis || place == Postgres || place == Memory) {
		// 0 is no value in JSON (the default), and a value in the
		// Caddyfile (refused).
		p.refuse, p.either = p.refuse[1:], []string{"0"}
	}
	if lo-1 != -5 && lo > -5 {
		p.refuse = append(p.refuse, "-5")
	}
	for _, v := range hugeInts {
		if n, err := strconv.ParseInt(v, 10, 64); err != nil || n > hi {
			p.refuse = append(p.refuse, v)
		}
	}
	p.refuse = append(p.refuse, malformed...)
	return p
}

// durations is a duration parameter: accept and refuse as given, and the
// malformed values and one that overflows refused.
func durations(place Place, name string, accept, refuse []string) param {
	refuse = append(append(refuse, "9999999999999h"), malformed...)
	return param{place: place, name: name, kind: kDuration, accept: accept, refuse: refuse}
}

// withEither adds values to p whose fate depends on the machine.
func withEither(p param, values ...string) param {
	p.either = append(p.either, values...)
	return p
}

func enum(place Place, name string, accept, either, refuse []string) param {
	return param{place: place, name: name, kind: kString, accept: accept, either: either, refuse: refuse}
}

// The module's bounds (docs/storage-redis.md, docs/storage-postgres.md).
const (
	maxPoolSize     = 10000    // connections of a pool, per node
	maxBufferSize   = 16 << 20 // go-redis's pipeline buffers
	maxRetries      = 100
	maxCacheEntries = 10000 // pgx's statement and description caches
	maxConnectSecs  = 3600  // pgx's connect_timeout
)

// params is the space.
func params() []param {
	ps := []param{
		// The handler (on the memory store).
		durations(Handler, "ttl", []string{"1s", "24h", "3650d"}, []string{"-1s", "1ns", "999ms", "3651d"}),
		durations(Handler, "lock_timeout", []string{"1s", "30s", "24h"}, []string{"-1s", "500ms", "25h"}),
		durations(Handler, "wait_timeout", []string{"10ms", "1h"}, []string{"-1s", "1ms", "2h"}),
		{place: Handler, name: "max_key_length", kind: kInt, accept: []string{"64", "255", "4096", "2147483647"},
			refuse: append([]string{"-1", "-5", "9223372036854775808"}, malformed...)},
		// The Caddyfile's sizes stop short of an int64.
		{place: Handler, name: "max_body_size", kind: kInt, accept: []string{"2", "1048576"}, either: []string{"9223372036854775807"},
			caddyfileAccept: []string{"1MB"}, refuse: append([]string{"-1", "-5"}, malformed...)},
		{place: Handler, name: "max_response_size", kind: kInt, accept: []string{"1", "1048576"}, either: []string{"9223372036854775807"},
			caddyfileAccept: []string{"1MiB"}, refuse: append([]string{"-1", "-5"}, malformed...)},
		{place: Handler, name: "methods", kind: kList, accept: []string{"POST", "POST PUT", "put"}, refuse: []string{"P(ST", "GET,POST"}},
		{place: Handler, name: "header", kind: kString, accept: []string{"Idempotency-Key", "X-Request-Key"}, refuse: []string{"X:Key", "(x)"}},
		{place: Handler, name: "required", kind: kFlag, accept: []string{""}},
		{place: Handler, name: "release_on", kind: kList, accept: []string{"5xx", "409", "4xx 5xx", "429"},
			refuse: []string{"200", "201", "204", "2xx", "2XX", "199", "600", "6xx", "x", "3xx 2xx"}},
		enum(Handler, "in_flight", []string{"wait", "reject"}, nil, []string{"x", "WAIT"}),
		enum(Handler, "on_storage_error", []string{"fail_closed", "fail_open"}, nil, []string{"x", "open"}),
		enum(Handler, "mode", []string{"enforce", "observe"}, nil, []string{"x"}),
		enum(Handler, "errors", []string{"problem", "handle_errors"}, nil, []string{"x"}),
		enum(Handler, "docs_url", []string{"https://example.com/docs"}, nil, []string{"x", "/docs", "https://"}),
		enum(Handler, "key_json", []string{"/id", "/a~1b/0"}, nil, []string{"id", "/~2"}),
		// Headers a replay must not set, and hop-by-hop ones.
		enum(Handler, "replay_header", []string{"Idempotent-Replayed", "X-Replayed", "off"}, nil,
			[]string{"Content-Length", "content-length", "Transfer-Encoding", "Content-Encoding", "Date", "Connection",
				"Keep-Alive", "Proxy-Connection", "Upgrade", "TE", "Trailer", "Content-Type", "X:Y"}),

		// storage memory options.
		// max_keys 1 is full after one keyed request: a store-full 503 for the next.
		{place: Memory, name: "max_keys", kind: kInt, accept: []string{"1000", "1000000"}, either: []string{"0", "1", "2147483647", "9223372036854775807"},
			refuse: append([]string{"-1", "-5", "9223372036854775808"}, malformed...)},
		{place: Memory, name: "max_keys_per_scope", kind: kInt, accept: []string{"1", "100"}, either: []string{"0", "9223372036854775807"},
			refuse: append([]string{"-1", "-5"}, malformed...)},
		{place: Memory, name: "max_bytes", kind: kInt, accept: []string{"1048576", "1073741824"}, caddyfileAccept: []string{"64MiB"},
			either: []string{"0", "1", "9223372036854775807"}, refuse: append([]string{"-1", "-5"}, malformed...)},

		// storage redis options.
		ints(Redis, "pool_size", 1, maxPoolSize, "1", "100", "10000"),
		// 10ms is legal, and may be too short for a loaded machine.
		withEither(durations(Redis, "dial_timeout", []string{"1s", "1m"}, []string{"-1s", "1ns", "9ms", "61s"}), "10ms"),
		withEither(durations(Redis, "timeout", []string{"2s", "1m"}, []string{"-1s", "1ns", "9ms", "61s"}), "10ms"),

		// storage redis url parameters (go-redis's ParseURL).
		ints(RedisURL, "pool_size", 0, maxPoolSize, "0", "1", "10000"),
		ints(RedisURL, "min_idle_conns", 0, maxPoolSize, "0", "1"),
		ints(RedisURL, "max_idle_conns", 0, maxPoolSize, "0", "1", "10"),
		ints(RedisURL, "max_active_conns", 0, maxPoolSize, "0", "8", "10000"),
		ints(RedisURL, "max_concurrent_dials", 0, maxPoolSize, "0", "1", "8"),
		ints(RedisURL, "pipeline_pool_size", -1, maxPoolSize, "-1", "0", "4"),
		ints(RedisURL, "pipeline_read_buffer_size", 0, maxBufferSize, "0", "4096", "1048576"),
		ints(RedisURL, "pipeline_write_buffer_size", 0, maxBufferSize, "0", "4096"),
		ints(RedisURL, "max_retries", -1, maxRetries, "-1", "0", "3", "100"),
		ints(RedisURL, "db", 0, 1<<31-1, "0", "1", "15"),
		{place: RedisURL, name: "protocol", kind: kInt, accept: []string{"2", "3"}, refuse: append([]string{"-1", "1", "4", "2147483648"}, malformed...)},
		withEither(durations(RedisURL, "dial_timeout", []string{"1s", "3", "1m"}, []string{"-1s", "0", "0s", "-1", "1ns", "9ms", "61s", "1h"}), "10ms"),
		withEither(durations(RedisURL, "pool_timeout", []string{"1s", "1m"}, []string{"-1s", "0", "0s", "1ns", "61s"}), "10ms"),
		// The timeout option sets the reads' and writes' timeouts.
		durations(RedisURL, "read_timeout", nil, []string{"1s", "-1s", "0"}),
		durations(RedisURL, "write_timeout", nil, []string{"1s", "-1s", "0"}),
		// -1 (or 0, or less) turns these off: go-redis's way to say so.
		durations(RedisURL, "conn_max_idle_time", []string{"-1", "0", "30m", "10ms"}, []string{"1ns", "9ms"}),
		durations(RedisURL, "idle_timeout", []string{"-1", "30m"}, []string{"1ns"}),
		durations(RedisURL, "conn_max_lifetime", []string{"-1", "0", "1h", "10ms"}, []string{"1ns", "9ms"}),
		durations(RedisURL, "max_conn_age", []string{"-1", "1h"}, []string{"1ns"}),
		durations(RedisURL, "min_retry_backoff", []string{"-1", "8ms", "1s"}, []string{"61s"}),
		durations(RedisURL, "max_retry_backoff", []string{"-1", "512ms", "1m"}, []string{"61s", "1h"}),
		durations(RedisURL, "conn_max_lifetime_jitter", []string{"-1", "0", "1s"}, []string{"1ns"}),
		{place: RedisURL, name: "pool_fifo", kind: kBool, accept: []string{"true", "false", "1", "0"}, refuse: []string{"maybe", "yes"}},
		{place: RedisURL, name: "client_name", kind: kString, accept: []string{"caddy", "caddy-idempotency.1"}, refuse: []string{"a b", "a\nb", "é"}},
		// TLS without rediss:// is refused by go-redis as an unknown parameter.
		{place: RedisURL, name: "skip_verify", kind: kBool, either: []string{"true"}},
		{place: RedisURL, name: "no_such_parameter", kind: kString, refuse: []string{"1"}},

		// storage postgres options.
		ints(Postgres, "max_conns", 1, maxPoolSize, "1", "16", "10000"),
		// 10ms is too short for the first request here, which connects
		// and creates the table.
		{place: Postgres, name: "timeout", kind: kDuration, accept: []string{"2s", "1m"}, either: []string{"10ms"},
			refuse: append([]string{"-1s", "1ns", "9ms", "61s", "9999999999999h"}, malformed...)},
		durations(Postgres, "cleanup_interval", []string{"1s", "5m", "30d"}, []string{"-1s", "1ns", "999ms", "31d"}),

		// storage postgres dsn parameters (pgx's and pgxpool's ParseConfig).
		ints(PostgresDSN, "pool_max_conns", 1, maxPoolSize, "1", "4", "10000"),
		ints(PostgresDSN, "pool_min_conns", 0, maxPoolSize, "0", "1"),
		ints(PostgresDSN, "pool_min_idle_conns", 0, maxPoolSize, "0", "1"),
		durations(PostgresDSN, "pool_max_conn_lifetime", []string{"0s", "1h", "1s"}, []string{"-1s", "1ns", "999ms"}),
		durations(PostgresDSN, "pool_max_conn_lifetime_jitter", []string{"0s", "1m"}, []string{"-1s"}),
		durations(PostgresDSN, "pool_max_conn_idle_time", []string{"0s", "30m", "1s", "1ns"}, []string{"-1s"}),
		durations(PostgresDSN, "pool_health_check_period", []string{"100ms", "1s", "1m", "24h"}, []string{"0s", "0", "-1s", "1ns", "99ms"}),
		durations(PostgresDSN, "pool_ping_timeout", []string{"0s", "1s"}, []string{"-1s"}),
		ints(PostgresDSN, "connect_timeout", 0, maxConnectSecs, "0", "1", "10"),
		ints(PostgresDSN, "statement_cache_capacity", 1, maxCacheEntries, "1", "512"),
		ints(PostgresDSN, "description_cache_capacity", 0, maxCacheEntries, "0", "512"),
		enum(PostgresDSN, "default_query_exec_mode", []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"}, nil, []string{"x", "CACHE_STATEMENT"}),
		enum(PostgresDSN, "target_session_attrs", []string{"any", "read-write", "primary", "prefer-standby"}, []string{"read-only", "standby"}, []string{"x"}),
		enum(PostgresDSN, "sslmode", []string{"disable", "allow", "prefer"}, []string{"require", "verify-ca", "verify-full"}, []string{"x"}),
		enum(PostgresDSN, "channel_binding", []string{"disable", "prefer"}, []string{"require"}, []string{"x"}),
		enum(PostgresDSN, "min_protocol_version", []string{"3.0"}, nil, []string{"x", "2.0"}),
		enum(PostgresDSN, "max_protocol_version", []string{"3.0", "latest"}, nil, []string{"x"}),
		// A typo of a pool parameter would be sent to the server as a
		// setting, which refuses every connection.
		enum(PostgresDSN, "pool_max_conn", nil, nil, []string{"4"}),
		enum(PostgresDSN, "pool_size", nil, nil, []string{"4"}),
		// Other parameters are the server's settings: one it knows serves,
		// one it does not refuses every connection.
		enum(PostgresDSN, "application_name", []string{"caddy"}, nil, nil),
		enum(PostgresDSN, "no_such_setting", nil, []string{"1"}, nil),
	}
	return ps
}

// Cases is the space: every value of every setting, and the named cases
// of issue 38's findings and of combinations of settings.
func Cases() []Case {
	var out []Case
	for _, p := range params() {
		add := func(values []string, want Verdict, caddyfileOnly bool) {
			for _, v := range values {
				c := Case{Place: p.place, Option: p.name, Value: v, Want: want, CaddyfileOnly: caddyfileOnly}
				if p.place == Handler || p.place == Redis || p.place == Postgres || p.place == Memory {
					c.JSON = jsonValue(p.kind, v)
					if p.kind == kString || p.kind == kDuration {
						c.Value = strconv.Quote(v)
					}
					if p.kind == kFlag {
						c.Value = ""
					}
				}
				out = append(out, c)
			}
		}
		add(p.accept, Accepted, false)
		add(p.caddyfileAccept, Accepted, true)
		add(p.refuse, Refused, false)
		add(p.either, Either, false)
	}
	return append(out, Named()...)
}

// jsonValue writes v in JSON as an option of kind k.
func jsonValue(k kind, v string) string {
	switch k {
	case kInt:
		if _, err := strconv.ParseInt(v, 10, 64); err == nil {
			return v
		}
		if _, err := strconv.ParseUint(v, 10, 64); err == nil {
			return v // too large for the field: the decoder refuses it
		}
	case kBool:
		if v == "true" || v == "false" {
			return v
		}
	case kFlag:
		return "true"
	case kList:
		var q []string
		for _, f := range strings.Fields(v) {
			q = append(q, quote(f))
		}
		return "[" + strings.Join(q, ",") + "]"
	}
	return quote(v)
}

// Named are the cases issue 38 found ("Configuration nobody checks takes
// Caddy down"), and cases of settings together.
func Named() []Case {
	scope := func(v string, want Verdict, problem string) Case {
		return Case{Place: Handler, Option: "scope", Value: v, JSON: quote(v), Want: want, Problem: problem}
	}
	return []Case{
		// pgxpool's health check ticker panics on a period of zero, in a
		// goroutine of its own: caddy validate exits 2, a load kills Caddy.
		{Place: PostgresDSN, Option: "pool_health_check_period", Value: "0s", Want: Refused},
		// go-redis panics on a negative pool size; through the admin API
		// the panic left the usage pool's entry locked.
		{Place: RedisURL, Option: "pool_size", Value: "-5", Want: Refused},
		{Place: RedisURL, Option: "pool_size", Value: "2147483648", Want: Refused},
		// go-redis fills a semaphore of that many tokens: start-up hangs.
		{Place: Redis, Option: "pool_size", Value: "2147483647", JSON: "2147483647", Want: Refused},
		// A dial timeout of -1 turns into a deadline in the past: every
		// request 503s.
		{Place: RedisURL, Option: "dial_timeout", Value: "-1s", Want: Refused},
		// A misspelt header is a legal placeholder, empty at run time: the
		// scope's own problem, never key-invalid.
		scope("{http.request.header.Authorisation}", Accepted, "scope-empty"),
		scope("{nosuch.placeholder}", Refused, ""),
		scope("{http.request.host} {nosuch.placeholder}", Refused, ""),
		scope("{http.reqest.host}", Refused, ""),
		scope("{http.request.hots}", Refused, ""),
		scope("{http.request.header.Host}", Refused, ""),
		scope("{http.request.header.host} {http.request.header.Authorization}", Refused, ""),
		scope("{http.reverse_proxy.upstream.host}", Refused, ""),
		scope("{http.response.status}", Refused, ""),
		{Place: Handler, Option: "scope", Value: "{host}", JSON: quote("{host}"), Want: Refused, JSONOnly: true},
		{Place: Handler, Option: "scope", Value: "{host} {header.Authorization}", Want: Accepted, CaddyfileOnly: true},
		scope("{http.request.host} {http.request.header.Authorization}", Accepted, ""),
		scope("{http.request.host} {http.request.header.X-Tenant}", Accepted, ""),
		scope("{http.request.host} {http.vars.client_ip}", Accepted, ""),
		// No authentication handler in these configs: an unauthenticated
		// request has no identity, and its scope is blank.
		scope("{http.request.host} {http.auth.user.id}", Accepted, "scope-empty"),
		scope("{http.request.host} {http.request.remote.host}", Accepted, ""),
		scope("{http.request.host} {http.request.tls.client.fingerprint}", Accepted, ""),
		scope("{http.request.host} {http.request.cookie.session}", Accepted, ""),
		scope("{http.request.host} {http.request.uri.query.tenant}", Accepted, ""),
		scope("{http.request.host.labels.0} {http.request.uri.path.0}", Accepted, ""),
		scope("{http.request.host} {http.regexp.tenant.1}", Accepted, ""),
		scope("{http.request.host} {http.matchers.file.relative}", Accepted, ""),
		scope("{http.request.host} {env.HOME} {system.hostname}", Accepted, ""),
		scope("global", Accepted, ""),
		// Settings together.
		{Place: PostgresDSN, Option: "pool_min_conns", Value: "5", Extra: "pool_max_conns=2", Want: Refused},
		{Place: PostgresDSN, Option: "pool_min_idle_conns", Value: "5", Extra: "pool_max_conns=2", Want: Refused},
		{Place: PostgresDSN, Option: "pool_max_conns", Value: "2", Extra: "pool_min_conns=1&pool_min_idle_conns=1", Want: Accepted},
		{Place: RedisURL, Option: "min_idle_conns", Value: "5", Extra: "pool_size=2", Want: Refused},
		// pgx refuses every statement of a mode whose cache is off.
		{Place: PostgresDSN, Option: "statement_cache_capacity", Value: "0", Extra: "default_query_exec_mode=exec", Want: Accepted},
		{Place: PostgresDSN, Option: "description_cache_capacity", Value: "0", Extra: "default_query_exec_mode=cache_describe", Want: Refused},
		{Place: RedisURL, Option: "max_active_conns", Value: "2", Extra: "pool_size=4", Want: Accepted},
	}
}

// JSONValue writes value in JSON as the option of place it is given to (a
// string for an option the space does not know).
func JSONValue(place Place, option, value string) string {
	for _, p := range params() {
		if p.place == place && p.name == option {
			return jsonValue(p.kind, value)
		}
	}
	return quote(value)
}

// Seeds are fewer cases than Cases, for a fuzz target's seed corpus: the
// first accepted and the first refused value of each setting, and the
// named cases.
func Seeds() []Case {
	var out []Case
	seen := make(map[string]bool)
	for _, c := range Cases() {
		k := c.Place.String() + " " + c.Option + " " + c.Want.String()
		if c.Extra == "" && seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, c)
	}
	return out
}
