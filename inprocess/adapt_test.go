package inprocess_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	idempotency "github.com/caddy-idempotency/caddy-idempotency"
)

// The adapt fixtures in testdata/adapt follow Caddy's own
// caddytest/integration/caddyfile_adapt format: a Caddyfile, a line of
// dashes, and the JSON the Caddyfile adapter must produce for it, compared
// with caddytest.CompareAdapt as Caddy compares its own.
//
// After changing the parser, regenerate them with
//
//	go test -run TestAdaptFixtures -update .
//
// and read the diff: the fixtures are only worth what that review is.
var update = flag.Bool("update", false, "rewrite testdata/adapt/*.caddyfiletest with the adapter's current output")

// separator matches the line of dashes between the two halves of a
// fixture.
var separator = regexp.MustCompile(`(?m)^-{10,}[ \t]*\r?\n?`)

// adapt adapts a Caddyfile named "Caddyfile" and returns its JSON,
// tab-indented as the fixtures spell it, failing the test on warnings.
func adapt(t *testing.T, caddyfileText string) []byte {
	t.Helper()
	adapter := caddyconfig.GetAdapter("caddyfile")
	if adapter == nil {
		t.Fatal("no caddyfile adapter registered")
	}
	out, warnings, err := adapter.Adapt([]byte(caddyfileText), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapting: %v", err)
	}
	for _, w := range warnings {
		t.Errorf("adapt warning: %s:%d: %s: %s", w.File, w.Line, w.Directive, w.Message)
	}
	var indented bytes.Buffer
	if err := json.Indent(&indented, out, "", "\t"); err != nil {
		t.Fatalf("invalid JSON: %v\n%s", err, out)
	}
	return indented.Bytes()
}

// provisionJSON decodes a handler's JSON config the way Caddy does, then
// provisions and validates it in a context cancelled when the test ends.
func provisionJSON(t *testing.T, config []byte) error {
	t.Helper()
	h := new(idempotency.Handler)
	if err := caddy.StrictUnmarshalJSON(config, h); err != nil {
		return fmt.Errorf("decoding: %w", err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := h.Provision(ctx); err != nil {
		return err
	}
	return h.Validate()
}

func TestAdaptFixtures(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "adapt", "*.caddyfiletest"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no fixtures in testdata/adapt")
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			parts := separator.Split(string(data), 2)
			if len(parts) != 2 {
				t.Fatalf("%s: no line of dashes between the Caddyfile and the JSON", file)
			}
			caddyfileText := strings.TrimSpace(parts[0]) + "\n"
			got := adapt(t, caddyfileText)

			if *update {
				fixture := caddyfileText + "----------\n" + string(got) + "\n"
				if err := os.WriteFile(file, []byte(fixture), 0o644); err != nil {
					t.Fatal(err)
				}
			} else if !caddytest.CompareAdapt(t, file, caddyfileText, "caddyfile", strings.TrimSpace(parts[1])) {
				t.Errorf("adapted JSON differs from %s (diff above: - want, + got); regenerate with -update and review", file)
			}

			// Whatever the fixture says, the adapted config of each
			// idempotency handler must provision.
			var cfg any
			if err := json.Unmarshal(got, &cfg); err != nil {
				t.Fatal(err)
			}
			handlers := findHandlers(cfg, "idempotency")
			if len(handlers) == 0 {
				t.Fatal("no idempotency handler in the adapted config")
			}
			for _, raw := range handlers {
				if err := provisionJSON(t, raw); err != nil {
					t.Errorf("provisioning adapted handler %s: %v", raw, err)
				}
			}
		})
	}
}

// findHandlers returns the JSON of every handler object named name
// anywhere in cfg, "handler" key removed, in document order.
func findHandlers(cfg any, name string) []json.RawMessage {
	var found []json.RawMessage
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if v["handler"] == name {
				m := make(map[string]any, len(v))
				for k, val := range v {
					if k != "handler" {
						m[k] = val
					}
				}
				b, _ := json.Marshal(m)
				found = append(found, b)
			}
			for _, val := range v {
				walk(val)
			}
		case []any:
			for _, val := range v {
				walk(val)
			}
		}
	}
	walk(cfg)
	return found
}

// handlerOrder returns the names of the handlers of the first server's
// routes, in the order a request meets them (subroutes flattened).
func handlerOrder(t *testing.T, adapted []byte) []string {
	t.Helper()
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Routes []json.RawMessage `json:"routes"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(adapted, &cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Apps.HTTP.Servers) != 1 {
		t.Fatalf("want one server, got %d", len(cfg.Apps.HTTP.Servers))
	}
	var order []string
	var routes func(rs []json.RawMessage)
	routes = func(rs []json.RawMessage) {
		for _, r := range rs {
			var route struct {
				Handle []struct {
					Handler string            `json:"handler"`
					Routes  []json.RawMessage `json:"routes"`
				} `json:"handle"`
			}
			if err := json.Unmarshal(r, &route); err != nil {
				t.Fatal(err)
			}
			for _, h := range route.Handle {
				if h.Handler == "subroute" {
					routes(h.Routes)
					continue
				}
				order = append(order, h.Handler)
			}
		}
	}
	for _, srv := range cfg.Apps.HTTP.Servers {
		routes(srv.Routes)
	}
	return order
}

// TestAdaptOrderAfterEncode checks the directive order registered in
// init: idempotency runs after encode (so stored bodies are never
// compressed) and before the handlers that answer, whatever order the
// Caddyfile lists them in, with no `order` global option.
func TestAdaptOrderAfterEncode(t *testing.T) {
	sites := map[string]string{
		"usual order": `api.example.com {
	encode gzip
	idempotency
	reverse_proxy localhost:8080
}
`,
		"reversed": `api.example.com {
	reverse_proxy localhost:8080
	idempotency {
		ttl 1h
	}
	header X-Served-By caddy
	encode gzip
}
`,
		"with respond": `api.example.com {
	respond "ok" 201
	idempotency
	request_body {
		max_size 2MB
	}
	encode zstd gzip
}
`,
	}
	for name, site := range sites {
		t.Run(name, func(t *testing.T) {
			order := handlerOrder(t, adapt(t, site))
			pos := make(map[string]int)
			for i, h := range order {
				if _, dup := pos[h]; dup {
					t.Fatalf("handler %s appears twice in %v", h, order)
				}
				pos[h] = i
			}
			idem, ok := pos["idempotency"]
			if !ok {
				t.Fatalf("no idempotency handler in %v", order)
			}
			for h, i := range pos {
				var after bool
				switch h {
				case "idempotency":
					continue
				case "encode", "headers", "request_body":
					after = true // these run first
				case "reverse_proxy", "static_response":
					after = false
				default:
					t.Fatalf("unexpected handler %s in %v", h, order)
				}
				if after && i > idem {
					t.Errorf("%s runs after idempotency: %v", h, order)
				}
				if !after && i < idem {
					t.Errorf("%s runs before idempotency: %v", h, order)
				}
			}
		})
	}
}

// TestAdaptErrorsNameFileAndLine checks that an error in the directive
// reaches the user with the Caddyfile's name and the offending line.
func TestAdaptErrorsNameFileAndLine(t *testing.T) {
	tests := []struct {
		name      string
		caddyfile string
		line      int
		want      string
	}{
		{
			name: "invalid duration",
			caddyfile: `api.example.com {
	encode gzip
	idempotency {
		ttl forever
	}
	reverse_proxy localhost:8080
}
`,
			line: 4,
			want: "'forever'",
		},
		{
			name: "unknown option under a matcher",
			caddyfile: `api.example.com {
	@payments path /payments/*
	idempotency @payments {
		required
		ttl 48h
		retries 3
	}
	reverse_proxy localhost:8080
}
`,
			line: 6,
			want: "'retries'",
		},
		{
			name: "unknown storage option",
			caddyfile: `{
	admin off
}

api.example.com {
	idempotency {
		storage memory {
			max_keys 10
			shards 16
		}
	}
	reverse_proxy localhost:8080
}
`,
			line: 9,
			want: "'shards'",
		},
		{
			name: "duplicate option in the second site",
			caddyfile: `a.example.com {
	idempotency
	reverse_proxy localhost:8080
}

b.example.com {
	idempotency {
		methods POST
		methods PUT
	}
	reverse_proxy localhost:8081
}
`,
			line: 9,
			want: "methods already specified",
		},
		{
			name: "argument on the directive line",
			caddyfile: `api.example.com {
	idempotency /payments/* strict
	reverse_proxy localhost:8080
}
`,
			line: 2,
			want: "'strict'",
		},
	}
	adapter := caddyconfig.GetAdapter("caddyfile")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := adapter.Adapt([]byte(tt.caddyfile), map[string]any{"filename": "Caddyfile"})
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			if !regexp.MustCompile(fmt.Sprintf(`\bCaddyfile:%d\b`, tt.line)).MatchString(msg) {
				t.Errorf("error %q does not point at Caddyfile:%d", msg, tt.line)
			}
			if !strings.Contains(msg, tt.want) {
				t.Errorf("error %q does not mention %q", msg, tt.want)
			}
		})
	}
}
