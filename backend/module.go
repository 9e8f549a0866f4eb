package backend

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/backend/cfargs"
	"github.com/caddy-idempotency/caddy-idempotency/backend/opterr"
)

// Name is a backend's name, written once in its package
// (`const name backend.Name = "mine"`): its module's ID is
// Namespace.mine, its Caddyfile block `storage mine { ... }`, its JSON
// {"backend": "mine", ...}, the backend label of its metrics, and its
// errors say "mine storage: ...".
type Name string

// ModuleInfo is the module information of the backend named n, whose
// modules new makes.
func (n Name) ModuleInfo(new func() caddy.Module) caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: caddy.ModuleID(Namespace + "." + string(n)), New: new}
}

// Errorf is a configuration error about option (an opterr.Error), its
// message starting "<name> storage: ".
func (n Name) Errorf(option, format string, a ...any) error {
	return opterr.Errorf(option, string(n)+" storage: "+format, a...)
}

// UnmarshalBlock parses the options block of `storage <name> { ... }`,
// once the backend's name and the arguments on its line are read: parse
// reads each option's syntax into the module's JSON fields (n.Unknown
// for an option it does not know), and compile checks the block once it
// is read, each error (an opterr.Error) reported at the line of the
// option it names (see cfargs.EachOption). given, which may be nil, holds
// the options the arguments set.
func UnmarshalBlock[C any](d *caddyfile.Dispenser, n Name, given cfargs.Given, parse func(opt string) error, compile func() (C, error)) error {
	return cfargs.EachOption(d, string(n)+" storage ", given, parse, Check(compile))
}

// Unknown is the error of an option of n's block that its parser does
// not know, suggesting the nearest of known.
func (n Name) Unknown(d *caddyfile.Dispenser, opt string, known []string) error {
	return cfargs.Unknown(d, string(n)+" storage", opt, known)
}

// Check is compile run for its error alone: the check of a Caddyfile
// block once it is read (cfargs.EachOption).
func Check[C any](compile func() (C, error)) func() error {
	return func() error {
		_, err := compile()
		return err
	}
}

// Validate is the Validate of a backend module b whose Provision compiles
// its configuration before it takes a store: nothing is left to report
// once b has a store, and a module that was not provisioned reports its
// compile error.
func Validate[C any](b Backend, compile func() (C, error)) error {
	if b.Store() != nil {
		return nil
	}
	return Check(compile)()
}
