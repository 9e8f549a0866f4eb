package idempotency

import (
	"errors"
	"fmt"

	"go.uber.org/zap/zapcore"

	"github.com/caddy-idempotency/caddy-idempotency/fingerprint"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// outcome is how the handler answered a request, as set in
// {http.idempotency.outcome}, the access log and the requests counter.
type outcome string

const (
	outcomeNew         outcome = "new"           // ran the next handler under a fresh key
	outcomeReplayed    outcome = "replayed"      // answered with the recorded response
	outcomeWaited      outcome = "waited"        // waited for the first request, then replayed it
	outcomeConflict    outcome = "conflict"      // 409: the first request is still running
	outcomeMismatch    outcome = "mismatch"      // 422: the key was used for another request
	outcomeMissing     outcome = "missing"       // 400: no key where one is required
	outcomeInvalid     outcome = "invalid"       // 400: malformed key, no client scope, invalid JSON, a body that does not decode; 415: a key in a body of a coding not decoded
	outcomeTooLarge    outcome = "too_large"     // 413: body over max_body_size (decoded)
	outcomeTooManyKeys outcome = "too_many_keys" // 429: the client holds as many keys as it may
	outcomeStoreError  outcome = "store_error"   // the store failed or is full: 503, or passed on with fail_open
	outcomePassed      outcome = "passed"        // no key: passed on without idempotency
	// The key's first request failed before any status after it may have
	// reached the upstream: 502 outcome-unknown, never run again.
	outcomeUnknown outcome = "outcome_unknown"
)

// outcomes lists every outcome, so that each counter exists (at zero)
// from the start.
var outcomes = []outcome{
	outcomeNew, outcomeReplayed, outcomeWaited, outcomeConflict, outcomeMismatch,
	outcomeMissing, outcomeInvalid, outcomeTooLarge, outcomeTooManyKeys, outcomeStoreError, outcomePassed,
	outcomeUnknown,
}

// outcomeValues are the outcomes as placeholder values, boxed once: a
// string put in an interface per request would be an allocation.
var outcomeValues = func() map[outcome]any {
	m := make(map[outcome]any, len(outcomes))
	for _, o := range outcomes {
		m[o] = string(o)
	}
	return m
}()

// value is o as a placeholder value.
func (o outcome) value() any {
	if v, ok := outcomeValues[o]; ok {
		return v
	}
	return string(o)
}

// Placeholders set on the requests this handler answers.
const (
	placeholderOutcome = "http.idempotency.outcome"
	// placeholderKeyHash is set once a handler has taken the request's
	// key, and marks the request as taken for inner idempotency handlers.
	placeholderKeyHash = "http.idempotency.key_hash"
	// placeholderProblem is the problem type of a rejection, for the
	// site's handle_errors routes.
	placeholderProblem = "http.idempotency.problem"
	// placeholderObservedKeyHash is the key hash of an observing
	// handler's record (its own namespace); it takes nothing.
	placeholderObservedKeyHash = "http.idempotency.observed_key_hash"
	// placeholderPassing marks a request an enforcing handler passed on
	// without a key: the outermost such handler counts it as passed, once,
	// if no inner handler takes its key.
	placeholderPassing = "http.idempotency.passing"
	// placeholderSettled marks a request an enforcing handler has
	// answered for (any outcome but passed, or passed counted).
	placeholderSettled = "http.idempotency.settled"
)

// action is what enforce mode does with a request.
type action uint8

const (
	actRun    action = iota // the request owns its key: run the next handler and record its response
	actReplay               // answer with the recorded response
	actReject               // answer with a problem
	actPass                 // hand the request on without idempotency
	actFail                 // return the error to Caddy (a body that could not be read)
)

// answer is one row of the behaviour table (README, docs/guarantees.md):
// what the handler makes of what happened to a request, decided in one
// place for both modes. Enforce mode acts on it (enforcing.carryOut);
// observe mode records its outcome and, but for actRun, hands the request
// on as if the handler were absent (observing.carryOut).
type answer struct {
	outcome outcome
	action  action

	// The problem of actReject, its detail and the Retry-After seconds
	// ("" for none). The detail of a 422 is made when it is sent: it
	// names what differs, which only enforce mode needs to work out.
	problem    problem
	detail     string
	retryAfter string
	// acceptEncoding is the Accept-Encoding of a 415 for a coding: the
	// codings the handler decodes (RFC 9110 15.5.16).
	acceptEncoding string

	// The handler's log line for a store failure, at level (logNone:
	// none), with err.
	level zapcore.Level
	msg   string
	err   error // also the error of actFail
}

// logNone marks an answer without a log line of its own.
const logNone = zapcore.InvalidLevel

// Retry-After values, in seconds. A 409 clears when the first request
// finishes, usually well within a second; a store outage is worth probing
// again soon; a client past its share frees room as its records expire,
// which the memory store's janitor notices once a minute. (A full store
// says nothing: it cannot tell when room returns.)
const (
	conflictRetryAfter  = "1"
	storeDownRetryAfter = "1"
	scopeFullRetryAfter = "60"
)

// errStoreClosed: the handler's store was closed before the request could
// hold it (its config was unloaded as the request arrived).
var errStoreClosed = errors.New("the idempotency store of this configuration is closed")

// refusalAnswer is the answer to a request that could not be keyed
// (keyed.go says why).
func (p *policy) refusalAnswer(ref *refusal) answer {
	reject := func(o outcome, pr problem, detail string) answer {
		return answer{outcome: o, action: actReject, problem: pr, detail: detail, level: logNone}
	}
	switch ref.why {
	case noKey:
		switch {
		case !p.required:
			return answer{outcome: outcomePassed, action: actPass, level: logNone}
		case p.keyJSON != nil:
			return reject(outcomeMissing, problemKeyMissing,
				fmt.Sprintf("this endpoint requires an %s header, or a JSON body with the key at %s", p.header, p.keyJSON))
		}
		return reject(outcomeMissing, problemKeyMissing,
			fmt.Sprintf("this endpoint requires an %s header with a unique key per operation", p.header))
	case keyMalformed:
		return reject(outcomeInvalid, problemKeyInvalid, ref.err.Error())
	case noScope:
		// The scope's own problem: key-invalid would blame a good key.
		return reject(outcomeInvalid, problemScopeEmpty, p.scope.emptyDetail())
	case storeClosed:
		return p.storeErrorAnswer(errStoreClosed)
	case bodyTooLarge:
		return reject(outcomeTooLarge, problemTooLarge,
			fmt.Sprintf("requests with an %s may carry at most %d bytes", p.header, p.maxBodySize))
	case bodyUnreadable:
		return answer{outcome: outcomeInvalid, action: actFail, err: ref.err, level: logNone}
	case keyAmbiguous:
		return reject(outcomeInvalid, problemKeyInvalid,
			fmt.Sprintf("the key at %s is ambiguous: %v; send each member once", p.keyJSON, ref.err))
	case keyJSONInvalid:
		return reject(outcomeInvalid, problemKeyInvalid, fmt.Sprintf("the key at %s %s", p.keyJSON, ref.what))
	case bodyNotJSON:
		return reject(outcomeInvalid, problemBodyNotJSON, "the request body is declared as JSON but is not valid JSON")
	case bodyNotDecoded:
		return reject(outcomeInvalid, problemBodyNotDecoded, ref.err.Error())
	case bodyDecodedTooLarge:
		return reject(outcomeTooLarge, problemTooLarge,
			fmt.Sprintf("requests with an %s may carry at most %d bytes, counted decoded", p.header, p.maxBodySize))
	case bodyCodingUnsupported:
		a := reject(outcomeInvalid, problemBodyCodingUnsupported,
			fmt.Sprintf("the key at %s is in a body of Content-Encoding %s, which this server does not decode (it decodes %s); send the body in one of those or as it is, or the key in an %s header",
				p.keyJSON, ref.what, fingerprint.AcceptEncoding, p.header))
		a.acceptEncoding = fingerprint.AcceptEncoding
		return a
	}
	err := fmt.Errorf("idempotency: unknown refusal %d", ref.why)
	return answer{outcome: outcomeInvalid, action: actFail, err: err, level: logNone}
}

// storeErrorAnswer is the answer when the store could not be used.
func (p *policy) storeErrorAnswer(err error) answer {
	switch {
	case errors.Is(err, storage.ErrScopeFull):
		return answer{outcome: outcomeTooManyKeys, action: actReject, problem: problemTooManyKeys,
			detail: "too many keys in flight or recorded for this client; retry later", retryAfter: scopeFullRetryAfter,
			level: zapcore.WarnLevel, msg: "a client holds as many idempotency keys as it may; rejecting a new key"}
	case errors.Is(err, storage.ErrFull):
		return answer{outcome: outcomeStoreError, action: actReject, problem: problemStoreFull,
			// No Retry-After: room returns when a request running now frees
			// its key or a record expires, and the store cannot tell when.
			detail: "too many requests are being tracked; retry later",
			level:  zapcore.ErrorLevel, msg: "idempotency store is full; rejecting a new key"}
	case errors.Is(err, storage.ErrBusy):
		// Another transaction holds the key's record (an operator's open
		// BEGIN, a retry's takeover): for this key, as good as a request
		// in flight. The store answered, so fail_open never applies.
		return answer{outcome: outcomeConflict, action: actReject, problem: problemConflict,
			detail: "the record of this key is busy; retry later", retryAfter: conflictRetryAfter, err: err,
			level: zapcore.WarnLevel, msg: "idempotency record locked by another transaction; answering 409"}
	case p.failOpen && storage.Unavailable(err):
		// Only a store that cannot be reached or is too slow is passed
		// by: an error that proves it answered (a corrupt record, a
		// refused write) fails closed.
		return answer{outcome: outcomeStoreError, action: actPass, err: err,
			level: zapcore.WarnLevel, msg: "idempotency store unavailable; passing the request on without idempotency (fail_open)"}
	}
	return answer{outcome: outcomeStoreError, action: actReject, problem: problemStoreDown,
		detail: "the request was not processed; retry later with the same key", retryAfter: storeDownRetryAfter, err: err,
		level: zapcore.ErrorLevel, msg: "idempotency store unavailable; rejecting the request (fail_closed)"}
}

// reservationAnswer is the answer to what the store said of the key;
// replayed says how a replay came about (outcomeReplayed, or
// outcomeWaited after a wait for the first request).
func reservationAnswer(res storage.Reservation, replayed outcome) answer {
	switch o := res.Outcome; o {
	case storage.Acquired:
		return answer{outcome: outcomeNew, action: actRun, level: logNone}
	case storage.Replay:
		if rec := res.Record; rec != nil && rec.Response != nil && rec.Response.OutcomeUnknown {
			// Nothing to replay: the first request reached the upstream
			// (or may have) and no status came back.
			return answer{outcome: outcomeUnknown, action: actReject, problem: problemOutcomeUnknown, detail: outcomeUnknownDetail, level: logNone}
		}
		return answer{outcome: replayed, action: actReplay, level: logNone}
	case storage.Conflict:
		return answer{outcome: outcomeConflict, action: actReject, problem: problemConflict,
			detail: "the first request with this key is still being processed; retry later", retryAfter: conflictRetryAfter, level: logNone}
	case storage.Mismatch:
		return answer{outcome: outcomeMismatch, action: actReject, problem: problemMismatch, level: logNone}
	}
	err := fmt.Errorf("idempotency store returned unknown outcome %d", res.Outcome)
	return answer{outcome: outcomeStoreError, action: actFail, err: err, level: logNone}
}

// outcomeUnknownDetail is the detail of the outcome-unknown answer: what
// happened, and what the client does about it.
const outcomeUnknownDetail = "the first request with this key reached the upstream, or may have, and no answer came back: " +
	"it may or may not have taken effect, and it is never run again with this key. " +
	"Check whether the operation took effect (reconcile) before doing it again; to do it again, send a new key"
