package idempotency

import (
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/dustin/go-humanize"
)

// The Caddyfile parsers of this package keep to syntax: each reads its
// block with eachOption and the argument helpers below, and leaves the
// rules on values to the config type's check, which eachOption runs after
// every option so that an invalid value is reported at its own line.

// eachOption calls parse for each option of the block after the current
// token, then check on what is parsed so far (nil: none). It rejects an
// option given twice; what names the block in that error (e.g. "redis
// storage "), and seen may hold options already given on the line before
// the block.
func eachOption(d *caddyfile.Dispenser, what string, seen map[string]bool, parse func(opt string) error, check func() error) error {
	if seen == nil {
		seen = make(map[string]bool)
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if seen[opt] {
			return d.Errf("%s%s already specified", what, opt)
		}
		seen[opt] = true
		if err := parse(opt); err != nil {
			return err
		}
		if check == nil {
			continue
		}
		if err := check(); err != nil {
			return d.Err(err.Error())
		}
	}
	return nil
}

// noArgs fails when the current line has arguments left.
func noArgs(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// stringArg reads exactly one non-empty argument.
func stringArg(d *caddyfile.Dispenser, dst *string) error {
	opt := d.Val()
	if !d.NextArg() {
		return d.ArgErr()
	}
	if d.Val() == "" {
		return d.Errf("%s must not be empty", opt)
	}
	*dst = d.Val()
	return noArgs(d)
}

// argsList reads one or more arguments.
func argsList(d *caddyfile.Dispenser, dst *[]string) error {
	if *dst = d.RemainingArgs(); len(*dst) == 0 {
		return d.ArgErr()
	}
	return nil
}

// oneOfArg reads exactly one argument, which must be one of allowed.
func oneOfArg(d *caddyfile.Dispenser, dst *string, allowed ...string) error {
	if err := oneOfArgs(d, dst, allowed...); err != nil {
		return err
	}
	return noArgs(d)
}

// oneOfArgs reads an argument that must be one of allowed, and leaves
// the line's other arguments to the caller.
func oneOfArgs(d *caddyfile.Dispenser, dst *string, allowed ...string) error {
	opt := d.Val()
	if !d.NextArg() {
		return d.ArgErr()
	}
	*dst = d.Val()
	for _, a := range allowed {
		if *dst == a {
			return nil
		}
	}
	return d.Errf("%s must be one of %s, got '%s'", opt, strings.Join(allowed, ", "), *dst)
}

// boolArg reads exactly one argument, true or false.
func boolArg(d *caddyfile.Dispenser, dst **bool) error {
	var v string
	if err := oneOfArg(d, &v, "true", "false"); err != nil {
		return err
	}
	b := v == "true"
	*dst = &b
	return nil
}

// durationArg reads one positive Caddy duration ("30s", "1d").
func durationArg(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	opt := d.Val()
	var s string
	if err := stringArg(d, &s); err != nil {
		return err
	}
	dur, err := caddy.ParseDuration(s)
	if err != nil {
		return d.Errf("%s: invalid duration '%s': %v", opt, s, err)
	}
	if dur <= 0 {
		return d.Errf("%s must be positive, got '%s'", opt, s)
	}
	*dst = caddy.Duration(dur)
	return nil
}

// intArg reads one positive integer.
func intArg(d *caddyfile.Dispenser, dst *int) error {
	return parsedArg(d, dst, "a positive integer", func(s string) (int, bool) {
		n, err := strconv.Atoi(s)
		return n, err == nil && n > 0
	})
}

// sizeArg reads one positive size ("1MiB", "512KB", "1048576").
func sizeArg(d *caddyfile.Dispenser, dst *int64) error {
	return parsedArg(d, dst, "a positive size such as 1MiB", func(s string) (int64, bool) {
		n, err := humanize.ParseBytes(s)
		return int64(n), err == nil && n > 0 && n <= 1<<40
	})
}

// parsedArg reads exactly one argument that parse accepts; what names
// the accepted values in the error.
func parsedArg[T any](d *caddyfile.Dispenser, dst *T, what string, parse func(string) (T, bool)) error {
	opt := d.Val()
	var s string
	if err := stringArg(d, &s); err != nil {
		return err
	}
	v, ok := parse(s)
	if !ok {
		return d.Errf("%s must be %s, got '%s'", opt, what, s)
	}
	*dst = v
	return nil
}
