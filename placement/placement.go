// Package placement finds idempotency handlers that can never run
// before the handler that answers their requests: a terminal handler
// (reverse_proxy, respond, file_server, php_fastcgi, error, an invoke of
// a named route holding one) reached first on the same path. Such a
// handler is silent (every retry reaches the upstream again), so it is
// the worst mistake a configuration can make with the module: `order
// idempotency last`, `order idempotency after reverse_proxy`, or `route {
// reverse_proxy ...; idempotency }`.
//
// The check is a Caddy app of its own (ID "idempotency", no
// configuration) that every idempotency handler joins (Join) while Caddy
// provisions the HTTP app: `caddy validate` provisions modules but
// starts no app, so a check at Start would pass validate silently. It
// knows the handler by its module ID (http.handlers.idempotency) and its
// `strict` option, never by its type.
package placement

import (
	"fmt"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

func init() {
	caddy.RegisterModule(App{})
}

// ID is the app's module ID.
const ID = "idempotency"

// App is the placement check. It refuses a config (in caddy validate,
// at start and on a reload) in which an idempotency handler can never
// run, and one in which some requests skip it when the handler is
// strict; it warns of the latter otherwise.
type App struct{}

// StrictPlacement is implemented by the idempotency handler: its strict
// option, which makes a handler that some requests skip an error too.
type StrictPlacement interface {
	StrictPlacement() bool
}

// Join loads the app into the config being provisioned (if it is not
// there yet), which runs the check once per config. A context made
// without a config (caddy.NewContext, as tools and unit tests make one)
// has no apps to join: Caddy's Context.App panics on it, and there is
// nothing to check.
func Join(ctx caddy.Context) (err error) {
	defer func() {
		if recover() != nil {
			err = nil
		}
	}()
	_, err = ctx.App(ID)
	return err
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  ID,
		New: func() caddy.Module { return new(App) },
	}
}

// Provision runs the check. The first idempotency handler Caddy
// provisions loads this app, in the middle of the HTTP app's provisioning
// (Caddy registers an app before provisioning it, so the HTTP app is
// found, not loaded again); its routes are then part raw, part
// provisioned, and readServers reads both.
func (*App) Provision(ctx caddy.Context) error {
	app, err := ctx.AppIfConfigured("http")
	if err != nil {
		return nil // no HTTP app, no handler of ours
	}
	http, ok := app.(*caddyhttp.App)
	if !ok {
		return nil
	}
	return report(ctx.Logger(), misplacedIn(readServers(http)))
}

// report logs each misplaced handler and refuses the config when one of
// them can never run, or is strict.
func report(logger *zap.Logger, found []misplaced) error {
	var refuse []string
	for _, m := range found {
		logger.Warn(m.sentence(),
			zap.String("server", m.server), zap.String("site", m.site), zap.String("route", m.route()),
			zap.String("answered_by", m.answeredBy), zap.String("fix", m.fix))
		if m.never || m.strict {
			refuse = append(refuse, m.sentence())
		}
	}
	if len(refuse) > 0 {
		return fmt.Errorf("%s", strings.Join(refuse, "; and "))
	}
	return nil
}

// Start implements caddy.App.
func (*App) Start() error { return nil }

// Stop implements caddy.App.
func (*App) Stop() error { return nil }

// Interface guards
var (
	_ caddy.App         = (*App)(nil)
	_ caddy.Provisioner = (*App)(nil)
)
