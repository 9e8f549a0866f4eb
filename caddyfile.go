package idempotency

import (
	"encoding/json"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
	"github.com/caddy-idempotency/caddy-idempotency/backend/cfargs"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("idempotency", parseCaddyfile)
	// After encode: stored bodies are never compressed, and encode
	// compresses each replay for the client that asked.
	httpcaddyfile.RegisterDirectiveOrder("idempotency", httpcaddyfile.After, "encode")
	httpcaddyfile.RegisterGlobalOption("idempotency", parseGlobalOption)
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
//	        ignore <JSON Pointer...>
//	    }
//	    release_on <status|class...>
//	    in_flight reject|wait [<timeout>]
//	    wait_timeout <duration>
//	    on_storage_error fail_closed|fail_open
//	    on_unknown_outcome keep|release
//	    replay_header <name>|off
//	    docs_url <url>
//	    mode enforce|observe
//	    key_json <JSON Pointer>
//	    errors problem|handle_errors
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume the directive name
	if err := cfargs.NoArgs(d); err != nil {
		return err
	}
	given := make(cfargs.Given)
	return cfargs.EachOption(d, "", given, func(opt string) error { return h.parseOption(d, given, opt) }, backend.Check(h.compile))
}

// parseOption parses one option of the directive's block.
func (h *Handler) parseOption(d *caddyfile.Dispenser, given cfargs.Given, opt string) error {
	switch opt {
	case "storage":
		raw, err := backend.ParseCaddyfile(d)
		h.StorageRaw = raw
		return err
	case "ttl":
		return cfargs.DurationArg(d, &h.TTL)
	case "lock_timeout":
		return cfargs.DurationArg(d, &h.LockTimeout)
	case "methods":
		if err := cfargs.ArgsList(d, &h.Methods); err != nil {
			return err
		}
		for i, m := range h.Methods {
			h.Methods[i] = strings.ToUpper(m)
		}
		return nil
	case "header":
		return cfargs.StringArg(d, &h.Header)
	case "required":
		h.Required = true
		return cfargs.NoArgs(d)
	case "scope":
		var args []string
		if err := cfargs.ArgsList(d, &args); err != nil {
			return err
		}
		if h.Scope = strings.Join(args, " "); h.Scope == "" {
			return d.Err("scope must not be empty; to share keys between all clients, use a constant such as 'global'")
		}
		return nil
	case "max_key_length":
		return cfargs.IntArg(d, &h.MaxKeyLength)
	case "max_body_size":
		return cfargs.SizeArg(d, &h.MaxBodySize)
	case "max_response_size":
		return cfargs.SizeArg(d, &h.MaxResponseSize)
	case "fingerprint":
		return h.parseFingerprint(d)
	case "release_on":
		return cfargs.ArgsList(d, &h.ReleaseOn)
	case "in_flight":
		return h.parseInFlight(d, given)
	case "wait_timeout":
		if h.WaitTimeout != 0 {
			return d.Err("wait_timeout is already given by in_flight wait <timeout>")
		}
		return cfargs.DurationArg(d, &h.WaitTimeout)
	case "mode":
		return cfargs.OneOfArg(d, &h.Mode, modeEnforce, modeObserve)
	case "errors":
		return cfargs.OneOfArg(d, &h.Errors, errorsProblem, errorsHandleErrors)
	case "key_json":
		return cfargs.StringArg(d, &h.KeyJSON)
	case "on_storage_error":
		return cfargs.OneOfArg(d, &h.OnStorageError, failClosed, failOpen)
	case "on_unknown_outcome":
		return cfargs.OneOfArg(d, &h.OnUnknownOutcome, unknownOutcomeKeep, unknownOutcomeRelease)
	case "replay_header":
		return cfargs.StringArg(d, &h.ReplayHeader)
	case "docs_url":
		return cfargs.StringArg(d, &h.DocsURL)
	}
	return cfargs.Unknown(d, "idempotency", opt, handlerOptions)
}

// handlerOptions are the options parseOption knows, for the suggestion of
// an unknown option's error (TestCaddyfileOptionListsMatchTheParsers
// checks them against the parser).
var handlerOptions = []string{
	"storage", "ttl", "lock_timeout", "methods", "header", "required", "scope", "max_key_length",
	"max_body_size", "max_response_size", "fingerprint", "release_on", "in_flight", "wait_timeout",
	"mode", "errors", "key_json", "on_storage_error", "on_unknown_outcome", "replay_header", "docs_url",
}

// fingerprintOptions are the options of the fingerprint block.
var fingerprintOptions = []string{"headers", "canonical_json", "ignore"}

func (h *Handler) parseFingerprint(d *caddyfile.Dispenser) error {
	if err := cfargs.NoArgs(d); err != nil {
		return err
	}
	h.Fingerprint = new(FingerprintConfig)
	return cfargs.EachOption(d, "fingerprint ", nil, func(opt string) error {
		switch opt {
		case "headers":
			return cfargs.ArgsList(d, &h.Fingerprint.Headers)
		case "canonical_json":
			return cfargs.BoolArg(d, &h.Fingerprint.CanonicalJSON)
		case "ignore":
			return cfargs.ArgsList(d, &h.Fingerprint.Ignore)
		}
		return cfargs.Unknown(d, "fingerprint", opt, fingerprintOptions)
	}, nil)
}

func (h *Handler) parseInFlight(d *caddyfile.Dispenser, given cfargs.Given) error {
	if err := cfargs.OneOfArgs(d, &h.InFlight, inFlightReject, inFlightWait); err != nil {
		return err
	}
	if h.InFlight == inFlightWait && d.NextArg() {
		if h.WaitTimeout != 0 {
			return d.Err("the wait timeout is already given by wait_timeout")
		}
		// Parsed here rather than with cfargs.DurationArg, which would name the
		// option after the current token ("wait").
		s := d.Val()
		dur, err := cfargs.ParseDuration("in_flight wait", s)
		if err != nil {
			return d.Err(err.Error())
		}
		if dur <= 0 {
			return d.Errf("in_flight wait timeout must be positive, got '%s'", s)
		}
		h.WaitTimeout = caddy.Duration(dur)
		given.Sets(d, "wait_timeout")
	}
	return cfargs.NoArgs(d)
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Handler)(nil)

// globalOptions are the Caddyfile's global `idempotency` block: defaults
// for every idempotency directive of the Caddyfile, so that ten routes on
// Redis configure Redis once.
//
//	{
//	    idempotency {
//	        storage redis {
//	            url {env.REDIS_URL}
//	        }
//	        strict
//	    }
//	}
//
// strict sets every directive's strict: a config in which some requests
// skip one is refused (see package placement).
type globalOptions struct {
	StorageRaw json.RawMessage
	Strict     bool
}

// globalOptionNames are the options of the global block.
var globalOptionNames = []string{"storage", "strict"}

func parseGlobalOption(d *caddyfile.Dispenser, existing any) (any, error) {
	if existing != nil {
		return nil, d.Err("the idempotency global option is already specified")
	}
	d.Next() // consume the option name
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	opts := new(globalOptions)
	err := cfargs.EachOption(d, "", nil, func(opt string) error {
		switch opt {
		case "storage":
			raw, err := backend.ParseCaddyfile(d)
			opts.StorageRaw = raw
			return err
		case "strict":
			opts.Strict = true
			return cfargs.NoArgs(d)
		}
		return d.Errf("unrecognized idempotency global option '%s'%s; only storage and strict can be set globally", opt, cfargs.DidYouMean(opt, globalOptionNames))
	}, nil)
	return opts, err
}

// applyGlobalOptions fills in what a directive left to the global block.
func (h *Handler) applyGlobalOptions(opts any) {
	g, ok := opts.(*globalOptions)
	if !ok || g == nil {
		return
	}
	if h.StorageRaw == nil {
		h.StorageRaw = g.StorageRaw
	}
	h.Strict = h.Strict || g.Strict
}
