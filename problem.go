package idempotency

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// problem is an RFC 9457 problem type this handler answers with. Titles
// follow draft-ietf-httpapi-idempotency-key-header where it names one.
type problem struct {
	status int
	slug   string // the last part of the type URI
	title  string
}

var (
	problemKeyMissing  = problem{http.StatusBadRequest, "key-missing", "Idempotency-Key is missing"}
	problemKeyInvalid  = problem{http.StatusBadRequest, "key-invalid", "Idempotency-Key is invalid"}
	problemConflict    = problem{http.StatusConflict, "request-outstanding", "A request is outstanding for this Idempotency-Key"}
	problemMismatch    = problem{http.StatusUnprocessableEntity, "key-reused", "Idempotency-Key is already used"}
	problemBodyNotJSON = problem{http.StatusBadRequest, "body-invalid-json", "Request body is not valid JSON"}
	problemTooLarge    = problem{http.StatusRequestEntityTooLarge, "body-too-large", "Request body is too large for an idempotent request"}
	problemTooManyKeys = problem{http.StatusTooManyRequests, "too-many-keys", "Too many Idempotency-Keys for this client"}
	problemStoreDown   = problem{http.StatusServiceUnavailable, "store-unavailable", "Idempotency store is unavailable"}
	problemStoreFull   = problem{http.StatusServiceUnavailable, "store-full", "Idempotency store is full"}
)

// retryable says whether the same request, with the same key, may
// succeed later (409, 429, 503), or must change first (400, 413, 422).
func (p problem) retryable() bool {
	switch p.status {
	case http.StatusConflict, http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return true
	}
	return false
}

// typeURI is the problem's type.
func (p problem) typeURI() string { return problemTypeBase + p.slug }

// problemTypeBase prefixes problem slugs to make type URIs: stable
// identifiers that do not depend on any deployment.
const problemTypeBase = "urn:caddy-idempotency:"

// problemBody is the JSON object of a problem response.
type problemBody struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Instance names this occurrence: "urn:uuid:" and the request's id,
	// the uuid of Caddy's access log and the request_id of the module's
	// log line for the request.
	Instance string `json:"instance,omitempty"`
	// Retryable says whether sending the same request with the same key
	// again may succeed (409, 429, 503) or not (400, 413, 422).
	Retryable bool `json:"retryable"`
	// Differs names the parts of a request that differ from the one a
	// reused key was first used for (422 only).
	Differs []string `json:"differs,omitempty"`
}

// writeProblem answers with p as application/problem+json, with the
// differs member of a 422 when there are any, the request's id as the
// instance, linking docsURL when it is set. Problem responses are never
// stored and never cached.
func writeProblem(w http.ResponseWriter, docsURL string, p problem, detail string, differs []string, requestID string) error {
	pb := problemBody{
		Type:      p.typeURI(),
		Title:     p.title,
		Status:    p.status,
		Detail:    detail,
		Retryable: p.retryable(),
		Differs:   differs,
	}
	if requestID != "" {
		pb.Instance = "urn:uuid:" + requestID
	}
	body, err := json.Marshal(pb)
	if err != nil {
		return err
	}
	hdr := w.Header()
	hdr.Set("Content-Type", "application/problem+json")
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	hdr.Set("Cache-Control", "no-store")
	if docsURL != "" {
		hdr.Add("Link", "<"+docsURL+`>; rel="describedby"`)
	}
	w.WriteHeader(p.status)
	// A client that went away cannot be told anything else; there is no
	// error for Caddy's error routes to handle.
	_, _ = w.Write(body)
	return nil
}
