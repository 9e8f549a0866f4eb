package idempotency

import (
	"encoding/json"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/internal/cfargs"
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
//	    }
//	}
type globalOptions struct {
	StorageRaw json.RawMessage
}

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
		if opt != "storage" {
			return d.Errf("unrecognized idempotency global option '%s' (only storage can be set globally)", opt)
		}
		raw, err := parseStorage(d)
		opts.StorageRaw = raw
		return err
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
}
