package backend

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/backend/cfargs"
	"github.com/caddy-idempotency/caddy-idempotency/storage/opterr"
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

// Errorf is an error of the backend named n: fmt.Errorf's (%w wraps),
// its message starting "<name> storage: ".
func (n Name) Errorf(format string, a ...any) error {
	return fmt.Errorf(n.what()+": "+format, a...)
}

// OptionErrorf is n.Errorf about option: an opterr.Error, which a
// Caddyfile block reports at the option's line.
func (n Name) OptionErrorf(option, format string, a ...any) error {
	return opterr.New(n.Errorf(format, a...), option)
}

// what is how messages name the backend: "<name> storage".
func (n Name) what() string { return string(n) + " storage" }

// ParseCaddyfile parses the storage option's `<backend> [args] [{ ... }]`,
// the dispenser on the option's name: the backend's module parses its own
// arguments and block, and the result is the module's JSON with
// "backend": its name, as the handler's config holds it. An unknown
// backend is an error that lists the known ones.
func ParseCaddyfile(d *caddyfile.Dispenser) (json.RawMessage, error) {
	if !d.NextArg() {
		return nil, d.ArgErr()
	}
	name := d.Val()
	if _, err := caddy.GetModule(Namespace + "." + name); err != nil {
		var known []string
		for _, m := range caddy.GetModules(Namespace) {
			known = append(known, m.ID.Name())
		}
		return nil, d.Errf("unknown storage backend '%s'%s; available: %s", name, cfargs.DidYouMean(name, known), strings.Join(known, ", "))
	}
	unm, err := caddyfile.UnmarshalModule(d, Namespace+"."+name)
	if err != nil {
		return nil, err
	}
	return caddyconfig.JSONModuleObject(unm, "backend", name, nil), nil
}

// UnmarshalBlock parses the options block of `storage <name> { ... }`,
// once the backend's name and the arguments on its line are read: parse
// reads each option's syntax into the module's JSON fields (n.Unknown
// for an option it does not know), and compile checks the block once it
// is read, each error (an opterr.Error) reported at the line of the
// option it names (see cfargs.EachOption). given, which may be nil, holds
// the options the arguments set.
func UnmarshalBlock[C any](d *caddyfile.Dispenser, n Name, given cfargs.Given, parse func(opt string) error, compile func() (C, error)) error {
	return cfargs.EachOption(d, n.what()+" ", given, parse, Check(compile))
}

// Unknown is the error of an option of n's block that its parser does
// not know, suggesting the nearest of known.
func (n Name) Unknown(d *caddyfile.Dispenser, opt string, known []string) error {
	return cfargs.Unknown(d, n.what(), opt, known)
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

// DecodeJSON decodes a module's JSON config b into v as Caddy decodes
// modules (an unknown member is an error), naming the member a value that
// does not decode is given to: encoding/json names the field of a type
// mismatch, but not that of a value whose own decoder refused it (a
// caddy.Duration says `time: invalid duration "x"`). v must not be of a
// type whose UnmarshalJSON calls DecodeJSON (a module's UnmarshalJSON
// gives it its fields as a type of their own, without methods).
func DecodeJSON(b []byte, v any) error {
	err := decodeStrict(b, v)
	if err == nil {
		return nil
	}
	var members map[string]json.RawMessage
	if json.Unmarshal(b, &members) != nil {
		return err
	}
	t := reflect.TypeOf(v).Elem()
	for _, name := range slices.Sorted(maps.Keys(members)) {
		one, _ := json.Marshal(map[string]json.RawMessage{name: members[name]})
		if decodeStrict(one, reflect.New(t).Interface()) != nil {
			return opterr.Errorf(name, "%s: %v", name, err)
		}
	}
	return err
}

func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
