package idempotency

import (
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("idempotency", parseCaddyfile)
	// After encode: stored bodies are never compressed, and encode
	// compresses each replay for the client that asked.
	httpcaddyfile.RegisterDirectiveOrder("idempotency", httpcaddyfile.After, "encode")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	if err := m.UnmarshalCaddyfile(h.Dispenser); err != nil {
		return nil, err
	}
	m.applyGlobalOptions(h.Option("idempotency"))
	return m, nil
}

// UnmarshalCaddyfile parses the idempotency directive:
//
//	idempotency [<matcher>] {
//	    storage <backend> [{ ... }]
//	    ttl <duration>
//	    lock_timeout <duration>
//	    methods <method...>
//	    header <name>
//	    required
//	    scope <template...>
//	    max_key_length <n>
//	    max_body_size <size>
//	    max_response_size <size>
//	    fingerprint {
//	        headers <name...>
//	        canonical_json true|false
//	    }
//	    release_on <status|class...>
//	    in_flight reject|wait [<timeout>]
//	    on_storage_error fail_closed|fail_open
//	    replay_header <name>|off
//	    docs_url <url>
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume the directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	return eachOption(d, "", nil, func(opt string) error {
		if err := h.parseOption(d, opt); err != nil {
			return err
		}
		// The rules live in check, run on what is parsed so far: an
		// invalid value is reported at its own line.
		if err := h.check(); err != nil {
			return d.Err(err.Error())
		}
		return nil
	})
}

// parseOption parses one option of the directive's block.
func (h *Handler) parseOption(d *caddyfile.Dispenser, opt string) error {
	var err error
	switch opt {
	case "storage":
		err = h.parseStorage(d)
	case "ttl":
		err = durationArg(d, &h.TTL)
	case "lock_timeout":
		err = durationArg(d, &h.LockTimeout)
	case "methods":
		h.Methods = d.RemainingArgs()
		if len(h.Methods) == 0 {
			return d.ArgErr()
		}
		for i, m := range h.Methods {
			h.Methods[i] = strings.ToUpper(m)
		}
	case "header":
		err = stringArg(d, &h.Header)
	case "required":
		if d.NextArg() {
			return d.ArgErr()
		}
		h.Required = true
	case "scope":
		args := d.RemainingArgs()
		if len(args) == 0 {
			return d.ArgErr()
		}
		if h.Scope = strings.Join(args, " "); h.Scope == "" {
			return d.Err("scope must not be empty; to share keys between all clients, use a constant such as 'global'")
		}
	case "max_key_length":
		h.MaxKeyLength, err = intArg(d)
	case "max_body_size":
		h.MaxBodySize, err = sizeArg(d)
	case "max_response_size":
		h.MaxResponseSize, err = sizeArg(d)
	case "fingerprint":
		err = h.parseFingerprint(d)
	case "release_on":
		h.ReleaseOn = d.RemainingArgs()
		if len(h.ReleaseOn) == 0 {
			return d.ArgErr()
		}
	case "in_flight":
		err = h.parseInFlight(d)
	case "on_storage_error":
		err = oneOfArg(d, &h.OnStorageError, failClosed, failOpen)
	case "replay_header":
		err = stringArg(d, &h.ReplayHeader)
	case "docs_url":
		err = stringArg(d, &h.DocsURL)
	default:
		return d.Errf("unrecognized idempotency option '%s'", opt)
	}
	return err
}

func (h *Handler) parseStorage(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	name := d.Val()
	if _, err := caddy.GetModule(storageNamespace + "." + name); err != nil {
		var known []string
		for _, m := range caddy.GetModules(storageNamespace) {
			known = append(known, m.ID.Name())
		}
		return d.Errf("unknown storage backend '%s' (available: %s)", name, strings.Join(known, ", "))
	}
	unm, err := caddyfile.UnmarshalModule(d, storageNamespace+"."+name)
	if err != nil {
		return err
	}
	h.StorageRaw = caddyconfig.JSONModuleObject(unm, "backend", name, nil)
	return nil
}

func (h *Handler) parseFingerprint(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	h.Fingerprint = new(FingerprintConfig)
	return eachOption(d, "fingerprint ", nil, func(opt string) error {
		switch opt {
		case "headers":
			h.Fingerprint.Headers = d.RemainingArgs()
			if len(h.Fingerprint.Headers) == 0 {
				return d.ArgErr()
			}
		case "canonical_json":
			var v string
			if err := oneOfArg(d, &v, "true", "false"); err != nil {
				return err
			}
			b := v == "true"
			h.Fingerprint.CanonicalJSON = &b
		default:
			return d.Errf("unrecognized fingerprint option '%s'", opt)
		}
		return nil
	})
}

func (h *Handler) parseInFlight(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	switch h.InFlight = d.Val(); h.InFlight {
	case inFlightReject:
	case inFlightWait:
		if d.NextArg() {
			// Parsed here rather than with durationArg, which would name
			// the option after the current token ("wait").
			s := d.Val()
			dur, err := caddy.ParseDuration(s)
			if err != nil {
				return d.Errf("in_flight wait: invalid duration '%s': %v", s, err)
			}
			if dur <= 0 {
				return d.Errf("in_flight wait timeout must be positive, got '%s'", s)
			}
			h.WaitTimeout = caddy.Duration(dur)
		}
	default:
		return d.Errf("in_flight must be %s or %s, got '%s'", inFlightReject, inFlightWait, h.InFlight)
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// eachOption calls parse for each option of the block after the current
// token, and rejects an option given twice (what names the block in that
// error, e.g. "redis storage "). seen may hold options already given on
// the line before the block.
func eachOption(d *caddyfile.Dispenser, what string, seen map[string]bool, parse func(opt string) error) error {
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
	}
	return nil
}

// stringArg reads exactly one argument.
func stringArg(d *caddyfile.Dispenser, dst *string) error {
	opt := d.Val()
	if !d.NextArg() {
		return d.ArgErr()
	}
	if d.Val() == "" {
		return d.Errf("%s must not be empty", opt)
	}
	*dst = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// oneOfArg reads exactly one argument, which must be one of allowed.
func oneOfArg(d *caddyfile.Dispenser, dst *string, allowed ...string) error {
	opt := d.Val()
	if err := stringArg(d, dst); err != nil {
		return err
	}
	for _, a := range allowed {
		if *dst == a {
			return nil
		}
	}
	return d.Errf("%s must be one of %s, got '%s'", opt, strings.Join(allowed, ", "), *dst)
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
func intArg(d *caddyfile.Dispenser) (int, error) {
	opt := d.Val()
	var s string
	if err := stringArg(d, &s); err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, d.Errf("%s must be a positive integer, got '%s'", opt, s)
	}
	return n, nil
}

// sizeArg reads one positive size ("1MiB", "512KB", "1048576").
func sizeArg(d *caddyfile.Dispenser) (int64, error) {
	opt := d.Val()
	var s string
	if err := stringArg(d, &s); err != nil {
		return 0, err
	}
	n, err := humanize.ParseBytes(s)
	if err != nil || n == 0 || n > 1<<40 {
		return 0, d.Errf("%s must be a positive size such as 1MiB, got '%s'", opt, s)
	}
	return int64(n), nil
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Handler)(nil)
