package idempotency

import (
	"encoding/json"
	"go/parser"
	"go/token"
	"io/fs"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
	_ "github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testbackend"
	"github.com/caddy-idempotency/caddy-idempotency/storage/storagetest"
)

// TestANewBackendIsOneShortModule loads internal/testkit/testbackend, a backend
// written as a third party writes one (its own package, the public kit in
// package backend only), from the Caddyfile and from JSON: it is pooled
// across handlers, requests hold its store, the handler replays through
// it, and the admin API finds its records.
func TestANewBackendIsOneShortModule(t *testing.T) {
	h := new(Handler)
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("idempotency {\n\tstorage testfake {\n\t\tcapacity 100000\n\t}\n}")); err != nil {
		t.Fatal(err)
	}
	if got := string(h.StorageRaw); got != `{"backend":"testfake","capacity":100000}` {
		t.Fatalf("storage JSON %s", got)
	}
	for _, block := range []string{"capacity -1", "capacty 5"} {
		bad := new(Handler)
		err := bad.UnmarshalCaddyfile(caddyfile.NewTestDispenser("idempotency {\n\tstorage testfake {\n\t\t" + block + "\n\t}\n}"))
		if err == nil || !strings.Contains(err.Error(), "capacity") || !strings.Contains(err.Error(), "Testfile:3") {
			t.Errorf("storage testfake { %s }: %v, want the backend's error at its line", block, err)
		}
	}
	h = provision(t, h)
	if h.backendName != "testfake" {
		t.Fatalf("backend %q", h.backendName)
	}
	if _, ok := h.backend.(backend.Holder); !ok {
		t.Fatal("the pooled backend does not let requests hold its store")
	}
	up := &upstream{}
	serve(h, up, request("k", "{}"))
	if w := serve(h, up, request("k", "{}")); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" || up.Calls.Load() != 1 {
		t.Fatalf("replay through the new backend: %d, upstream ran %d times", w.Code, up.Calls.Load())
	}

	// The admin API lists the store and finds the record in it.
	id := storeID(t, h)
	code, body := adminCall(t, http.MethodGet, keysPath("k", []string{"example.com", ""}, "&store="+url.QueryEscape(id)))
	if code != http.StatusOK || len(body["records"].([]any)) != 1 || body["records"].([]any)[0].(map[string]any)["state"] != "completed" {
		t.Fatalf("admin GET of the new backend's record: %d %v", code, body)
	}

	storagetest.Run(t, h.rawStore())

	// The same JSON config loads it too, and shares the store.
	j := provision(t, &Handler{StorageRaw: json.RawMessage(`{"backend":"testfake","capacity":100000}`)})
	if j.rawStore() != h.rawStore() {
		t.Error("two handlers with one testfake configuration have two stores")
	}
}

// TestANewBackendNeedsNothingInternal: the backend written as a third
// party writes one, and each built-in backend, imports the module's
// public packages only (a backend in another module cannot import
// internal/), its Caddyfile parsing included: the built-ins need nothing
// a third party cannot have. The third party's tests too: they run
// backendtest.Run with public packages only.
func TestANewBackendNeedsNothingInternal(t *testing.T) {
	thirdPartyTests, err := filepath.Glob("internal/testkit/testbackend/*_test.go")
	if err != nil || len(thirdPartyTests) == 0 {
		t.Fatalf("the tests of the third party's backend: %v %v", thirdPartyTests, err)
	}
	for _, dir := range []string{"internal/testkit/testbackend", "backend/memory", "backend/redis", "backend/postgres"} {
		files := productionFiles(t, dir)
		if dir == "internal/testkit/testbackend" {
			files = append(files, thirdPartyTests...)
		}
		for _, f := range files {
			for _, imp := range importsOf(t, f) {
				if strings.Contains(imp, "/internal/") {
					t.Errorf("%s imports %s", f, imp)
				}
			}
		}
	}
}

// TestStorageImportsNoBackend: the stores are plain Go libraries, usable
// without Caddy: nothing under storage/ (its tests included) imports the
// backend kit, which is Caddy's side, or Caddy itself.
func TestStorageImportsNoBackend(t *testing.T) {
	checked := 0
	err := filepath.WalkDir("storage", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		checked++
		for _, imp := range importsOf(t, path) {
			if strings.HasPrefix(imp, "github.com/caddy-idempotency/caddy-idempotency/backend") || strings.HasPrefix(imp, "github.com/caddyserver/") {
				t.Errorf("%s imports %s", path, imp)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("checked %d files, want every file under storage/", checked)
	}
}

// productionFiles returns the Go files of dir that are not tests; at
// least one.
func productionFiles(t *testing.T, dir string) []string {
	t.Helper()
	all, err := filepath.Glob(filepath.Join(dir, "*.go"))
	var files []string
	for _, f := range all {
		if !strings.HasSuffix(f, "_test.go") {
			files = append(files, f)
		}
	}
	if err != nil || len(files) == 0 {
		t.Fatalf("the production files of %s: %v %v", dir, files, err)
	}
	return files
}

// importsOf returns the import paths of the Go file f.
func importsOf(t *testing.T, f string) []string {
	t.Helper()
	parsed, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, imp := range parsed.Imports {
		out = append(out, strings.Trim(imp.Path.Value, `"`))
	}
	return out
}

// TestProductionCodeImportsNoTestMachinery: what Caddy runs (the
// handler, the backends, the stores, fingerprint, internal/ but its
// testkit) never imports internal/testkit, which is test machinery only;
// the public test kits (backend/backendtest, storage/storagetest) may.
func TestProductionCodeImportsNoTestMachinery(t *testing.T) {
	testKits := map[string]bool{"internal/testkit": true, "backend/backendtest": true, "storage/storagetest": true}
	checked := 0
	for _, root := range []string{".", "backend", "storage", "fingerprint", "internal", "cmd/caddy"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			switch {
			case err != nil:
				return err
			case d.IsDir() && (testKits[path] || root == "." && path != "."):
				return filepath.SkipDir // the root's own files only; the other trees have their walk
			case d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go"):
				return nil
			}
			parsed, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
			if err != nil {
				return err
			}
			checked++
			for _, imp := range parsed.Imports {
				if strings.Contains(imp.Path.Value, "/internal/testkit") {
					t.Errorf("%s imports %s", path, imp.Path.Value)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if checked < 50 {
		t.Fatalf("checked %d files, want the module's production code", checked)
	}
}
