package idempotency

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI serves /idempotency/ on Caddy's admin endpoint, to look at and
// clear records. It is provisioned before any handler, so it finds the
// live stores at request time, in the pool every handler shares. It
// inherits the admin endpoint's access controls (listen address, origin
// checks, remote admin permissions).
type adminAPI struct{}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.idempotency",
		New: func() caddy.Module { return new(adminAPI) },
	}
}

// Routes implements caddy.AdminRouter.
func (a adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/idempotency/stores", Handler: caddy.AdminHandlerFunc(a.handleStores)},
		{Pattern: "/idempotency/keys", Handler: caddy.AdminHandlerFunc(a.handleKeys)},
	}
}

// storeInfo describes a live store.
type storeInfo struct {
	ID       string `json:"id"`
	Backend  string `json:"backend"`
	Handlers int    `json:"handlers"`
}

// handleStores lists the live stores: GET /idempotency/stores.
func (adminAPI) handleStores(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return adminProblem(w, http.StatusMethodNotAllowed, "use GET")
	}
	return writeJSON(w, http.StatusOK, liveStores())
}

func liveStores() []storeInfo {
	list := []storeInfo{}
	stores.Range(func(k, v any) bool {
		id := k.(string)
		refs, _ := stores.References(id)
		list = append(list, storeInfo{ID: id, Backend: v.(*pooledStore).backend, Handlers: refs})
		return true
	})
	slices.SortFunc(list, func(a, b storeInfo) int { return strings.Compare(a.ID, b.ID) })
	return list
}

// recordView is a record as the admin API shows it.
type recordView struct {
	Store       string      `json:"store"`
	KeyHash     string      `json:"key_hash"`
	State       string      `json:"state"`
	Fingerprint string      `json:"fingerprint"`
	CreatedAt   time.Time   `json:"created_at"`
	ExpiresAt   time.Time   `json:"expires_at"`
	Status      int         `json:"status,omitempty"`
	Header      http.Header `json:"headers,omitempty"`
	BodyOmitted bool        `json:"body_omitted,omitempty"`
	BodyBytes   *int        `json:"body_bytes,omitempty"`
	Body        string      `json:"body,omitempty"` // base64, only with body=true
}

// handleKeys shows (GET) or deletes (DELETE) the record of one key:
//
//	/idempotency/keys?key=<key>&scope=<scope value>[&store=<id>][&body=true]
//	/idempotency/keys?key=<key>&scope_hash=<hex sha-256 of the scope>
//
// scope is the evaluated scope template (e.g. "api.example.com Bearer
// abc"); it is hashed here exactly as the handler hashes it. Without
// store, every live store is searched.
func (adminAPI) handleKeys(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet && r.Method != http.MethodDelete {
		return adminProblem(w, http.StatusMethodNotAllowed, "use GET or DELETE")
	}
	q := r.URL.Query()
	key, err := adminKey(q.Get("key"), q.Get("scope"), q.Get("scope_hash"), q.Has("scope"))
	if err != nil {
		return adminProblem(w, http.StatusBadRequest, err.Error())
	}
	withBody, _ := strconv.ParseBool(q.Get("body"))
	targets, err := storesNamed(q.Get("store"))
	if err != nil {
		return adminProblem(w, http.StatusNotFound, err.Error())
	}

	var found []recordView
	for _, t := range targets {
		var rec *storage.Record
		if r.Method == http.MethodDelete {
			rec, err = t.store.Get(r.Context(), key, false)
			if err == nil {
				err = t.store.Delete(r.Context(), key)
			}
		} else {
			rec, err = t.store.Get(r.Context(), key, withBody)
		}
		switch {
		case errors.Is(err, storage.ErrNotFound):
			continue
		case err != nil:
			return adminProblem(w, http.StatusBadGateway, fmt.Sprintf("store %s: %v", t.id, err))
		}
		found = append(found, viewOf(t.id, key, rec, withBody))
	}
	if len(found) == 0 {
		return adminProblem(w, http.StatusNotFound, "no live record for this key and scope")
	}
	return writeJSON(w, http.StatusOK, map[string]any{"records": found, "deleted": r.Method == http.MethodDelete})
}

// adminKey builds the store key from the query.
func adminKey(id, scope, scopeHash string, hasScope bool) (storage.Key, error) {
	if id == "" {
		return storage.Key{}, errors.New("the key query parameter is required")
	}
	switch {
	case hasScope && scopeHash != "":
		return storage.Key{}, errors.New("give scope or scope_hash, not both")
	case hasScope:
		return storage.Key{Scope: hashHex(scope), ID: id}, nil
	case scopeHash != "":
		if b, err := hex.DecodeString(scopeHash); err != nil || len(b) != 32 {
			return storage.Key{}, errors.New("scope_hash must be 64 hex digits")
		}
		return storage.Key{Scope: strings.ToLower(scopeHash), ID: id}, nil
	}
	return storage.Key{}, errors.New("the scope or scope_hash query parameter is required")
}

type namedStore struct {
	id    string
	store storage.Store
}

// storesNamed returns the live store with that id, or all of them.
func storesNamed(id string) ([]namedStore, error) {
	var out []namedStore
	stores.Range(func(k, v any) bool {
		if id == "" || k.(string) == id {
			out = append(out, namedStore{id: k.(string), store: v.(*pooledStore).Store})
		}
		return true
	})
	if len(out) == 0 {
		if id != "" {
			return nil, fmt.Errorf("no live store %q (see /idempotency/stores)", id)
		}
		return nil, errors.New("no idempotency store is in use")
	}
	slices.SortFunc(out, func(a, b namedStore) int { return strings.Compare(a.id, b.id) })
	return out, nil
}

func viewOf(storeID string, key storage.Key, rec *storage.Record, withBody bool) recordView {
	v := recordView{
		Store:       storeID,
		KeyHash:     key.Hash(),
		State:       rec.State.String(),
		Fingerprint: hex.EncodeToString(rec.Fingerprint),
		CreatedAt:   rec.CreatedAt.UTC(),
		ExpiresAt:   rec.ExpiresAt.UTC(),
	}
	if resp := rec.Response; resp != nil {
		v.Status, v.Header, v.BodyOmitted = resp.Status, resp.Header, resp.BodyOmitted
		if withBody {
			n := len(resp.Body)
			v.BodyBytes = &n
			v.Body = base64.StdEncoding.EncodeToString(resp.Body)
		}
	}
	return v
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}

// adminProblem answers an admin request with an RFC 9457 problem.
func adminProblem(w http.ResponseWriter, status int, detail string) error {
	body, _ := json.Marshal(problemBody{
		Type:   "about:blank",
		Title:  http.StatusText(status),
		Status: status,
		Detail: detail,
	})
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_, err := w.Write(body)
	return err
}

// Interface guard
var _ caddy.AdminRouter = (*adminAPI)(nil)
