package idempotency

import (
	"encoding/json"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/backend/cfargs"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("idempotency", parseGlobalOption)
}

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
// strict sets every directive's strict: a config in which one can never
// run is refused (see placement.go).
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
			raw, err := parseStorage(d)
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
