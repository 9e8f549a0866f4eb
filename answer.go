package idempotency

import (
	"errors"
	"fmt"

	"go.uber.org/zap/zapcore"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
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
// place for both modes. Enforce mode acts on it (exchange.enforce);
// observe mode records its outcome and, but for actRun, hands the request
// on as if the handler were absent (exchange.observe).
type answer struct {
	outcome outcome
	action  action

	// The problem of actReject, its detail and the Retry-After seconds
	// ("" for none). The detail of a 422 is made when it is sent: it
	// names what differs, which only enforce mode needs to work out.
	problem    problem
	detail     string
	retryAfter string

	// The handler's log line for a store failure, at level (logNone:
	// none), with err.
	level zapcore.Level
	msg   string
	err   error // also the error of actFail
}

// logNone marks an answer without a log line of its own.
const logNone = zapcore.InvalidLevel

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
		return reject(outcomeInvalid, problemKeyInvalid, "the request carries no client identity to scope the key to")
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
	case p.onStorageError == failOpen && storage.Unavailable(err):
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
func reservationAnswer(o storage.Outcome, replayed outcome) answer {
	switch o {
	case storage.Acquired:
		return answer{outcome: outcomeNew, action: actRun, level: logNone}
	case storage.Replay:
		return answer{outcome: replayed, action: actReplay, level: logNone}
	case storage.Conflict:
		return answer{outcome: outcomeConflict, action: actReject, problem: problemConflict,
			detail: "the first request with this key is still being processed; retry later", retryAfter: conflictRetryAfter, level: logNone}
	case storage.Mismatch:
		return answer{outcome: outcomeMismatch, action: actReject, problem: problemMismatch, level: logNone}
	}
	err := fmt.Errorf("idempotency store returned unknown outcome %d", o)
	return answer{outcome: outcomeStoreError, action: actFail, err: err, level: logNone}
}
