package idempotency

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
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

	// content is the body as the fingerprint and key_json read it: the
	// body as sent, or what it decodes to (in decoded, pooled) when its
	// Content-Encoding names codings the handler decodes.
	content []byte
	decoded *bytes.Buffer

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
	if k.decoded != nil {
		if k.decoded.Cap() <= maxPooledBody {
			bodyPool.Put(k.decoded)
		}
		k.decoded, k.content = nil, nil
	}
	k.dropCanonical()
}

// canonPool holds the buffers of keyedRequest.canonical.
var canonPool = sync.Pool{New: func() any { return new([]byte) }}

// refusal is why a request cannot be keyed: what happened, not how it
// is answered (answer.go's refusalAnswer says that, with the other rows of
// the answer table).
type refusal struct {
	why  refused
	err  error  // keyMalformed, keyAmbiguous: what the parser said; bodyUnreadable: the read error; bodyNotDecoded: why
	what string // keyJSONInvalid: what is wrong with the key at key_json; bodyCodingUnsupported: the codings
}

// refused is a reason a request cannot be keyed.
type refused uint8

const (
	noKey                 refused = iota + 1 // no key header, and none at key_json
	keyMalformed                             // the key header is not a key
	noScope                                  // the scope is blank: no client identity
	storeClosed                              // the handler's store closed as the request arrived (a reload)
	bodyTooLarge                             // the body is over max_body_size
	bodyUnreadable                           // the body could not be read
	keyAmbiguous                             // a member twice on the way to key_json
	keyJSONInvalid                           // the value at key_json is not a key
	bodyNotJSON                              // a body declared as JSON is not JSON
	bodyNotDecoded                           // the body does not decode as its Content-Encoding says
	bodyCodingUnsupported                    // key_json in a body of codings the handler does not decode
	bodyDecodedTooLarge                      // the body decodes to more than max_body_size
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
	scope, hashes, ok := h.policy.scope.hash(repl, r, h.policy.mode.traits().scopePrefix)
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
	// A coded body is read whole as it was sent (up to its coding's
	// overhead over the limit), then decoded within the limit.
	codings := fingerprint.ParseCodings(r.Header["Content-Encoding"])
	limit := h.policy.maxBodySize
	if codings.Decoded() {
		limit = codedBodyLimit(limit)
	}
	body, err := readBody(r, limit, &into.bodyStore)
	if err != nil {
		unhold()
		if errors.Is(err, errBodyTooLarge) {
			return nil, &refusal{why: bodyTooLarge}
		}
		return nil, &refusal{why: bodyUnreadable, err: err}
	}
	k = into
	k.body, k.unhold, k.content = body, unhold, body.Bytes()
	if codings.Decoded() && body.Len() > 0 {
		if ref := k.decode(codings, h.policy.maxBodySize); ref != nil {
			return k, ref
		}
	}
	if id == "" {
		if codings.Undecoded() != "" && body.Len() > 0 {
			// The key is in a body it cannot read: refuse it rather than
			// pass it on without protection.
			return k, &refusal{why: bodyCodingUnsupported, what: codings.Undecoded()}
		}
		if id, ref = h.keyFromBody(k.content); ref != nil {
			return k, ref
		}
	}
	k.key = storage.Key{Scope: scope, ID: id}
	k.hash = hashes.keyHash(k.key)
	repl.Set(h.policy.mode.traits().keyHash, k.hash)

	k.path = r.URL.EscapedPath()
	k.canonBuf = canonPool.Get().(*[]byte)
	fp, canon, canonical := h.policy.fingerprint.SumJSONCanonical(k.sum[:0], (*k.canonBuf)[:0], r.Method, k.path, r.URL.RawQuery, r.Header, k.content)
	*k.canonBuf = canon
	if len(canon) > 0 {
		k.canonical = canon
	}
	if !canonical && h.policy.fingerprint.CanonicalJSON() && len(k.content) > 0 && codings.Undecoded() == "" &&
		fingerprint.DeclaresJSON(r.Header) && !json.Valid(k.content) {
		// A body that says it is JSON and is not cannot be compared by
		// meaning, and no JSON upstream can act on it: refuse it here,
		// before anything is stored.
		return k, &refusal{why: bodyNotJSON}
	}
	k.fp = fp
	return k, nil
}

// decode decodes the body into a pooled buffer of its own, within limit:
// the content the request is fingerprinted and keyed by. The body itself
// goes on to the next handler as it was sent.
func (k *keyedRequest) decode(codings fingerprint.Codings, limit int64) *refusal {
	k.decoded = bodyPool.Get().(*bytes.Buffer)
	k.decoded.Reset()
	err := fingerprint.DecodeContent(k.decoded, codings, k.body.Bytes(), limit)
	k.content = k.decoded.Bytes()
	switch {
	case errors.Is(err, fingerprint.ErrContentTooLarge):
		return &refusal{why: bodyDecodedTooLarge}
	case err != nil:
		return &refusal{why: bodyNotDecoded, err: err}
	}
	return nil
}

// codedBodyLimit is how many bytes a body with codings the handler
// decodes may be sent in: max_body_size and the codings' overhead (a
// 64th and 256 bytes, more than gzip, zlib and zstd add to content that
// does not compress, four times over), so that any content within the
// limit is taken, in any coding.
func codedBodyLimit(limit int64) int64 {
	overhead := limit/64 + 256
	if limit > math.MaxInt64-overhead {
		return math.MaxInt64
	}
	return limit + overhead
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
