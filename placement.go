package idempotency

import (
	"fmt"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

func init() {
	caddy.RegisterModule(placementCheck{})
}

// placementCheck finds idempotency handlers that can never run before the
// handler that answers their requests: a terminal handler (reverse_proxy,
// respond, file_server, php_fastcgi, error, an invoke of a named route
// holding one) reached first on the same path. Such a handler is silent
// (every retry reaches the upstream again), so it is the worst mistake a
// configuration can make with this module: `order idempotency last`,
// `order idempotency after reverse_proxy`, or `route { reverse_proxy ...;
// idempotency }`.
//
// It is an app that every idempotency handler loads, and it checks while
// Caddy provisions the HTTP app: `caddy validate` provisions modules but
// starts no app, so a check at Start would pass validate silently. It logs
// a warning per misplaced handler (at start, on every reload and in
// validate) and refuses the config when such a handler has strict set.
type placementCheck struct{}

// placementApp is the app's ID.
const placementApp = "idempotency"

// joinPlacementCheck loads the app into the config being provisioned (if
// it is not there yet), which runs the check once per config. A context
// made without a config (caddy.NewContext, as tools and unit tests make
// one) has no apps to join: Caddy's Context.App panics on it, and there
// is nothing to check.
func joinPlacementCheck(ctx caddy.Context) (err error) {
	defer func() {
		if recover() != nil {
			err = nil
		}
	}()
	_, err = ctx.App(placementApp)
	return err
}

// CaddyModule returns the Caddy module information.
func (placementCheck) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  placementApp,
		New: func() caddy.Module { return new(placementCheck) },
	}
}

// Provision runs the check. The first idempotency handler Caddy
// provisions loads this app, in the middle of the HTTP app's provisioning
// (Caddy registers an app before provisioning it, so the HTTP app is
// found, not loaded again); its routes are then part raw, part
// provisioned, and readServers reads both.
func (p *placementCheck) Provision(ctx caddy.Context) error {
	app, err := ctx.AppIfConfigured("http")
	if err != nil {
		return nil // no HTTP app, no handler of ours
	}
	http, ok := app.(*caddyhttp.App)
	if !ok {
		return nil
	}
	return reportPlacement(ctx.Logger(), misplacedIn(readServers(http)))
}

// reportPlacement logs each misplaced handler and refuses the config when
// one of them is strict.
func reportPlacement(logger *zap.Logger, found []misplaced) error {
	var refuse []string
	for _, m := range found {
		logger.Warn(m.sentence(),
			zap.String("server", m.server), zap.String("site", m.site), zap.String("route", m.route()),
			zap.String("answered_by", m.answeredBy), zap.String("fix", m.fix))
		if m.strict {
			refuse = append(refuse, m.sentence())
		}
	}
	if len(refuse) > 0 {
		return fmt.Errorf("strict: %s", strings.Join(refuse, "; and "))
	}
	return nil
}

// misplacedLog starts the sentence about a misplaced handler.
const misplacedLog = "an idempotency handler can never run"

// sentence says what is wrong and how to fix it, in the Caddyfile's terms.
func (m misplaced) sentence() string {
	return fmt.Sprintf("%s (site %s, %s): %s answers its requests first, so every retry reaches the upstream again; fix: %s",
		misplacedLog, m.site, m.route(), m.answeredBy, m.fix)
}

// Start implements caddy.App.
func (*placementCheck) Start() error { return nil }

// Stop implements caddy.App.
func (*placementCheck) Stop() error { return nil }

// terminalHandlers are the standard handlers that answer a request
// without calling the next handler.
var terminalHandlers = map[string]bool{
	"http.handlers.reverse_proxy":   true,
	"http.handlers.static_response": true,
	"http.handlers.file_server":     true,
	"http.handlers.error":           true,
	"http.handlers.copy_response":   true,
	"http.handlers.acme_server":     true,
}

// moduleName is a handler's name as written in the config
// (reverse_proxy).
func moduleName(h caddyhttp.MiddlewareHandler) string {
	if m, ok := h.(caddy.Module); ok {
		return m.CaddyModule().ID.Name()
	}
	return fmt.Sprintf("%T", h)
}

// Interface guards
var (
	_ caddy.App         = (*placementCheck)(nil)
	_ caddy.Provisioner = (*placementCheck)(nil)
)
