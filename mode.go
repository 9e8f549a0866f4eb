package idempotency

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"
)

// mode is how a handler acts on the answer to a request (answer.go):
// enforce answers as the contract says (enforce.go); observe lets every
// request through as if the handler were absent and only records what
// enforce would have done (observe.go). The rest of the request flow is
// the same in both; what differs is here, as the mode's methods and its
// traits.
type mode interface {
	// carryOut acts on the answer to x's request.
	carryOut(x *exchange, a answer) error
	// pass hands on a request that carries no key.
	pass(x *exchange) error
	// traits are the values that tell the mode's requests apart.
	traits() *modeTraits
}

// modeTraits are what a mode's requests carry and are counted by, kept
// apart so that an observing handler never changes what an enforcing one
// nested with it sees.
type modeTraits struct {
	name string // the mode option's value

	// keyHash is the placeholder that carries the request's key hash;
	// outcomeField and hashField are the access log's fields of the
	// outcome and the key hash; span is the span attribute of the
	// outcome.
	keyHash, outcomeField, hashField, span string
	// scopePrefix starts the scope of the mode's records, so that an
	// observing handler's records never look like an enforcing one's in
	// a shared store (scope.go).
	scopePrefix string
	// counted is the requests counter of the mode, by outcome.
	counted func(r *http.Request, o outcome)

	// answers: the mode answers for its requests (placeholderSettled),
	// and the outermost enforcing handler that passed a request on counts
	// it as passed only when no handler did.
	answers bool
	// waits: a request that finds its key in flight may wait for it.
	waits bool
	// detaches: the request that owns its key runs to the end even if its
	// client hangs up, and asks for a body that is not content-encoded
	// (see exchange.execute).
	detaches bool
	// transparent: the recorder neither bounds writes to the client nor
	// refuses a status (recorder.go).
	transparent bool
}

// modes are the values of the mode option.
var modes = map[string]mode{modeEnforce: enforcing{}, modeObserve: observing{}}

// taken reports whether an outer idempotency handler owns the request
// already: an enforcing one that took its key, for every handler; an
// observing one, for an observing handler (it classifies the request).
func taken(m mode, repl *caddy.Replacer) bool {
	if _, ok := repl.Get(placeholderKeyHash); ok {
		return true
	}
	_, ok := repl.Get(m.traits().keyHash)
	return ok
}
