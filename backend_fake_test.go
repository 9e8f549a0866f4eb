package idempotency

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/memory"
	"github.com/caddy-idempotency/caddy-idempotency/storage/storagetest"
)

// fakeStorage is a storage backend added the way CONTRIBUTING.md says a
// new one is: this short module, over a store that passes storagetest.Run
// (here the memory store stands in for the new package).
type fakeStorage struct {
	// Capacity is an option of the new backend's own.
	Capacity int `json:"capacity,omitempty"`

	pooledBackend
}

func init() { caddy.RegisterModule(fakeStorage{}) }

func (fakeStorage) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.idempotency.storage.testfake",
		New: func() caddy.Module { return new(fakeStorage) },
	}
}

func (f *fakeStorage) Provision(ctx caddy.Context) error {
	return f.acquire(ctx.Logger(), "testfake", f, "this process", func() (storage.Store, error) {
		return memory.New(memory.Options{MaxKeys: f.Capacity}), nil
	})
}

func (f *fakeStorage) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if err := noArgs(d); err != nil {
		return err
	}
	return eachOption(d, "testfake storage ", nil, func(opt string) error {
		if opt != "capacity" {
			return d.Errf("unrecognized testfake storage option '%s'", opt)
		}
		return intArg(d, &f.Capacity)
	}, nil)
}

func TestANewBackendIsOneShortModule(t *testing.T) {
	h := new(Handler)
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("idempotency {\n\tstorage testfake {\n\t\tcapacity 100000\n\t}\n}")); err != nil {
		t.Fatal(err)
	}
	if got := string(h.StorageRaw); got != `{"backend":"testfake","capacity":100000}` {
		t.Fatalf("storage JSON %s", got)
	}
	h = provision(t, h)
	if h.backendName != "testfake" {
		t.Fatalf("backend %q", h.backendName)
	}
	if _, ok := h.backend.(StoreHolder); !ok {
		t.Fatal("the pooled backend does not let requests hold its store")
	}
	up := &upstream{}
	serve(h, up, request("k", "{}"))
	if w := serve(h, up, request("k", "{}")); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" || up.calls.Load() != 1 {
		t.Fatalf("replay through the new backend: %d, upstream ran %d times", w.Code, up.calls.Load())
	}
	storagetest.Run(t, h.store)

	// The same JSON config loads it too.
	j := provision(t, &Handler{StorageRaw: json.RawMessage(`{"backend":"testfake","capacity":100000}`)})
	if j.store != h.store {
		t.Error("two handlers with one testfake configuration have two stores")
	}
}

var _ StorageBackend = (*fakeStorage)(nil)
