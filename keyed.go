package idempotency

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/fingerprint"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// keyedRequest is a request whose key, scope, body and fingerprint are
// known: everything the store is asked with. Done releases what it holds.
type keyedRequest struct {
	key    storage.Key
	hash   string // key.Hash(), once there is a key
	path   string // the escaped path, as fingerprinted
	fp     []byte
	sum    [fingerprint.Size]byte // fp's storage
	body   *bufferedBody
	unhold func()

	// canonical is the canonical JSON the fingerprint hashed, when it
	// encoded the body, for the detail of a new key (nil otherwise); its
	// buffer is pooled.
	canonical []byte
	canonBuf  *[]byte

	bodyStore bufferedBody // what body points to
}

func (k *keyedRequest) done() {
	k.body.Close()
	k.unhold()
	if k.canonBuf != nil {
		if cap(*k.canonBuf) <= maxPooledBody {
			canonPool.Put(k.canonBuf)
		}
		k.canonBuf, k.canonical = nil, nil
	}
}

// canonPool holds the buffers of keyedRequest.canonical.
var canonPool = sync.Pool{New: func() any { return new([]byte) }}

// refusal is why a request cannot be keyed: what happened, not how it
// is answered (answer.go's refusalAnswer says that, with the other rows of
// the answer table).
type refusal struct {
	why  refused
	err  error  // keyMalformed, keyAmbiguous: what the parser said; bodyUnreadable: the read error
	what string // keyJSONInvalid: what is wrong with the key at key_json
}

// refused is a reason a request cannot be keyed.
type refused uint8

const (
	noKey          refused = iota + 1 // no key header, and none at key_json
	keyMalformed                      // the key header is not a key
	noScope                           // the scope is blank: no client identity
	storeClosed                       // the handler's store closed as the request arrived (a reload)
	bodyTooLarge                      // the body is over max_body_size
	bodyUnreadable                    // the body could not be read
	keyAmbiguous                      // a member twice on the way to key_json
	keyJSONInvalid                    // the value at key_json is not a key
	bodyNotJSON                       // a body declared as JSON is not JSON
)

// refusedNoKey is the refusal of a request without a key (the usual one:
// a request that passes).
var refusedNoKey = &refusal{why: noKey}

// keyRequest finds the request's key, scope and body and fingerprints it,
// holding the store from before the body is read. The key comes from the
// key header, or from the JSON body with key_json. Once it has a key, an
// enforcing handler sets the request's key hash, marking the request as
// taken for inner handlers; an observing one never does (it must not
// switch off an enforcing handler nested in it).
//
// Once the body has been read, k is returned whatever the refusal, and
// its done must be called when the request is over: a request that goes
// on (no key found in the body, observe mode) reads its body from k.
// The keyed request is made in into (the exchange's own, one allocation
// for both).
func (h *Handler) keyRequest(into *keyedRequest, r *http.Request, repl *caddy.Replacer) (k *keyedRequest, ref *refusal) {
	values := r.Header[h.policy.headerKey]
	if len(values) == 0 && h.policy.keyJSON == nil {
		return nil, refusedNoKey
	}
	var id string
	if len(values) > 0 {
		var err error
		if id, err = fingerprint.ParseKey(values, h.policy.maxKeyLength); err != nil {
			return nil, &refusal{why: keyMalformed, err: err}
		}
	}
	scope, ok := h.policy.scope.hash(repl, r, h.policy.mode.traits().scopePrefix)
	if !ok {
		return nil, &refusal{why: noScope}
	}
	// Hold the store before reading the body: a reload that replaces the
	// storage config while a slow client uploads must not close it under
	// the request.
	unhold, ok := h.keeper.store.hold()
	if !ok {
		return nil, &refusal{why: storeClosed}
	}
	body, err := readBody(r, h.policy.maxBodySize, &into.bodyStore)
	if err != nil {
		unhold()
		if errors.Is(err, errBodyTooLarge) {
			return nil, &refusal{why: bodyTooLarge}
		}
		return nil, &refusal{why: bodyUnreadable, err: err}
	}
	k = into
	k.body, k.unhold = body, unhold
	if id == "" {
		if id, ref = h.keyFromBody(body.Bytes()); ref != nil {
			return k, ref
		}
	}
	k.key = storage.Key{Scope: scope, ID: id}
	k.hash = k.key.Hash()
	repl.Set(h.policy.mode.traits().keyHash, k.hash)

	k.path = r.URL.EscapedPath()
	k.canonBuf = canonPool.Get().(*[]byte)
	fp, canon, canonical := h.policy.fingerprint.SumJSONCanonical(k.sum[:0], (*k.canonBuf)[:0], r.Method, k.path, r.URL.RawQuery, r.Header, body.Bytes())
	*k.canonBuf = canon
	if len(canon) > 0 {
		k.canonical = canon
	}
	if !canonical && h.policy.fingerprint.CanonicalJSON() && body.Len() > 0 && fingerprint.DeclaresJSON(r.Header) && !json.Valid(body.Bytes()) {
		// A body that says it is JSON and is not cannot be compared by
		// meaning, and no JSON upstream can act on it: refuse it here,
		// before anything is stored.
		return k, &refusal{why: bodyNotJSON}
	}
	k.fp = fp
	return k, nil
}

// keyFromBody finds the key at key_json in a JSON body: a string under the
// key syntax, or an integer as its decimal text. A body that is not JSON,
// or has no member there (or null), has no key.
func (h *Handler) keyFromBody(body []byte) (string, *refusal) {
	v, found, err := h.policy.keyJSON.Lookup(body)
	if errors.Is(err, fingerprint.ErrDuplicateMember) {
		// Parsers disagree on which of two members counts: the upstream
		// could act on another key than the one recorded.
		return "", &refusal{why: keyAmbiguous, err: err}
	}
	if err != nil || !found || string(v) == "null" {
		return "", refusedNoKey
	}
	invalid := func(what string) *refusal { return &refusal{why: keyJSONInvalid, what: what} }
	switch {
	case v[0] == '"':
		var s string
		if json.Unmarshal(v, &s) != nil {
			return "", invalid("is not a valid JSON string")
		}
		id, err := fingerprint.ParseKey([]string{s}, h.policy.maxKeyLength)
		if err != nil || strings.ContainsRune(s, '"') {
			return "", invalid("must be visible ASCII without commas or quotes, at most " + fmt.Sprint(h.policy.maxKeyLength) + " bytes")
		}
		return id, nil
	case isJSONInteger(v):
		if len(v) > h.policy.maxKeyLength {
			return "", invalid(fmt.Sprintf("is longer than %d digits", h.policy.maxKeyLength))
		}
		return string(v), nil
	}
	return "", invalid("is not a string or an integer")
}

// isJSONInteger reports whether v is a JSON number without a fraction or
// an exponent.
func isJSONInteger(v []byte) bool {
	if len(v) > 0 && v[0] == '-' {
		v = v[1:]
	}
	if len(v) == 0 || (v[0] == '0' && len(v) > 1) {
		return false
	}
	for _, c := range v {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
