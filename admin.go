package idempotency

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI serves /idempotency/ on Caddy's admin endpoint, to look at and
// clear records. It is provisioned before any handler, so it finds the
// live stores at request time, in the pool every handler shares. It
// inherits the admin endpoint's access controls (listen address, origin
// checks, remote admin permissions), and answers errors as Caddy's own
// endpoints do (caddy.APIError: {"error": "..."}).
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
		{Pattern: "/idempotency/in_flight", Handler: caddy.AdminHandlerFunc(a.handleInFlight)},
		{Pattern: "/idempotency/outcome_unknown", Handler: caddy.AdminHandlerFunc(a.handleOutcomeUnknown)},
	}
}

// storeInfo describes a live store.
type storeInfo struct {
	ID       string    `json:"id"`
	Backend  string    `json:"backend"`
	Handlers int       `json:"handlers"`
	Ping     *pingView `json:"ping,omitempty"` // none for a store that cannot be pinged
	// Durability is what protects the store's records across a failover,
	// as the store last said (storage.DurabilityReporter); none for a
	// store that cannot tell. DurabilityError says why it cannot keep
	// records where it is connected, or did not answer.
	Durability      any    `json:"durability,omitempty"`
	DurabilityError string `json:"durability_error,omitempty"`
	// DurabilityAt is when the store said so: they are asked only after a
	// ping it answered, so while it is down they are older than the ping.
	DurabilityAt *time.Time `json:"durability_at,omitempty"`
}

// pingView is a store's last ping as the admin API shows it.
type pingView struct {
	OK     bool      `json:"ok"`
	At     time.Time `json:"at"`
	TookMS float64   `json:"took_ms"`
	Error  string    `json:"error,omitempty"`
}

// adminPingTimeout bounds the pings of GET /idempotency/stores.
const adminPingTimeout = 2 * time.Second

// handleStores lists the live stores: GET /idempotency/stores. Each
// store that can be pinged is pinged now, and asked what protects its
// records across a failover (all at once, each for at most
// adminPingTimeout), unless ping=false asks for the last answers only.
func (adminAPI) handleStores(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return apiError(http.StatusMethodNotAllowed, "use GET")
	}
	live := slices.Collect(backend.Live(""))
	if r.URL.Query().Get("ping") != "false" {
		ctx, cancel := context.WithTimeout(r.Context(), adminPingTimeout)
		defer cancel()
		var wg sync.WaitGroup
		for _, s := range live {
			wg.Go(func() {
				if s.Ping(ctx).Err == nil {
					s.Durability(ctx)
				}
			})
		}
		wg.Wait()
	}
	list := []storeInfo{}
	for _, s := range live {
		info := storeInfo{ID: s.ID, Backend: s.Backend, Handlers: s.Handlers}
		if p := s.LastPing(); !p.At.IsZero() {
			info.Ping = &pingView{OK: p.Err == nil, At: p.At.UTC(), TookMS: float64(p.Took.Microseconds()) / 1000}
			if p.Err != nil {
				info.Ping.Error = p.Err.Error()
			}
		}
		if d := s.LastDurability(); !d.At.IsZero() {
			at := d.At.UTC()
			info.Durability, info.DurabilityAt = d.Facts, &at
			if d.Err != nil {
				info.DurabilityError = d.Err.Error()
			}
		}
		list = append(list, info)
	}
	return writeJSON(w, list)
}

// The bounds of a page of GET /idempotency/in_flight and
// /idempotency/outcome_unknown.
const (
	defaultInFlightPage = 100
	maxInFlightPage     = 1000
)

// inFlightPage is one store's page of records in flight (or of
// outcome-unknown records).
type inFlightPage struct {
	Store   string       `json:"store"`
	Backend string       `json:"backend"`
	Records []recordView `json:"records"`
	// Next is the after of the next page; empty after the last.
	Next string `json:"next,omitempty"`
}

// handleInFlight lists the records in flight, per store, a page at a
// time: GET /idempotency/in_flight[?store=<id>][&after=<key_hash>][&limit=<n>].
// after needs store: each store pages on its own.
func (adminAPI) handleInFlight(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return apiError(http.StatusMethodNotAllowed, "use GET")
	}
	return listPages(w, r, (*instrumentedStore).ListInFlight)
}

// handleOutcomeUnknown lists the records whose outcome is unknown (GET,
// as /idempotency/in_flight pages), or releases those of one key (DELETE
// ?key_hash=<16 hex digits>[&store=<id>]): only an outcome-unknown record
// is deleted, never one in flight or one that holds a response, so that
// the key's next request runs. An operator releases a key once the
// operation is reconciled: known to have happened (then the client needs
// a new key for another one) or known not to have.
func (adminAPI) handleOutcomeUnknown(w http.ResponseWriter, r *http.Request) error {
	switch r.Method {
	case http.MethodGet:
		return listPages(w, r, (*instrumentedStore).ListOutcomeUnknown)
	case http.MethodDelete:
		return releaseOutcomeUnknown(w, r)
	}
	return apiError(http.StatusMethodNotAllowed, "use GET or DELETE")
}

// releaseOutcomeUnknown is DELETE /idempotency/outcome_unknown.
func releaseOutcomeUnknown(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	for k := range q {
		if k != "key_hash" && k != "store" {
			return apiError(http.StatusBadRequest, fmt.Sprintf("unknown parameter %q: give key_hash, and store", k))
		}
	}
	kh := strings.ToLower(q.Get("key_hash"))
	if b, err := hex.DecodeString(kh); err != nil || len(b) != storage.HashLen/2 {
		return apiError(http.StatusBadRequest, fmt.Sprintf("key_hash must be %d hex digits, as logged", storage.HashLen))
	}
	targets := liveStores(q.Get("store"))
	if len(targets) == 0 {
		if q.Get("store") != "" {
			return apiError(http.StatusNotFound, fmt.Sprintf("no live store %q (see /idempotency/stores)", q.Get("store")))
		}
		return apiError(http.StatusNotFound, "no idempotency store is in use")
	}
	type released struct {
		Store    string `json:"store"`
		Backend  string `json:"backend"`
		Released int    `json:"released"`
	}
	answer := struct {
		KeyHash string     `json:"key_hash"`
		Stores  []released `json:"stores"`
	}{KeyHash: kh, Stores: []released{}}
	total := 0
	for _, t := range targets {
		n, err := t.store.ReleaseOutcomeUnknown(r.Context(), kh)
		if err != nil {
			return apiError(http.StatusBadGateway, fmt.Sprintf("store %s: %v", t.id, err))
		}
		if n > 0 {
			answer.Stores = append(answer.Stores, released{Store: t.id, Backend: t.backend, Released: n})
			total += n
		}
	}
	if total == 0 {
		return apiError(http.StatusNotFound, "no outcome-unknown record for this key_hash")
	}
	return writeJSON(w, answer)
}

// listPages answers a listing of each store's records (list), a page at
// a time: ?store=<id>, &after=<key_hash> (needs store: each store pages
// on its own), &limit=<n>.
func listPages(w http.ResponseWriter, r *http.Request, list func(s *instrumentedStore, ctx context.Context, after string, limit int) ([]storage.HashedRecord, error)) error {
	q := r.URL.Query()
	limit := defaultInFlightPage
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxInFlightPage {
			return apiError(http.StatusBadRequest, fmt.Sprintf("limit must be 1 to %d", maxInFlightPage))
		}
		limit = n
	}
	after := strings.ToLower(q.Get("after"))
	if after != "" {
		if b, err := hex.DecodeString(after); err != nil || len(b) != storage.HashLen/2 {
			return apiError(http.StatusBadRequest, fmt.Sprintf("after must be a key_hash (%d hex digits)", storage.HashLen))
		}
		if q.Get("store") == "" {
			return apiError(http.StatusBadRequest, "after needs store: each store pages on its own")
		}
	}
	targets := liveStores(q.Get("store"))
	if len(targets) == 0 && q.Get("store") != "" {
		return apiError(http.StatusNotFound, fmt.Sprintf("no live store %q (see /idempotency/stores)", q.Get("store")))
	}
	pages := []inFlightPage{}
	for _, t := range targets {
		recs, err := list(t.store, r.Context(), after, limit)
		if err != nil {
			return apiError(http.StatusBadGateway, fmt.Sprintf("store %s: %v", t.id, err))
		}
		page := inFlightPage{Store: t.id, Backend: t.backend, Records: make([]recordView, 0, len(recs))}
		for _, rec := range recs {
			page.Records = append(page.Records, viewOf(t.id, rec.KeyHash, rec.Record, false))
		}
		if len(recs) == limit {
			page.Next = recs[len(recs)-1].KeyHash
		}
		pages = append(pages, page)
	}
	return writeJSON(w, map[string]any{"stores": pages})
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
	// OutcomeUnknown: the key's request failed before any status after it
	// may have reached the upstream; Status is what its client got.
	OutcomeUnknown bool   `json:"outcome_unknown,omitempty"`
	BodyBytes      *int   `json:"body_bytes,omitempty"`
	Body           string `json:"body,omitempty"` // base64, only with body=true
}

// keysAnswer is what GET and DELETE /idempotency/keys answer.
type keysAnswer struct {
	Records []recordView `json:"records"`
	Deleted bool         `json:"deleted"`
}

// handleKeys shows (GET) or deletes (DELETE) the records of one key,
// named by the key_hash of the module's logs and placeholders alone, or
// by the key and the client's scope:
//
//	/idempotency/keys?key_hash=<16 hex digits>[&store=<id>][&body=true]
//	/idempotency/keys?key=<key>&scope_hash=<hex sha-256 of the scope>
//	/idempotency/keys?key=<key>&scope=<value>...[&scope_template=<template>]
//
// scope gives the value of each placeholder of the scope template (the
// handler's scope option, by default defaultScope), in order; they are
// encoded and hashed exactly as the handler does (scopeTemplate). Without
// store, every live store is searched.
func (adminAPI) handleKeys(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet && r.Method != http.MethodDelete {
		return apiError(http.StatusMethodNotAllowed, "use GET or DELETE")
	}
	q := r.URL.Query()
	find, err := finderOf(q)
	if err != nil {
		return apiError(http.StatusBadRequest, err.Error())
	}
	targets := liveStores(q.Get("store"))
	if len(targets) == 0 {
		if q.Get("store") != "" {
			return apiError(http.StatusNotFound, fmt.Sprintf("no live store %q (see /idempotency/stores)", q.Get("store")))
		}
		return apiError(http.StatusNotFound, "no idempotency store is in use")
	}
	withBody, _ := strconv.ParseBool(q.Get("body"))
	del := r.Method == http.MethodDelete
	answer := keysAnswer{Records: []recordView{}, Deleted: del}
	for _, t := range targets {
		recs, err := find(r, t, withBody && !del, del)
		if err != nil {
			return apiError(http.StatusBadGateway, fmt.Sprintf("store %s: %v", t.id, err))
		}
		for _, rec := range recs {
			answer.Records = append(answer.Records, viewOf(t.id, rec.hash, rec.Record, withBody && !del))
		}
	}
	if len(answer.Records) == 0 {
		return apiError(http.StatusNotFound, "no live record for this key")
	}
	return writeJSON(w, answer)
}

// foundRecord is a record and its key's hash.
type foundRecord struct {
	*storage.Record
	hash string
}

// finder looks records up in one store, deleting them with del.
type finder func(r *http.Request, t liveStore, withBody, del bool) ([]foundRecord, error)

// finderOf reads how the query names the records.
func finderOf(q map[string][]string) (finder, error) {
	get := func(k string) string {
		if v := q[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	_, hasScope := q["scope"]
	_, hasTemplate := q["scope_template"]
	if kh := strings.ToLower(get("key_hash")); kh != "" {
		if get("key") != "" || hasScope || hasTemplate || get("scope_hash") != "" {
			return nil, errors.New("give key_hash alone, or key with scope or scope_hash")
		}
		if b, err := hex.DecodeString(kh); err != nil || len(b) != storage.HashLen/2 {
			return nil, fmt.Errorf("key_hash must be %d hex digits, as logged", storage.HashLen)
		}
		return func(r *http.Request, t liveStore, withBody, del bool) ([]foundRecord, error) {
			return t.byHash(r, kh, withBody, del)
		}, nil
	}
	key, err := adminKey(get("key"), q["scope"], get("scope_template"), get("scope_hash"), hasScope || hasTemplate)
	if err != nil {
		return nil, err
	}
	return func(r *http.Request, t liveStore, withBody, del bool) ([]foundRecord, error) {
		rec, err := t.store.Get(r.Context(), key, withBody)
		if err == nil && del {
			err = t.store.Delete(r.Context(), key)
		}
		if errors.Is(err, storage.ErrNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		return []foundRecord{{rec, key.Hash()}}, nil
	}, nil
}

// adminKey builds the store key from the query: the key, and the scope
// as the values of the template's placeholders or as its hash.
func adminKey(id string, scope []string, template, scopeHash string, hasScope bool) (storage.Key, error) {
	if id == "" {
		return storage.Key{}, errors.New("give key_hash (as logged), or key with scope or scope_hash")
	}
	switch {
	case hasScope && scopeHash != "":
		return storage.Key{}, errors.New("give scope (and scope_template) or scope_hash, not both")
	case hasScope:
		hash, err := adminScopeHash(template, scope)
		if err != nil {
			return storage.Key{}, err
		}
		return storage.Key{Scope: hash, ID: id}, nil
	case scopeHash != "":
		if b, err := hex.DecodeString(scopeHash); err != nil || len(b) != 32 {
			return storage.Key{}, errors.New("scope_hash must be 64 hex digits")
		}
		return storage.Key{Scope: strings.ToLower(scopeHash), ID: id}, nil
	}
	return storage.Key{}, errors.New("the scope or scope_hash query parameter is required with key")
}

// adminScopeHash returns the scope hash the handler computes for a client
// whose values of the placeholders of template (defaultScope when empty)
// are values, in order: the template is evaluated by the handler's own
// code, so that values are escaped or length-prefixed as there. With the
// default template a single value may also be the evaluated scope, host
// and Authorization: a host holds no space, so the first space parts them.
func adminScopeHash(template string, values []string) (string, error) {
	if template == "" {
		template = defaultScope
	}
	t, err := newScopeTemplate(template)
	if err != nil {
		return "", fmt.Errorf("scope_template: %v", err)
	}
	if template == defaultScope && len(values) == 1 {
		host, auth, ok := strings.Cut(values[0], " ")
		if !ok {
			return "", errors.New("give scope twice, the host (without port) and the Authorization value, or once as the two separated by a space")
		}
		values = []string{host, auth}
	}
	if len(values) != len(t.keys) {
		names := make([]string, len(t.keys))
		for i, k := range t.keys {
			names[i] = "{" + k + "}"
		}
		return "", fmt.Errorf("the scope template %q has %d placeholders (%s): give scope once for each, in that order; %d given",
			template, len(t.keys), strings.Join(names, " "), len(values))
	}
	repl := caddy.NewEmptyReplacer()
	for i, k := range t.keys {
		if prev, ok := repl.GetString(k); ok && prev != values[i] {
			return "", fmt.Errorf("the placeholder {%s} is used twice in the scope template: give it the same value both times", k)
		}
		repl.Set(k, values[i])
	}
	hash, _, ok := t.hash(repl, nil, "")
	if !ok {
		return "", errors.New("this scope is blank: the handler refuses such requests (400), so no record has it")
	}
	return hash, nil
}

// liveStore is a store of the pool, observed as the handlers' stores
// are, so that the admin API's calls show in the latency histogram and in
// traces.
type liveStore struct {
	id, backend string
	store       *instrumentedStore
}

// byHash finds (and with del deletes) the records whose key hash is kh;
// nothing in a store that cannot look records up by key hash.
func (t liveStore) byHash(r *http.Request, kh string, withBody, del bool) ([]foundRecord, error) {
	recs, err := t.store.GetByHash(r.Context(), kh, withBody)
	if err == nil && del && len(recs) > 0 {
		_, err = t.store.DeleteByHash(r.Context(), kh)
	}
	if err != nil {
		return nil, err
	}
	out := make([]foundRecord, len(recs))
	for i, rec := range recs {
		out[i] = foundRecord{rec, kh}
	}
	return out, nil
}

// liveStores returns the live store with that id, or all of them, by id:
// every backend's that keeps its store in the pool (backend.Pooled).
func liveStores(id string) []liveStore {
	var out []liveStore
	for s := range backend.Live(id) {
		out = append(out, liveStore{id: s.ID, backend: s.Backend, store: instrument(s.Store, s.Backend, nil)})
	}
	return out
}

func viewOf(storeID, keyHash string, rec *storage.Record, withBody bool) recordView {
	v := recordView{
		Store:       storeID,
		KeyHash:     keyHash,
		State:       rec.State.String(),
		Fingerprint: hex.EncodeToString(rec.Fingerprint),
		CreatedAt:   rec.CreatedAt.UTC(),
		ExpiresAt:   rec.ExpiresAt.UTC(),
	}
	if resp := rec.Response; resp != nil {
		v.Status, v.Header, v.BodyOmitted, v.OutcomeUnknown = resp.Status, resp.Header, resp.BodyOmitted, resp.OutcomeUnknown
		if withBody {
			n := len(resp.Body)
			v.BodyBytes = &n
			v.Body = base64.StdEncoding.EncodeToString(resp.Body)
		}
	}
	return v
}

func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(v)
}

// apiError is an admin API error as Caddy's admin endpoint renders it.
func apiError(status int, msg string) error {
	return caddy.APIError{HTTPStatus: status, Err: errors.New(msg)}
}

// Interface guard
var _ caddy.AdminRouter = (*adminAPI)(nil)
