package inprocess_test

import (
	"encoding/json"
	"fmt"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/configspace"
)

// The configuration space in-process (issue 38): every case of
// configspace through the Caddyfile adapter and caddy.Validate, which
// provisions and cleans up as `caddy validate` does, twice each (as an
// operator re-running a reload would), in its Caddyfile and its JSON form.
// Never a panic, never a hang; each verdict as the space says; a refusal
// names its option or parameter. The stores are at closed ports: the
// verdict is the configuration's, and a store that cannot be reached
// must not change it (e2e.TestConfigSpaceThroughCaddy serves each one on
// real servers).

// spaceEnv points the stores at ports where nothing listens.
func spaceEnv(prefix string) configspace.Env {
	return configspace.Env{
		RedisURL:    "redis://127.0.0.1:1/0",
		KeyPrefix:   prefix + ":",
		PostgresDSN: "postgres://postgres@127.0.0.1:1/test?sslmode=disable",
		Table:       prefix,
	}
}

// stepBound is how long one adapt or validate may take: the start-up ping
// of a store is bounded by 5s, and the pool of a closed port refuses at
// once.
const stepBound = 30 * time.Second

func TestConfigSpace(t *testing.T) {
	env := spaceEnv("config_space")
	for _, c := range configspace.Cases() {
		t.Run(c.Name(), func(t *testing.T) {
			for i := range 2 {
				checkSpaceCase(t, env, c, i == 1)
			}
		})
	}
}

// checkSpaceCase runs c through the adapter and caddy.Validate in its
// Caddyfile and JSON forms, checking the verdict unless loose (a fuzz
// input, whose verdict nobody wrote down).
func checkSpaceCase(t testing.TB, env configspace.Env, c configspace.Case, loose bool) {
	t.Helper()
	checkSpaceForms(t, env, c, loose, true, true)
}

// checkSpaceForms is checkSpaceCase of the Caddyfile form, the JSON form
// or both.
func checkSpaceForms(t testing.TB, env configspace.Env, c configspace.Case, loose, caddyfile, asJSON bool) {
	t.Helper()
	site := configspace.Site{Port: 1, Quiet: true} // never listens: validate binds nothing
	var adapted []byte
	var err error
	verdict := func(form string, err error) {
		t.Helper()
		switch {
		case err != nil && (c.Want == configspace.Accepted && !loose):
			t.Fatalf("%s (%s) refused, want it accepted: %v", c.Name(), form, err)
		case err == nil && c.Want == configspace.Refused && !loose:
			t.Fatalf("%s (%s) accepted, want it refused naming %s", c.Name(), form, c.Option)
		case err != nil && loose && c.Holder() != "" && configspace.NamesWord(err.Error(), c.Holder()):
			// A fuzzed value may break the whole URL or DSN (a NUL, a
			// '#'): the refusal names the option that holds it, and
			// quotes nothing of it (it may hold a password).
		case err != nil:
			if cerr := configspace.Check(c, err.Error()); cerr != nil {
				t.Fatalf("%s: %v", form, cerr)
			}
		}
	}
	if c.JSONOnly || !caddyfile {
		goto json
	}
	adapted, err = bounded(t, "adapting "+c.Name(), func() ([]byte, error) {
		cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(c.Caddyfile(env, site)), map[string]any{"filename": "Caddyfile"})
		return cfg, err
	})
	if err != nil {
		verdict("caddyfile adapt", err)
	} else {
		_, err = bounded(t, "validating the adapted "+c.Name(), func() ([]byte, error) { return nil, validate(adapted) })
		verdict("caddyfile", err)
	}
json:
	if js, ok := c.JSONConfig(env, site); ok && asJSON {
		_, err = bounded(t, "validating the JSON of "+c.Name(), func() ([]byte, error) { return nil, validate([]byte(js)) })
		verdict("json", err)
	}
}

// validate decodes cfg as Caddy does (unknown fields are errors) and
// provisions it, as caddy validate does.
func validate(cfg []byte) error {
	var c caddy.Config
	if err := caddy.StrictUnmarshalJSON(cfg, &c); err != nil {
		return err
	}
	return caddy.Validate(&c)
}

// bounded runs f, failing t when it panics or does not return within
// stepBound.
func bounded(t testing.TB, what string, f func() ([]byte, error)) ([]byte, error) {
	t.Helper()
	type result struct {
		b     []byte
		err   error
		panic string
	}
	done := make(chan result, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- result{panic: fmt.Sprintf("%v\n%s", r, debug.Stack())}
			}
		}()
		b, err := f()
		done <- result{b: b, err: err}
	}()
	select {
	case r := <-done:
		if r.panic != "" {
			t.Fatalf("%s panicked: %s", what, r.panic)
		}
		return r.b, r.err
	case <-time.After(stepBound):
		t.Fatalf("%s did not answer within %v", what, stepBound)
	}
	return nil, nil
}

// FuzzConfigSpace draws a setting anywhere in the space (any option or
// parameter name, any value) and runs it as TestConfigSpace does, without
// a verdict: never a panic or a hang, and a refusal names the setting.
// `make fuzz-short` runs it by execution count; its seeds are a value of
// each verdict of every setting of the space (configspace.Seeds) in both
// forms, and testdata/fuzz/FuzzConfigSpace keeps the inputs issue 38
// found.
func FuzzConfigSpace(f *testing.F) {
	for _, c := range configspace.Seeds() {
		f.Add(uint8(c.Place), c.Option, strings.Trim(c.Value, `"`))
		f.Add(uint8(c.Place)|128, c.Option, strings.Trim(c.Value, `"`))
	}
	env := spaceEnv("config_fuzz")
	f.Fuzz(func(t *testing.T, place uint8, option, value string) {
		c, ok := fuzzCase(configspace.Place(place%uint8(configspace.NumPlaces)), option, value)
		if !ok {
			t.Skip()
		}
		// One form an input (its place's high bit says which), so that
		// an input whose store's start-up ping retries for its whole
		// timeout stays well within the fuzzer's ten seconds.
		asJSON := place >= 128
		checkSpaceForms(t, env, c, true, !asJSON, asJSON)
	})
}

// settingName is what the fuzz target takes as an option or parameter
// name: a word, as every setting is spelt.
var settingName = regexp.MustCompile(`^[a-z][a-z_]{0,40}$`)

// secretParams hold secrets: their refusals say nothing of them, by
// design. hostParams name where to connect: a refusal of their value
// names the URL or DSN's host or port.
var skippedParams = map[string]bool{
	"password": true, "sslpassword": true, "user": true, "host": true, "port": true, "database": true,
	"dbname": true, "passfile": true, "service": true, "servicefile": true,
	"sslkey": true, "sslcert": true, "sslrootcert": true,
	"storage": true, "fingerprint": true,
}

// fuzzCase makes the case the fuzz target runs: option as the setting's
// name, value as its value (quoted in the Caddyfile); ok is false for an
// input outside the space (a name that is no word, a value the
// Caddyfile cannot quote, or one with "{$": the Caddyfile's environment
// variables are replaced before it is read, quotes or not, so "{$" up to
// the next "}" of the file is no value of the option's).
func fuzzCase(place configspace.Place, option, value string) (configspace.Case, bool) {
	if !settingName.MatchString(option) || skippedParams[option] || strings.ContainsAny(value, "\"\\\r\n") ||
		strings.Contains(value, "{$") || len(value) > 200 {
		return configspace.Case{}, false
	}
	c := configspace.Case{Place: place, Option: option, Value: value, Want: configspace.Either}
	switch place {
	case configspace.Handler, configspace.Redis, configspace.Postgres, configspace.Memory:
		c.Value = `"` + value + `"`
		c.JSON = configspace.JSONValue(place, option, value)
		if option == "required" || option == "scope" && value == "" {
			return configspace.Case{}, false
		}
	}
	if !json.Valid([]byte(c.JSON)) && c.JSON != "" {
		return configspace.Case{}, false
	}
	return c, true
}

// The fuzz target's space leaves out what the Caddyfile reads before any
// option sees it (a fuzz run found "{$" taken for an environment
// variable up to the site block's "}"), and keeps every other value.
func TestFuzzCaseSpace(t *testing.T) {
	for value, want := range map[string]bool{
		"\xa3\xa7\xeb{$": false, "{$HOME}": false, `a"b`: false, "a\nb": false,
		"{": true, "{http.request.host}": true, "$": true, "1s": true,
	} {
		if _, ok := fuzzCase(configspace.Handler, "ttl", value); ok != want {
			t.Errorf("fuzzCase(ttl, %q) in the space = %v, want %v", value, ok, want)
		}
	}
}
