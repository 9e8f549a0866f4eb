// Package cfargs reads the arguments of Caddyfile options for the
// idempotency handler and its built-in storage backends.
package cfargs

import (
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/dustin/go-humanize"

	"github.com/caddy-idempotency/caddy-idempotency/storage/opterr"
)

// The Caddyfile parsers keep to syntax: each reads its block with
// EachOption and the argument helpers below, and leaves the rules on
// values to its config type's compile, which EachOption runs once the
// block is read. A compile error names the options it is about (an
// *opterr.Error), and EachOption reports it at the line of that option:
// an invalid value at its own line, a rule between options (url and
// addresses) at the line of the last of them.

// Given are the options of a block read so far, each with the token it
// ends on (its last argument, or the closing brace of its own block),
// where an error about it is reported.
type Given map[string]mark

type mark struct {
	at    caddyfile.Token
	order int
	set   bool // by another option (see Sets)
}

// Add records opt as given, ending at d's current token: for an option
// given on the block's first line (storage redis <url> { ... }).
func (g Given) Add(d *caddyfile.Dispenser, opt string) {
	g[opt] = mark{at: d.Token(), order: len(g)}
}

// Sets records that the option being read sets opt's field too (in_flight
// wait <timeout> sets wait_timeout), so that an error about opt is
// reported at d's current token. opt may still come on a line of its own:
// what that means is the parser's to say.
func (g Given) Sets(d *caddyfile.Dispenser, opt string) {
	g[opt] = mark{at: d.Token(), order: len(g), set: true}
}

// EachOption calls parse for each option of the block after the current
// token, and rejects an option given twice: what names the block in that
// error (e.g. "redis storage "), and given (nil: none) holds the options
// the block's first line gave. Then it calls check (nil: none) once, and
// reports its error at the line of the last of the error's options the
// block gives; an error that names none of them, at the end of the block.
func EachOption(d *caddyfile.Dispenser, what string, given Given, parse func(opt string) error, check func() error) error {
	if given == nil {
		given = make(Given)
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if m, ok := given[opt]; ok && !m.set {
			return d.Errf("%s%s already specified", what, opt)
		}
		if err := parse(opt); err != nil {
			return err
		}
		given.Add(d, opt)
	}
	if check == nil {
		return nil
	}
	err := check()
	if err == nil {
		return nil
	}
	opts := opterr.Options(err)
	if len(opts) == 0 {
		return d.WrapErr(err)
	}
	last, ok := given.last(opts)
	switch {
	case !ok && opterr.IsMissing(err):
		// A required option the block leaves out (the dsn of
		// postgres): such a block has always adapted, and Provision
		// refuses it. A compile checks required options after the
		// values, so this error hides none about a line of the block.
		return nil
	case !ok:
		return d.WrapErr(err)
	}
	at := caddyfile.NewDispenser([]caddyfile.Token{last})
	at.Next()
	return at.WrapErr(err)
}

// last returns the token of the option of opts given last.
func (g Given) last(opts []string) (caddyfile.Token, bool) {
	found := mark{order: -1}
	for _, opt := range opts {
		if o, ok := g[opt]; ok && o.order > found.order {
			found = o
		}
	}
	return found.at, found.order >= 0
}

// NoArgs fails when the current line has arguments left.
func NoArgs(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// StringArg reads exactly one non-empty argument.
func StringArg(d *caddyfile.Dispenser, dst *string) error {
	opt := d.Val()
	if !d.NextArg() {
		return d.ArgErr()
	}
	if d.Val() == "" {
		return d.Errf("%s must not be empty", opt)
	}
	*dst = d.Val()
	return NoArgs(d)
}

// ArgsList reads one or more arguments.
func ArgsList(d *caddyfile.Dispenser, dst *[]string) error {
	if *dst = d.RemainingArgs(); len(*dst) == 0 {
		return d.ArgErr()
	}
	return nil
}

// OneOfArg reads exactly one argument, which must be one of allowed.
func OneOfArg(d *caddyfile.Dispenser, dst *string, allowed ...string) error {
	if err := OneOfArgs(d, dst, allowed...); err != nil {
		return err
	}
	return NoArgs(d)
}

// OneOfArgs reads an argument that must be one of allowed, and leaves
// the line's other arguments to the caller.
func OneOfArgs(d *caddyfile.Dispenser, dst *string, allowed ...string) error {
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
	return d.Errf("%s must be one of %s, got '%s'%s", opt, strings.Join(allowed, ", "), *dst, DidYouMean(*dst, allowed))
}

// BoolArg reads exactly one argument, true or false.
func BoolArg(d *caddyfile.Dispenser, dst **bool) error {
	var v string
	if err := OneOfArg(d, &v, "true", "false"); err != nil {
		return err
	}
	b := v == "true"
	*dst = &b
	return nil
}

// DurationArg reads one positive Caddy duration ("30s", "1d").
func DurationArg(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	opt := d.Val()
	var s string
	if err := StringArg(d, &s); err != nil {
		return err
	}
	dur, err := ParseDuration(opt, s)
	if err != nil {
		return d.Err(err.Error())
	}
	if dur <= 0 {
		return d.Errf("%s must be positive, got '%s'", opt, s)
	}
	*dst = caddy.Duration(dur)
	return nil
}

// IntArg reads one positive integer.
func IntArg(d *caddyfile.Dispenser, dst *int) error {
	return ParsedArg(d, dst, "a positive integer", func(s string) (int, bool) {
		n, err := strconv.Atoi(s)
		return n, err == nil && n > 0
	})
}

// SizeArg reads one positive size ("1MiB", "512KB", "1048576").
func SizeArg(d *caddyfile.Dispenser, dst *int64) error {
	return ParsedArg(d, dst, "a positive size such as 1MiB", func(s string) (int64, bool) {
		n, err := humanize.ParseBytes(s)
		return int64(n), err == nil && n > 0 && n <= 1<<40
	})
}

// ParsedArg reads exactly one argument that parse accepts; what names
// the accepted values in the error.
func ParsedArg[T any](d *caddyfile.Dispenser, dst *T, what string, parse func(string) (T, bool)) error {
	opt := d.Val()
	var s string
	if err := StringArg(d, &s); err != nil {
		return err
	}
	v, ok := parse(s)
	if !ok {
		return d.Errf("%s must be %s, got '%s'", opt, what, s)
	}
	*dst = v
	return nil
}
