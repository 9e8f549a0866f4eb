package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
	"github.com/caddy-idempotency/caddy-idempotency/backend/backendtest"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/memory"
	"github.com/caddy-idempotency/caddy-idempotency/storage/opterr"
)

// caddyContext returns a fresh Caddy context, cancelled when the test ends
// (which cleans up the guest storage modules loaded with it); cancel may
// also be called earlier, and more than once.
func caddyContext(t *testing.T) (caddy.Context, context.CancelFunc) {
	t.Helper()
	return backendtest.CaddyContext(t)
}

// tryProvision provisions and validates h, as caddy.Context.LoadModule
// would, and returns the first error.
func tryProvision(t *testing.T, ctx caddy.Context, h *Handler) error {
	t.Helper()
	if err := h.Provision(ctx); err != nil {
		return err
	}
	return h.Validate()
}

// handlerFromJSON decodes a handler's JSON config the way Caddy does.
func handlerFromJSON(t *testing.T, config string) *Handler {
	t.Helper()
	h := new(Handler)
	if err := caddy.StrictUnmarshalJSON([]byte(config), h); err != nil {
		t.Fatalf("decoding %s: %v", config, err)
	}
	return h
}

// mustScope compiles a scope template, for comparing with a handler's.
func mustScope(t *testing.T, template string) *scopeTemplate {
	t.Helper()
	st, err := newScopeTemplate(template)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestProvisionDefaults(t *testing.T) {
	ctx, _ := caddyContext(t)
	h := new(Handler)
	if err := tryProvision(t, ctx, h); err != nil {
		t.Fatal(err)
	}

	checks := []struct {
		name      string
		got, want any
	}{
		{"ttl", time.Duration(h.policy.ttl), 24 * time.Hour},
		{"lock_timeout", time.Duration(h.policy.lockTimeout), 30 * time.Second},
		{"methods", h.policy.methods, []string{"POST", "PATCH"}},
		{"header", h.policy.header, "Idempotency-Key"},
		{"header (effective)", h.policy.headerKey, "Idempotency-Key"},
		{"required", h.policy.required, false},
		{"scope", h.policy.scope, mustScope(t, "{http.request.host} {http.request.header.Authorization}")},
		{"max_key_length", h.policy.maxKeyLength, 255},
		{"max_body_size", h.policy.maxBodySize, int64(1 << 20)},
		{"max_response_size", h.policy.maxResponseSize, int64(1 << 20)},
		{"fingerprint.headers", h.policy.fingerprint.Headers(), []string{"Content-Type"}},
		{"fingerprint.canonical_json (effective)", h.policy.fingerprint.CanonicalJSON(), true},
		{"in_flight wait", h.policy.waitInFlight, true},
		{"wait_timeout", time.Duration(h.policy.waitTimeout), 10 * time.Second},
		{"on_storage_error fail_open", h.policy.failOpen, false},
		{"on_unknown_outcome keep", h.policy.keepUnknown, true},
		{"replay_header (effective)", h.policy.replayHeader, "Idempotent-Replayed"},
		{"docs_url", h.policy.docsURL, ""},
		{"mode", h.policy.mode.traits().name, "enforce"},
		{"errors handle_errors", h.policy.errorRoutes, false},
		{"storage backend", h.backendName, "memory"},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %#v, want %#v", c.name, c.got, c.want)
		}
	}

	// The answers that say nothing was done free the key.
	for _, code := range []int{500, 502, 503, 599, 401, 403, 407, 408, 429} {
		if !h.policy.releaseOn.has(code) {
			t.Errorf("default release_on does not free the key on %d", code)
		}
	}
	for _, code := range []int{200, 201, 204, 301, 400, 404, 409, 422, 499} {
		if h.policy.releaseOn.has(code) {
			t.Errorf("default release_on frees the key on %d", code)
		}
	}

	if _, ok := h.rawStore().(*memory.Store); !ok {
		t.Errorf("default store is %T, want *memory.Store", h.rawStore())
	}
	if h.keeper.store.waiter == nil {
		t.Error("the memory store can notify waiters, but the keeper has no waiter")
	}

	// The default store is the memory store with the default max_keys.
	explicit := handlerFromJSON(t, `{"storage":{"backend":"memory","max_keys":1000000}}`)
	if err := tryProvision(t, ctx, explicit); err != nil {
		t.Fatal(err)
	}
	if explicit.rawStore() != h.rawStore() {
		t.Error("no storage and memory with max_keys 1000000 got different stores")
	}
}

func TestProvisionKeepsExplicitValues(t *testing.T) {
	ctx, _ := caddyContext(t)
	h := handlerFromJSON(t, `{
		"storage": {"backend": "memory", "max_keys": 424201},
		"ttl": "1h",
		"lock_timeout": 5000000000,
		"methods": ["post", "Put"],
		"header": "x-request-key",
		"required": true,
		"scope": "{http.request.header.X-Tenant}",
		"max_key_length": 64,
		"max_body_size": 2048,
		"max_response_size": 4096,
		"fingerprint": {"headers": ["X-Tenant"], "canonical_json": false},
		"release_on": ["429", "5xx"],
		"in_flight": "wait",
		"wait_timeout": "3s",
		"on_storage_error": "fail_open",
		"on_unknown_outcome": "release",
		"replay_header": "x-replayed",
		"docs_url": "https://api.example.com/docs#idempotency"
	}`)
	if err := tryProvision(t, ctx, h); err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"ttl", time.Duration(h.policy.ttl), time.Hour},
		{"lock_timeout", time.Duration(h.policy.lockTimeout), 5 * time.Second},
		{"methods (effective)", h.policy.methods, []string{"POST", "PUT"}},
		{"header", h.policy.header, "x-request-key"},
		{"header (effective)", h.policy.headerKey, "X-Request-Key"},
		{"required", h.policy.required, true},
		{"scope", h.policy.scope, mustScope(t, "{http.request.header.X-Tenant}")},
		{"max_key_length", h.policy.maxKeyLength, 64},
		{"max_body_size", h.policy.maxBodySize, int64(2048)},
		{"max_response_size", h.policy.maxResponseSize, int64(4096)},
		{"fingerprint.headers", h.policy.fingerprint.Headers(), []string{"X-Tenant"}},
		{"fingerprint.canonical_json (effective)", h.policy.fingerprint.CanonicalJSON(), false},
		{"in_flight wait", h.policy.waitInFlight, true},
		{"wait_timeout", time.Duration(h.policy.waitTimeout), 3 * time.Second},
		{"on_storage_error fail_open", h.policy.failOpen, true},
		{"on_unknown_outcome keep", h.policy.keepUnknown, false},
		{"replay_header (effective)", h.policy.replayHeader, "X-Replayed"},
		{"docs_url", h.policy.docsURL, "https://api.example.com/docs#idempotency"},
		{"storage backend", h.backendName, "memory"},
		{"release_on 429", h.policy.releaseOn.has(429), true},
		{"release_on 503", h.policy.releaseOn.has(503), true},
		{"release_on 409", h.policy.releaseOn.has(409), false},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %#v, want %#v", c.name, c.got, c.want)
		}
	}
}

func TestProvisionReplayHeaderOff(t *testing.T) {
	ctx, _ := caddyContext(t)
	h := handlerFromJSON(t, `{"replay_header":"off"}`)
	if err := tryProvision(t, ctx, h); err != nil {
		t.Fatal(err)
	}
	if h.policy.replayHeader != "" {
		t.Errorf("replay_header off: effective header %q, want none", h.policy.replayHeader)
	}
}

func TestProvisionInvalidConfig(t *testing.T) {
	tests := []struct {
		name   string
		config string
		want   []string
	}{
		{"negative ttl", `{"ttl":"-1s"}`, []string{"ttl", "at least 1s", "-1s"}},
		{"negative lock_timeout", `{"lock_timeout":"-30s"}`, []string{"lock_timeout", "at least 1s", "-30s"}},
		{"ttl below the floor", `{"ttl":"999ms"}`, []string{"ttl", "at least 1s", "999ms"}},
		{"lock_timeout in nanoseconds", `{"lock_timeout":30}`, []string{"lock_timeout", "at least 1s", "30ns"}},
		{"negative wait_timeout", `{"in_flight":"wait","wait_timeout":"-2s"}`, []string{"wait_timeout", "at least", "-2s"}},
		{"wait_timeout in nanoseconds", `{"wait_timeout":5}`, []string{"wait_timeout", "at least 10ms", "5ns"}},
		{"wait_timeout above the ceiling", `{"wait_timeout":"2h"}`, []string{"wait_timeout", "at most 1h0m0s", "2h0m0s"}},
		// Ceilings: time arithmetic on these would overflow (106751 days
		// is the most a time.Duration holds).
		{"ttl above the ceiling", `{"ttl":"3651d"}`, []string{"ttl", "at most 87600h0m0s", "87624h0m0s"}},
		{"ttl of 106751 days", `{"ttl":"106751d"}`, []string{"ttl", "at most"}},
		{"ttl at the int64 maximum", `{"ttl":9223372036854775807}`, []string{"ttl", "at most"}},
		{"lock_timeout above the ceiling", `{"lock_timeout":"25h"}`, []string{"lock_timeout", "at most 24h0m0s", "25h0m0s"}},
		{"lock_timeout of 60000 days", `{"lock_timeout":"60000d"}`, []string{"lock_timeout", "at most"}},
		{"lock_timeout near the int64 maximum", `{"lock_timeout":9223372036854774807}`, []string{"lock_timeout", "at most"}},
		{"negative max_key_length", `{"max_key_length":-1}`, []string{"max_key_length", "positive", "-1"}},
		{"negative max_body_size", `{"max_body_size":-1}`, []string{"max_body_size", "positive", "-1"}},
		{"negative max_response_size", `{"max_response_size":-1}`, []string{"max_response_size", "positive", "-1"}},
		{"method with a space", `{"methods":["PO ST"]}`, []string{"methods", `"PO ST"`}},
		{"method with a slash", `{"methods":["POST","GET/1"]}`, []string{"methods", `"GET/1"`}},
		{"empty method", `{"methods":["POST",""]}`, []string{"methods", `""`}},
		{"header with a space", `{"header":"Idempotency Key"}`, []string{"header", `"Idempotency Key"`}},
		{"header with a colon", `{"header":"Idempotency-Key:"}`, []string{"header", `"Idempotency-Key:"`}},
		{"fingerprint header with a space", `{"fingerprint":{"headers":["X Tenant"]}}`, []string{"fingerprint headers", `"X Tenant"`}},
		{"replay_header with a space", `{"replay_header":"Was Replayed"}`, []string{"replay_header", `"Was Replayed"`}},
		{"docs_url not a URL", `{"docs_url":"not a url"}`, []string{"docs_url", `"not a url"`}},
		{"docs_url relative", `{"docs_url":"/docs/idempotency"}`, []string{"docs_url", `"/docs/idempotency"`}},
		{"docs_url without host", `{"docs_url":"https://"}`, []string{"docs_url", `"https://"`}},
		{"docs_url unparsable", `{"docs_url":"http://[::1"}`, []string{"docs_url", `"http://[::1"`}},
		{"release_on 6xx", `{"release_on":["6xx"]}`, []string{"release_on", `"6xx"`}},
		{"release_on 1xx", `{"release_on":["1xx"]}`, []string{"release_on", `"1xx"`}},
		{"release_on 99", `{"release_on":["5xx","99"]}`, []string{"release_on", `"99"`}},
		{"release_on abc", `{"release_on":["abc"]}`, []string{"release_on", `"abc"`}},
		{"release_on empty string", `{"release_on":[""]}`, []string{"release_on", `""`}},
		{"in_flight sometimes", `{"in_flight":"sometimes"}`, []string{"in_flight", "reject", "wait", `"sometimes"`}},
		{"on_storage_error maybe", `{"on_storage_error":"maybe"}`, []string{"on_storage_error", "fail_closed", "fail_open", `"maybe"`}},
		{"on_unknown_outcome retry", `{"on_unknown_outcome":"retry"}`, []string{"on_unknown_outcome", "keep", "release", `"retry"`}},
		{"unknown storage backend", `{"storage":{"backend":"nosuch"}}`, []string{"storage", "nosuch"}},
		{"storage without backend", `{"storage":{"max_keys":5}}`, []string{"storage", "backend"}},
		{"memory max_keys negative", `{"storage":{"backend":"memory","max_keys":-1}}`, []string{"max_keys", "positive", "-1"}},
		{"memory unknown field", `{"storage":{"backend":"memory","max_key":5}}`, []string{"storage", "max_key"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, _ := caddyContext(t)
			h := handlerFromJSON(t, tt.config)
			err := tryProvision(t, ctx, h)
			if err == nil {
				t.Fatalf("%s: no error, want one mentioning %q", tt.config, tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s: error %q does not mention %q", tt.config, err, w)
				}
			}
			// Cleanup must cope with a handler whose Provision failed,
			// as Caddy calls it then.
			if err := h.Cleanup(); err != nil {
				t.Errorf("Cleanup after failed Provision: %v", err)
			}
		})
	}
}

func TestValidateBeforeProvision(t *testing.T) {
	h := new(Handler)
	if err := h.Validate(); err == nil {
		t.Error("Validate on an unprovisioned handler: no error")
	}
	if err := h.Cleanup(); err != nil {
		t.Errorf("Cleanup on an unprovisioned handler: %v", err)
	}
}

// memoryConfig is a handler config on the memory store with max_keys n.
// Tests use their own n: handlers with the same n share one store.
func memoryConfig(n string, extra string) string {
	return `{"storage":{"backend":"memory","max_keys":` + n + `}` + extra + `}`
}

func TestProvisionSharesMemoryStore(t *testing.T) {
	ctx1, _ := caddyContext(t)
	ctx2, _ := caddyContext(t)

	a := handlerFromJSON(t, memoryConfig("424301", `,"ttl":"1h"`))
	b := handlerFromJSON(t, memoryConfig("424301", `,"ttl":"48h","required":true`))
	c := handlerFromJSON(t, memoryConfig("424302", ""))
	for _, h := range []*Handler{a, b} {
		if err := tryProvision(t, ctx1, h); err != nil {
			t.Fatal(err)
		}
	}
	if err := tryProvision(t, ctx2, c); err != nil {
		t.Fatal(err)
	}
	if a.rawStore() == nil || a.rawStore() != b.rawStore() {
		t.Errorf("same memory config, different stores: %p and %p", a.rawStore(), b.rawStore())
	}
	if a.rawStore() == c.rawStore() {
		t.Error("different max_keys, same store")
	}
}

// TestRequestRunningAcrossCleanupStillCompletes plays a reload under load:
// Caddy cleans the old config up while requests it started are still
// running (the old servers shut down without a deadline), and they must
// still record their responses. A Cleanup that dropped the handler's store
// made such requests panic after their upstream had run, leaving the key
// in flight for a retry to run again.
func TestRequestRunningAcrossCleanupStillCompletes(t *testing.T) {
	h := isolated(t, &Handler{})
	slow, release, done := holdInFlight(h, request("across-cleanup", `{}`))
	if err := h.Cleanup(); err != nil {
		t.Fatal(err)
	}
	release()
	if w := <-done; w.Code != http.StatusCreated {
		t.Fatalf("request running across Cleanup: %d", w.Code)
	}
	if w := serve(h, slow, request("across-cleanup", `{}`)); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %v, want a replay", w.Code, w.Header())
	}
	if n := slow.Calls.Load(); n != 1 {
		t.Fatalf("upstream ran %d times, want 1", n)
	}
}

// TestProvisionStoreSurvivesReload plays a config reload: Caddy provisions
// the new config before it cleans up the old one, so the memory store and
// its records carry over.
func TestProvisionStoreSurvivesReload(t *testing.T) {
	const maxKeys = "424401"
	bg := context.Background()
	key := storage.Key{Scope: "scope", ID: "reload-key"}
	fp := []byte("fingerprint")

	oldCtx, cancelOld := caddyContext(t)
	old := handlerFromJSON(t, memoryConfig(maxKeys, ""))
	if err := tryProvision(t, oldCtx, old); err != nil {
		t.Fatal(err)
	}
	res, err := old.rawStore().Reserve(bg, key, fp, time.Minute)
	if err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("Reserve = %v, %v; want acquired", res.Outcome, err)
	}
	resp := &storage.Response{Status: http.StatusCreated, Header: http.Header{"X-Order": {"42"}}, Body: []byte(`{"order":42}`)}
	if err := old.rawStore().Complete(bg, key, res.Token, resp, time.Hour); err != nil {
		t.Fatal(err)
	}

	// Reload: the new config is provisioned, then the old one cleaned up.
	newCtx, cancelNew := caddyContext(t)
	cur := handlerFromJSON(t, memoryConfig(maxKeys, `,"ttl":"2h"`))
	if err := tryProvision(t, newCtx, cur); err != nil {
		t.Fatal(err)
	}
	if cur.rawStore() != old.rawStore() {
		t.Fatal("the reloaded config got a new store")
	}
	cancelOld()
	if err := old.Cleanup(); err != nil {
		t.Fatal(err)
	}

	rec, err := cur.rawStore().Get(bg, key, true)
	if err != nil {
		t.Fatalf("Get after the old config was cleaned up: %v", err)
	}
	if rec.Response == nil || rec.Response.Status != http.StatusCreated || string(rec.Response.Body) != `{"order":42}` {
		t.Errorf("record after reload = %+v", rec)
	}
	res, err = cur.rawStore().Reserve(bg, key, fp, time.Minute)
	if err != nil || res.Outcome != storage.Replay {
		t.Errorf("Reserve after reload = %v, %v; want replay", res.Outcome, err)
	}
	res, err = cur.rawStore().Reserve(bg, storage.Key{Scope: "scope", ID: "another"}, fp, time.Minute)
	if err != nil || res.Outcome != storage.Acquired {
		t.Errorf("Reserve of a new key after reload = %v, %v; want acquired", res.Outcome, err)
	}

	// A second reload still finds the same store.
	nextCtx, cancelNext := caddyContext(t)
	next := handlerFromJSON(t, memoryConfig(maxKeys, ""))
	if err := tryProvision(t, nextCtx, next); err != nil {
		t.Fatal(err)
	}
	if next.rawStore() != cur.rawStore() {
		t.Error("the second reload got a new store")
	}

	// Once every config using it is gone, the store goes too: the next
	// config starts empty.
	cancelNew()
	cancelNext()
	freshCtx, _ := caddyContext(t)
	fresh := handlerFromJSON(t, memoryConfig(maxKeys, ""))
	if err := tryProvision(t, freshCtx, fresh); err != nil {
		t.Fatal(err)
	}
	if fresh.rawStore() == cur.rawStore() {
		t.Error("the store outlived every config that used it")
	}
	if _, err := fresh.rawStore().Get(bg, key, false); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("Get on the new store = %v, want ErrNotFound", err)
	}
}

// TestReloadKeepsTheStoreAndItsRecords provisions a second config with
// the same storage before cleaning up the first, as a reload does: the
// store (its client or pool) must survive, with its records.
func TestReloadKeepsTheStoreAndItsRecords(t *testing.T) {
	backends(t).run(func(t *testing.T, b *testStore) {
		oldCtx, cancelOld := caddyContext(t)
		old := &Handler{StorageRaw: b.config(t, 0, "")}
		if err := old.Provision(oldCtx); err != nil {
			t.Fatal(err)
		}
		up := &upstream{}
		serve(old, up, request("k", "{}"))

		next := b.handler(t, &Handler{})
		if next.rawStore() != old.rawStore() {
			t.Fatal("the reloaded config got another store")
		}
		cancelOld() // the old config is cleaned up after the new one started
		if w := serve(next, up, request("k", "{}")); w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("after the reload: %d, not replayed", w.Code)
		}
		if up.Calls.Load() != 1 {
			t.Fatalf("upstream ran %d times across the reload, want 1", up.Calls.Load())
		}
	})
}

// TestProvisionFailureHoldsNoStore checks that a handler whose Provision
// fails keeps no reference to a pooled store: when the last working
// config goes, the store goes with it.
func TestProvisionFailureHoldsNoStore(t *testing.T) {
	const maxKeys = "424501"
	bg := context.Background()
	key := storage.Key{Scope: "scope", ID: "k"}

	ctx1, cancel1 := caddyContext(t)
	good := handlerFromJSON(t, memoryConfig(maxKeys, ""))
	if err := tryProvision(t, ctx1, good); err != nil {
		t.Fatal(err)
	}
	if _, err := good.rawStore().Reserve(bg, key, []byte("fp"), time.Hour); err != nil {
		t.Fatal(err)
	}
	first := good.rawStore()

	// Same storage, invalid settings: refused before or after taking the
	// store, it must not keep it.
	for _, extra := range []string{`,"in_flight":"sometimes"`, `,"ttl":"-1s"`} {
		ctx, cancel := caddyContext(t)
		bad := handlerFromJSON(t, memoryConfig(maxKeys, extra))
		if err := tryProvision(t, ctx, bad); err == nil {
			t.Fatalf("config with %s: no error", extra)
		}
		_ = bad.Cleanup()
		cancel()
	}

	cancel1()
	ctx2, _ := caddyContext(t)
	again := handlerFromJSON(t, memoryConfig(maxKeys, ""))
	if err := tryProvision(t, ctx2, again); err != nil {
		t.Fatal(err)
	}
	if again.rawStore() == first {
		t.Fatal("after every config using it was cleaned up, the store is still pooled: a failed Provision kept a reference")
	}
	if _, err := again.rawStore().Get(bg, key, false); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("Get on the new store = %v, want ErrNotFound", err)
	}
}

// TestCompileErrorsNameTheirOption: each rule's error names the option it
// is about, which is how the Caddyfile points at that option's line
// without reading the message.
func TestCompileErrorsNameTheirOption(t *testing.T) {
	for config, option := range map[string]string{
		`{"ttl":"1ns"}`:                       "ttl",
		`{"lock_timeout":"25h"}`:              "lock_timeout",
		`{"wait_timeout":5}`:                  "wait_timeout",
		`{"max_key_length":-1}`:               "max_key_length",
		`{"max_body_size":-1}`:                "max_body_size",
		`{"max_response_size":-1}`:            "max_response_size",
		`{"scope":" "}`:                       "scope",
		`{"scope":"a\u0000b"}`:                "scope",
		`{"mode":"strict"}`:                   "mode",
		`{"errors":"json"}`:                   "errors",
		`{"key_json":"id"}`:                   "key_json",
		`{"methods":["PO ST"]}`:               "methods",
		`{"header":"A B"}`:                    "header",
		`{"fingerprint":{"headers":["X Y"]}}`: "fingerprint",
		`{"fingerprint":{"ignore":["x"]}}`:    "fingerprint",
		`{"fingerprint":{"canonical_json":false,"ignore":["/x"]}}`: "fingerprint",
		`{"replay_header":"A B"}`:                                  "replay_header",
		`{"in_flight":"sometimes"}`:                                "in_flight",
		`{"on_storage_error":"maybe"}`:                             "on_storage_error",
		`{"on_unknown_outcome":"Keep"}`:                            "on_unknown_outcome",
		`{"docs_url":"/docs"}`:                                     "docs_url",
		`{"release_on":["5xx","6xx"]}`:                             "release_on",
	} {
		_, err := handlerFromJSON(t, config).compile()
		if got := opterr.Options(err); !slices.Equal(got, []string{option}) {
			t.Errorf("%s: error %v names %q, want %s", config, err, got, option)
		}
	}
}

// TestAConfigThatDoesNotCompileHoldsNoStore: Provision compiles before it
// loads the storage module, so a refused config takes no reference to a
// pooled store that only Cleanup would give back.
func TestAConfigThatDoesNotCompileHoldsNoStore(t *testing.T) {
	ctx, _ := caddyContext(t)
	storage := `{"backend":"memory","max_keys":` + strconv.FormatInt(900_000_000+nextMaxKeys.Add(1), 10) + `}`
	bad := handlerFromJSON(t, `{"storage":`+storage+`,"release_on":["6xx"]}`)
	if err := bad.Provision(ctx); err == nil || !strings.Contains(err.Error(), "release_on") {
		t.Fatalf("Provision: %v, want the release_on error", err)
	}
	if bad.backend != nil || bad.rawStore() != nil {
		t.Fatal("a config that does not compile holds a store")
	}
	good := handlerFromJSON(t, `{"storage":`+storage+`}`)
	if err := tryProvision(t, ctx, good); err != nil {
		t.Fatal(err)
	}
	id := good.backend.(interface{ StoreID() string }).StoreID()
	handlers := 0
	for s := range backend.Live(id) {
		handlers += s.Handlers
	}
	if handlers != 1 {
		t.Errorf("the store of that storage config has %d handlers, want only the valid one", handlers)
	}
}

// TestValidateReportsTheCompileErrorOfAnUnprovisionedHandler: Validate
// does not check a provisioned handler again; one that never provisioned
// gets its compile error, or the missing store.
func TestValidateReportsTheCompileErrorOfAnUnprovisionedHandler(t *testing.T) {
	if err := handlerFromJSON(t, `{"ttl":"1ns"}`).Validate(); err == nil || !strings.Contains(err.Error(), "ttl must be at least 1s") {
		t.Errorf("Validate of an invalid handler: %v", err)
	}
	if err := new(Handler).Validate(); err == nil || !strings.Contains(err.Error(), "no storage loaded") {
		t.Errorf("Validate of an unprovisioned handler: %v", err)
	}
	if err := provision(t, new(Handler)).Validate(); err != nil {
		t.Errorf("Validate of a provisioned handler: %v", err)
	}
}

// TestProvisionLeavesTheConfigAsWritten: the defaults go into the policy
// requests run on, not into the JSON fields.
func TestProvisionLeavesTheConfigAsWritten(t *testing.T) {
	const config = `{"ttl":3600000000000,"methods":["post"],"fingerprint":{"canonical_json":false}}`
	h := provision(t, handlerFromJSON(t, config))
	out, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != config {
		t.Errorf("after Provision the config is %s, want %s", out, config)
	}
	if time.Duration(h.policy.ttl) != time.Hour || !slices.Equal(h.policy.methods, []string{"POST"}) || time.Duration(h.policy.lockTimeout) != defaultLockTimeout {
		t.Errorf("policy ttl %v, methods %q, lock_timeout %v", time.Duration(h.policy.ttl), h.policy.methods, time.Duration(h.policy.lockTimeout))
	}
}

func TestFeatureOptionChecksInJSON(t *testing.T) {
	for _, config := range []string{`{"mode":"strict"}`, `{"key_json":"id"}`, `{"fingerprint":{"canonical_json":false,"ignore":["/a"]}}`} {
		var h Handler
		if err := json.Unmarshal([]byte(config), &h); err != nil {
			t.Fatal(err)
		}
		if _, err := h.compile(); err == nil {
			t.Errorf("%s: no error", config)
		}
	}
}
