// Package configspace is the configuration space of the idempotency
// handler and its stores, as the configuration tests walk it: every option
// of the handler and of each storage block, and every parameter that
// go-redis reads from a Redis URL and pgx from a PostgreSQL DSN, each with
// values to be accepted (a config with one serves a keyed request), values
// to be refused (naming the option or parameter) and values whose fate
// depends on the servers at hand (sslmode=require against a server
// without TLS). The values are the boundaries: negative, zero, one, the
// module's bounds and one past them, 2^31-1 and above, malformed.
//
// It builds each point as a Caddyfile and as a JSON config, and checks the
// properties that hold whatever the verdict (Check): a refusal names what
// it refuses. The tests that walk it (inprocess.TestConfigSpace and
// FuzzConfigSpace in-process, e2e.TestConfigSpaceThroughCaddy through the
// caddy binary) add the properties of their own means: never a panic,
// never a hang, a server that keeps serving its old config after a
// refused load and stays stoppable.
package configspace

import (
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
)

// Place is where a setting goes.
type Place uint8

const (
	Handler     Place = iota // an option of the idempotency directive (memory store)
	Redis                    // an option of storage redis
	RedisURL                 // a query parameter of storage redis's url
	Postgres                 // an option of storage postgres
	PostgresDSN              // a parameter of storage postgres's dsn
	Memory                   // an option of storage memory
	NumPlaces
)

func (p Place) String() string {
	return [...]string{"handler", "redis", "redis url", "postgres", "postgres dsn", "memory"}[p]
}

// Verdict is what a point of the space must get.
type Verdict uint8

const (
	// Refused: every step refuses it (validate, run, a load), naming the
	// option or parameter.
	Refused Verdict = iota + 1
	// Accepted: every step accepts it, and a keyed request then gets a
	// 2xx (or the problem Case.Problem names).
	Accepted
	// Either: accepted or refused, depending on the servers at hand; a
	// refusal names it all the same, and nothing panics or hangs.
	Either
)

func (v Verdict) String() string {
	return [...]string{"?", "refused", "accepted", "either"}[v]
}

// Case is one point of the space: one setting on top of a config that is
// accepted without it.
type Case struct {
	Place  Place
	Option string // the option or parameter
	// Value is the setting's value as the Caddyfile writes it (for a
	// parameter: its value, unescaped; the URL or DSN escapes it).
	Value string
	// JSON is the option's value in a JSON config ("" for a parameter,
	// and for a case without a JSON form: see CaddyfileOnly).
	JSON string
	// Extra is more of the URL's or DSN's parameters, raw ("pool_max_conns=2").
	Extra string
	Want  Verdict
	// Problem is the problem type (its slug) a keyed request gets from an
	// accepted config; "" for a 2xx.
	Problem string
	// CaddyfileOnly: the case has no JSON form ({host}, a Caddyfile
	// shorthand, means nothing in JSON).
	CaddyfileOnly bool
	// JSONOnly: the case has no Caddyfile form ({host} in a Caddyfile is
	// its shorthand for {http.request.host}).
	JSONOnly bool
	// Names is what a refusal must name, when it is not Option.
	Names string
}

// Name names the case, for subtests.
func (c Case) Name() string {
	s := c.Place.String() + " " + c.Option + "=" + c.Value
	if c.Extra != "" {
		s += "&" + c.Extra
	}
	return s
}

// Env is where the stores of the configs are: a Redis URL (no query) and a
// PostgreSQL DSN in URL form, and the namespace of the test in each.
type Env struct {
	RedisURL    string // redis://host:port/db
	KeyPrefix   string
	PostgresDSN string // postgres://user@host:port/db?sslmode=disable
	Table       string
}

// Site is where a config listens and answers.
type Site struct {
	Admin string // the admin endpoint, host:port; "" for admin off
	Port  int
	Quiet bool // Caddy's log discarded (in-process runs)
}

// logging is the global option, and the JSON member, of a quiet site.
func (s Site) logging() (caddyfile, json string) {
	if !s.Quiet {
		return "", ""
	}
	return "\tlog {\n\t\toutput discard\n\t}\n", `"logging":{"logs":{"default":{"writer":{"output":"discard"}}}},`
}

// HandlerLines is the body of the idempotency block of c, one option a
// line.
func (c Case) HandlerLines(env Env) string {
	switch c.Place {
	case Handler:
		return c.Option + " " + c.Value
	case Memory:
		return "storage memory {\n\t\t\t" + c.Option + " " + c.Value + "\n\t\t}"
	case Redis, RedisURL:
		u := env.RedisURL
		if c.Place == RedisURL {
			u = withParams(u, c.Option, c.Value, c.Extra)
		}
		s := fmt.Sprintf("storage redis {\n\t\t\turl %s\n\t\t\tkey_prefix %s", strconv.Quote(u), env.KeyPrefix)
		if c.Place == Redis {
			s += "\n\t\t\t" + c.Option + " " + c.Value
		}
		return s + "\n\t\t}"
	default:
		dsn := env.PostgresDSN
		if c.Place == PostgresDSN {
			dsn = withParams(dsn, c.Option, c.Value, c.Extra)
		}
		s := fmt.Sprintf("storage postgres {\n\t\t\tdsn %s\n\t\t\ttable %s", strconv.Quote(dsn), env.Table)
		if c.Place == Postgres {
			s += "\n\t\t\t" + c.Option + " " + c.Value
		}
		return s + "\n\t\t}"
	}
}

// withParams sets name to value, and the parameters of extra, in the
// query of u (replacing those it has: sslmode).
func withParams(u, name, value, extra string) string {
	base, query, _ := strings.Cut(u, "?")
	q, _ := url.ParseQuery(query)
	q.Set(name, value)
	more, _ := url.ParseQuery(extra)
	for k, v := range more {
		q[k] = v
	}
	return base + "?" + q.Encode()
}

// Caddyfile is c as a whole Caddyfile at site.
func (c Case) Caddyfile(env Env, site Site) string {
	admin := "off"
	if site.Admin != "" {
		admin = site.Admin
	}
	log, _ := site.logging()
	return fmt.Sprintf("{\n\tadmin %s\n\tauto_https off\n\tpersist_config off\n%s}\n\nhttp://:%d {\n\tbind 127.0.0.1\n\tidempotency {\n\t\t%s\n\t}\n\trespond \"ok\"\n}\n",
		admin, log, site.Port, c.HandlerLines(env))
}

// HandlerJSON is c's idempotency handler as a JSON object; ok is false
// for a case without a JSON form.
func (c Case) HandlerJSON(env Env) (_ string, ok bool) {
	if c.CaddyfileOnly {
		return "", false
	}
	members := []string{`"handler":"idempotency"`}
	var storage []string
	switch c.Place {
	case Handler:
		members = append(members, strconv.Quote(c.Option)+":"+c.JSON)
	case Memory:
		storage = []string{`"backend":"memory"`, strconv.Quote(c.Option) + ":" + c.JSON}
	case Redis, RedisURL:
		u := env.RedisURL
		if c.Place == RedisURL {
			u = withParams(u, c.Option, c.Value, c.Extra)
		}
		storage = []string{`"backend":"redis"`, `"url":` + quote(u), `"key_prefix":` + quote(env.KeyPrefix)}
		if c.Place == Redis {
			storage = append(storage, strconv.Quote(c.Option)+":"+c.JSON)
		}
	default:
		dsn := env.PostgresDSN
		if c.Place == PostgresDSN {
			dsn = withParams(dsn, c.Option, c.Value, c.Extra)
		}
		storage = []string{`"backend":"postgres"`, `"dsn":` + quote(dsn), `"table":` + quote(env.Table)}
		if c.Place == Postgres {
			storage = append(storage, strconv.Quote(c.Option)+":"+c.JSON)
		}
	}
	if storage != nil {
		members = append(members, `"storage":{`+strings.Join(storage, ",")+`}`)
	}
	return "{" + strings.Join(members, ",") + "}", true
}

// JSONConfig is c as a whole JSON config at site; ok as for HandlerJSON.
func (c Case) JSONConfig(env Env, site Site) (_ string, ok bool) {
	h, ok := c.HandlerJSON(env)
	if !ok {
		return "", false
	}
	admin := `{"disabled":true,"config":{"persist":false}}`
	if site.Admin != "" {
		admin = `{"listen":` + quote(site.Admin) + `,"config":{"persist":false}}`
	}
	_, log := site.logging()
	return `{` + log + `"admin":` + admin + `,"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:` + strconv.Itoa(site.Port) + `"],` +
		`"automatic_https":{"disable":true},"routes":[{"handle":[` + h + `,{"handler":"static_response","body":"ok"}]}]}}}}}`, true
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// Check returns what is wrong with Caddy's refusal msg of c: it must
// name the option or parameter it refuses (as a word: pool_size, not
// pool_size_x). The holding option (url, dsn) does not count for a
// parameter: the refusal must say which parameter.
func Check(c Case, msg string) error {
	name := c.Names
	if name == "" {
		name = c.Option
	}
	if !NamesWord(msg, name) {
		return fmt.Errorf("the refusal of %s does not name %s: %s", c.Name(), name, msg)
	}
	return nil
}

// NamesWord reports whether msg holds name as a word of its own.
func NamesWord(msg, name string) bool {
	return regexp.MustCompile(`(^|[^A-Za-z0-9_])` + regexp.QuoteMeta(name) + `($|[^A-Za-z0-9_])`).MatchString(msg)
}

// Holder is the option that holds a parameter (url, dsn), "" for an
// option.
func (c Case) Holder() string {
	switch c.Place {
	case RedisURL:
		return "url"
	case PostgresDSN:
		return "dsn"
	}
	return ""
}
