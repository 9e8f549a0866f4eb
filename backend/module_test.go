package backend_test

import (
	"encoding/json"
	"errors"
	"io/fs"
	"slices"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
	"github.com/caddy-idempotency/caddy-idempotency/backend/backendtest"
	"github.com/caddy-idempotency/caddy-idempotency/storage/opterr"
)

// TestNameErrorsSayWhichBackend: a backend's errors start with its name,
// wrap as fmt.Errorf does, and those about an option name it (for the
// Caddyfile's line), the message unchanged.
func TestNameErrorsSayWhichBackend(t *testing.T) {
	const name backend.Name = "mine"

	err := name.Errorf("opening: %w", fs.ErrNotExist)
	if got, want := err.Error(), "mine storage: opening: file does not exist"; got != want {
		t.Errorf("Errorf = %q, want %q", got, want)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Error("Errorf does not wrap its %w operand")
	}
	if opterr.Options(err) != nil {
		t.Errorf("Errorf names options %q", opterr.Options(err))
	}

	err = name.OptionErrorf("size", "size must be positive, got %d: %w", -1, fs.ErrInvalid)
	if got, want := err.Error(), "mine storage: size must be positive, got -1: invalid argument"; got != want {
		t.Errorf("OptionErrorf = %q, want %q", got, want)
	}
	if got := opterr.Options(err); !slices.Equal(got, []string{"size"}) {
		t.Errorf("OptionErrorf names options %q, want [size]", got)
	}
	if !errors.Is(err, fs.ErrInvalid) {
		t.Error("OptionErrorf does not wrap its %w operand")
	}
}

// TestReplayCacheCheckNamesItsOption: the replay cache's errors say which
// backend's they are and name the replay_cache option.
func TestReplayCacheCheckNamesItsOption(t *testing.T) {
	const name backend.Name = "mine"
	if err := (*backend.ReplayCache)(nil).Check(name); err != nil {
		t.Errorf("no cache: %v", err)
	}
	if err := (&backend.ReplayCache{MaxEntries: 10, TTL: caddy.Duration(time.Minute)}).Check(name); err != nil {
		t.Errorf("a valid cache: %v", err)
	}
	err := (&backend.ReplayCache{MaxEntries: 10, TTL: 10}).Check(name)
	if err == nil || err.Error() != "mine storage: replay_cache: ttl must be at least 1s, got 10ns" {
		t.Errorf("ttl of 10ns: %v", err)
	}
	if got := opterr.Options(err); !slices.Equal(got, []string{"replay_cache"}) {
		t.Errorf("names options %q, want [replay_cache]", got)
	}
}

// TestReplayCacheCaddyfile: replay_cache in a backend's block, parsed by
// ParseReplayCache and checked by Check as the redis and postgres blocks
// do (their tests keep a case each), every error at the option's line.
func TestReplayCacheCaddyfile(t *testing.T) {
	const name backend.Name = "mine"
	// parse reads `mine { replay_cache ... }`, the option on line 2.
	parse := func(option string) (*backend.ReplayCache, error) {
		d := caddyfile.NewTestDispenser("mine {\n\t" + option + "\n}")
		d.Next() // the backend's name
		var rc *backend.ReplayCache
		err := backend.UnmarshalBlock(d, name, nil, func(opt string) error {
			if opt != "replay_cache" {
				return name.Unknown(d, opt, []string{"replay_cache"})
			}
			var err error
			rc, err = backend.ParseReplayCache(d)
			return err
		}, func() (*backend.ReplayCache, error) { return rc, rc.Check(name) })
		return rc, err
	}
	for in, want := range map[string]string{
		"replay_cache 5000":     `{"max_entries":5000}`,
		"replay_cache 5000 30s": `{"max_entries":5000,"ttl":30000000000}`,
	} {
		rc, err := parse(in)
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if got, _ := json.Marshal(rc); string(got) != want {
			t.Errorf("%s: JSON %s, want %s", in, got, want)
		}
	}
	for bad, msg := range map[string]string{
		"replay_cache":         "wrong argument count",
		"replay_cache 0":       "mine storage: replay_cache: max_entries must be positive, got 0",
		"replay_cache x":       "replay_cache: max_entries must be an integer, got 'x'",
		"replay_cache 10 -1s":  "mine storage: replay_cache: ttl must be at least 1s, got -1s",
		"replay_cache 10 1s 2": "wrong argument count",
	} {
		t.Run(bad, func(t *testing.T) {
			_, err := parse(bad)
			backendtest.WantParseError(t, err, 2, msg)
		})
	}
}
