package placement

import (
	"encoding/json"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Misplaced is a misplaced handler as the tests of package placement_test
// (which adapt Caddyfiles with the idempotency directive, and so import
// the handler's package, which imports this one) read it.
type Misplaced struct {
	Never, Strict                          bool
	Site, Route, AnsweredBy, Fix, Sentence string
}

// MisplacedInJSON runs the check over a config's JSON as it reads an
// HTTP app before Caddy provisions it (every route raw).
func MisplacedInJSON(js []byte) ([]Misplaced, int, error) {
	var cfg struct {
		Apps struct {
			HTTP *caddyhttp.App `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(js, &cfg); err != nil {
		return nil, 0, err
	}
	if cfg.Apps.HTTP == nil {
		return nil, 0, nil
	}
	servers := readServers(cfg.Apps.HTTP)
	var out []Misplaced
	for _, m := range misplacedIn(servers) {
		out = append(out, Misplaced{Never: m.never, Strict: m.strict, Site: m.site, Route: m.route(),
			AnsweredBy: m.answeredBy, Fix: m.fix, Sentence: m.sentence()})
	}
	return out, len(servers), nil
}
