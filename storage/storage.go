// Package storage defines what an idempotency store keeps and how callers
// talk to it: the Store interface, the records it holds and the errors callers
// branch on.
//
// It has no Caddy dependency, so anything that needs exactly-once processing
// of keyed work (an HTTP edge, a queue consumer whose message id is the key)
// can use the same stores.
package storage

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"time"
)

// Errors callers branch on. Any other error from a Store means the backend
// could not answer (unreachable, timed out, corrupt data).
var (
	// ErrNotFound: there is no live record for the key.
	ErrNotFound = errors.New("idempotency record not found")

	// ErrLeaseLost: the token does not name the key's current lease. The
	// record was completed, released, deleted or taken over by another
	// request after the lease lapsed. The caller must not retry the write:
	// the record now belongs to someone else (fencing).
	ErrLeaseLost = errors.New("idempotency lease lost")

	// ErrFull: the store refuses a new key because it holds as many live
	// records as it is allowed to. Live records are never evicted.
	ErrFull = errors.New("idempotency store is full")

	// ErrScopeFull: the store refuses a new key because its scope (one
	// client) holds as many records as one scope may, so that one client
	// cannot fill the store for everybody. Other scopes are unaffected.
	ErrScopeFull = errors.New("idempotency store holds too many keys for this scope")

	// ErrUnavailable is wrapped by the errors that mean the store could
	// not be reached or did not answer in time (a refused or broken
	// connection, a timeout, a server shutting down or still loading): the
	// only errors after which a caller may go on without the store (the
	// Caddy module's fail_open). An error that proves the store answered
	// (a corrupt record, a refused write, a missing table, a permission)
	// never wraps it. See Unavailable.
	ErrUnavailable = errors.New("idempotency store unavailable")

	// ErrInvalid is wrapped by the errors of calls whose arguments a store
	// cannot take (a response with a status outside 200-999, a key longer
	// than the store can index): the caller's mistake, never retried.
	ErrInvalid = errors.New("invalid idempotency store call")

	// ErrBusy is wrapped by the errors of calls that found the key's
	// record locked by someone else (a PostgreSQL row held by another
	// transaction: an operator's open BEGIN, a client's own retry) for
	// longer than the store waits for a lock. The call changed nothing and
	// may be made again; the store answered, so it is not unavailable,
	// and other keys are not affected.
	ErrBusy = errors.New("idempotency record is locked by another transaction")

	// ErrReadOnly is wrapped, with ErrUnavailable, by the errors of a
	// store connected to a server that refuses writes (a standby, a
	// replica, a primary demoted by a failover): one may be under way, so
	// a caller may go on without the store, but a configuration checked
	// against such a server (caddy validate) points at the wrong one.
	ErrReadOnly = errors.New("the store's server refuses writes")

	// ErrNotReplicated is wrapped, with ErrUnavailable, by the error of a
	// Reserve whose reservation was written on the primary but fewer of
	// its replicas than the store was told to wait for acknowledged it in
	// time (a store's durability option). Such a Reserve returns the
	// reservation's token, and its Outcome says what the primary holds:
	// a caller that would go on without the store (fail_open) may run on
	// the reservation instead, which still keeps its key to one run on
	// the primary; otherwise it releases it, as after any failed Reserve.
	ErrNotReplicated = errors.New("too few replicas acknowledged the write in time")
)

// Unavailable reports whether err means that the store could not be
// reached or did not answer in time: it wraps ErrUnavailable, or (for
// stores that do not classify their errors) it is a deadline or a network
// error. Errors that wrap ErrCorrupt, ErrInvalid or ErrBusy are never
// unavailable.
func Unavailable(err error) bool {
	if err == nil || errors.Is(err, ErrCorrupt) || errors.Is(err, ErrInvalid) || errors.Is(err, ErrBusy) {
		return false
	}
	var ne net.Error
	return errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne)
}

// ValidStatus reports whether code is a final status a record can hold:
// 200-999 (RFC 9110 status codes are three digits; 1xx are interim).
func ValidStatus(code int) bool { return code >= 200 && code <= 999 }

// CheckResponse reports, wrapping ErrInvalid, why resp cannot be
// recorded: nil, or a status outside ValidStatus. Stores call it in
// Complete, so that a record that could not be replayed is never written.
func CheckResponse(resp *Response) error {
	switch {
	case resp == nil:
		return fmt.Errorf("%w: nil response", ErrInvalid)
	case !ValidStatus(resp.Status):
		return fmt.Errorf("%w: status %d is not a final status (200-999)", ErrInvalid, resp.Status)
	}
	return nil
}

// Key names one record: a client's idempotency key within a client scope.
type Key struct {
	// Scope is opaque to stores. The Caddy module sets it to the hex SHA-256
	// of the evaluated scope template, so raw credentials never reach a store.
	Scope string

	// ID is the client's idempotency key, unquoted.
	ID string
}

// Digest returns the SHA-256 of the key: the scope length-prefixed, then
// the ID, so that no two keys hash the same input, whatever bytes they
// hold. It is the one identity of a record wherever a name must not reveal
// the key or the client: the memory store's map, the Redis key name, and
// (see Hash) the key_hash of logs and the admin API.
func (k Key) Digest() [sha256.Size]byte {
	var stack [512]byte
	in := binary.AppendUvarint(stack[:0], uint64(len(k.Scope)))
	in = append(in, k.Scope...)
	in = append(in, k.ID...)
	return sha256.Sum256(in)
}

// HashLen is the length of Key.Hash, in hex digits.
const HashLen = 16

// Hash returns the first 8 bytes of the key's Digest in hex: the key_hash
// that logs, placeholders and the admin API name a record by.
func (k Key) Hash() string {
	d := k.Digest()
	var out [HashLen]byte // on the stack: the string is the one allocation
	hex.Encode(out[:], d[:HashLen/2])
	return string(out[:])
}

// Token names one lease on an in-flight record. Stores create a fresh random
// token on every successful Reserve; zero never names a lease.
type Token uint64

// NewToken returns a random non-zero token.
func NewToken() Token {
	for {
		if t := Token(rand.Uint64()); t != 0 {
			return t
		}
	}
}

// State is the life-cycle state of a record.
type State uint8

const (
	// InFlight: a request holds the key under a lease and is running.
	InFlight State = 1
	// Completed: the response is recorded and is replayed until it expires.
	Completed State = 2
)

func (s State) String() string {
	switch s {
	case InFlight:
		return "in_flight"
	case Completed:
		return "completed"
	}
	return "unknown"
}

// Response is a recorded response.
type Response struct {
	// Status is the final HTTP status code.
	Status int
	// Header holds the end-to-end response headers worth replaying.
	Header http.Header
	// Body is the response body; empty when BodyOmitted.
	Body []byte
	// BodyOmitted reports that the body was larger than the recording limit
	// and was not kept. The request ran once; only its status and headers
	// can be replayed.
	BodyOmitted bool
	// OutcomeUnknown marks the record of a request whose outcome is
	// unknown: it reached the upstream, or may have, and no final status
	// came back (a response-header timeout, a reset or an EOF after the
	// request was sent). It holds no response to replay: Status is the
	// status its client was answered with (a proxy's 502 or 504), and
	// Header and Body are empty. It keeps its key, as any completed
	// record, until it expires or is deleted, so that the request never
	// runs again under that key (a caller answers every retry that the
	// outcome is unknown). Stores keep it as they keep BodyOmitted, and
	// so that a store of an earlier version refuses to read it (an error
	// wrapping ErrCorrupt) rather than replay it as a response.
	OutcomeUnknown bool
	// Detail is opaque data about the request that produced the response,
	// kept with the record (the Caddy module keeps salted digests of the
	// request's parts, so that a later request reusing the key can be told
	// what differs). Stores return it as Record.Detail, not in the
	// Response.
	Detail []byte
}

// Record is what a store holds for one key.
type Record struct {
	// Fingerprint identifies the request that created the record.
	Fingerprint []byte
	// State is InFlight or Completed.
	State State
	// Token is the current lease of an InFlight record.
	Token Token
	// Response is set on Completed records (only when asked for, see Get).
	Response *Response
	// CreatedAt is when the current owner reserved the key.
	CreatedAt time.Time
	// ExpiresAt is when the lease lapses (InFlight) or when the record
	// expires (Completed).
	ExpiresAt time.Time
	// Detail is the Response.Detail the record was completed with.
	// Reserve returns it with Replay, and alone with Mismatch.
	Detail []byte
}

// Outcome says what Reserve found.
type Outcome uint8

const (
	// Acquired: the key was absent, expired, or held by a lapsed lease; the
	// caller now owns it with Reservation.Token and must Complete or
	// Release it.
	Acquired Outcome = iota + 1
	// Mismatch: a live record exists for another fingerprint, whatever its
	// state. Reservation.Record is nil, or carries only the Detail of a
	// completed record that has one.
	Mismatch
	// Conflict: a live in-flight record exists for the same fingerprint.
	// Reservation.Record has its lease expiry, but no Token: a competing
	// caller never learns the owner's lease.
	Conflict
	// Replay: a completed record exists for the same fingerprint.
	// Reservation.Record carries its Response.
	Replay
)

func (o Outcome) String() string {
	switch o {
	case Acquired:
		return "acquired"
	case Mismatch:
		return "mismatch"
	case Conflict:
		return "conflict"
	case Replay:
		return "replay"
	}
	return "unknown"
}

// Reservation is the result of Reserve.
type Reservation struct {
	Outcome Outcome
	// Token is the caller's lease when Outcome is Acquired. When Reserve
	// fails for any reason but ErrFull, ErrScopeFull or invalid arguments,
	// the Reservation still carries the token the call used, because the
	// outcome is unknown: the reservation may have been written (a reply
	// lost, a timeout after the server acted). Releasing that token once
	// the store answers again removes such a ghost lease and is harmless
	// otherwise (ErrLeaseLost).
	Token Token
	// Record is the existing record for Conflict and Replay.
	Record *Record
}

// Store keeps idempotency records. Implementations must be safe for
// concurrent use, by many goroutines and, for shared backends, by many
// processes; each method is one atomic operation (one round trip where the
// backend allows). Expired records, and in-flight records whose lease has
// lapsed, count as absent to Reserve and Get.
//
// Leases and TTLs passed in must be positive. Records and Responses that a
// store returns may be shared with other callers and must be treated as
// read-only; a store may keep the Response given to Complete, so the caller
// must not modify it afterwards.
type Store interface {
	// Reserve claims key for a new in-flight request with the given
	// fingerprint and lease, insert-first: of any number of concurrent
	// callers for an absent key, exactly one gets Acquired. When a live
	// record exists it reports Mismatch (other fingerprint, checked first),
	// Conflict (in flight) or Replay (completed). On failure, see
	// Reservation.Token.
	Reserve(ctx context.Context, key Key, fingerprint []byte, lease time.Duration) (Reservation, error)

	// Complete records resp for the lease named by token; the record then
	// lives for ttl and can no longer change (only expire or be deleted).
	// ErrLeaseLost when token is not the current lease.
	Complete(ctx context.Context, key Key, token Token, resp *Response, ttl time.Duration) error

	// Release deletes the in-flight record held by token so that the next
	// request runs again. ErrLeaseLost when token is not the current lease.
	Release(ctx context.Context, key Key, token Token) error

	// Renew extends the lease held by token to lease from now.
	// ErrLeaseLost when token is not the current lease. Only a takeover
	// fences: a lapsed lease that nobody took over can still be renewed,
	// completed or released.
	Renew(ctx context.Context, key Key, token Token, lease time.Duration) error

	// Get returns the live record for key, or ErrNotFound. The response
	// body is included only when withBody is true.
	Get(ctx context.Context, key Key, withBody bool) (*Record, error)

	// Delete removes the record for key whatever its state; ErrNotFound
	// when there is no live record. An in-flight owner then loses its lease.
	Delete(ctx context.Context, key Key) error

	// Close releases the store's resources.
	Close() error
}

// Renewal is one lease for BatchRenewer.RenewBatch to renew, and what
// became of it.
type Renewal struct {
	Key   Key
	Token Token
	// Lease is how long from now the lease lasts once renewed (positive).
	Lease time.Duration
	// Err is set by RenewBatch, as Renew would answer for this lease
	// alone: nil when it was renewed, ErrLeaseLost when the token no
	// longer names the lease, an error wrapping ErrBusy when its record
	// was locked (renew it again later), another error when the store
	// could not say.
	Err error
}

// BatchRenewer is implemented by stores that renew many leases at once, in
// one round trip per server node whatever their number, so that the cost
// of keeping the leases of running requests alive does not grow with the
// requests. Renewals take a path of their own to the server (connections
// that reservations and completions do not use), so that they never wait
// behind them, and a renewal that lands late is harmless: only a takeover
// fences a lease, and it replaces the token.
type BatchRenewer interface {
	// RenewBatch renews every lease of batch and sets each one's Err. It
	// returns an error when the store answered for none of them (it could
	// not be reached, ctx ended), and then every Err is that error too;
	// nil when it answered for some (a node of a Cluster that did not
	// answer leaves its leases' Err set).
	RenewBatch(ctx context.Context, batch []Renewal) error
}

// Pinger is implemented by stores that reach a server: Ping checks that it
// answers, so that a misconfiguration shows at start-up rather than with
// the first request.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Checker is implemented by stores whose Ping may write (a PostgreSQL
// store creates its table on first use): Check finds what Ping would,
// without writing anything, for a configuration that is checked and never
// run (caddy validate). A missing table or column that the store would
// create on first use is fine. A Pinger that is no Checker writes nothing
// when it pings.
type Checker interface {
	Check(ctx context.Context) error
}

// DurabilityReporter is implemented by stores that can say what protects
// their records across a failover of their server (the server's role, its
// replicas, how writes wait for them), for the start-up log and the admin
// API.
type DurabilityReporter interface {
	// Durability asks the server for those facts and returns them as a
	// value encoding/json writes as an object. It fails as Ping does when
	// the server does not answer.
	Durability(ctx context.Context) (any, error)
}

// HashFinder is implemented by stores that can find records from the Hash
// of their key alone: how an operator gets from a log line (key_hash) to
// a record without the client's key or credentials. It may scan the whole
// store and is meant for occasional use.
type HashFinder interface {
	// GetByHash returns the live records whose key's Hash is hash: one,
	// or several only when 64-bit hashes collide; none is not an error.
	// Response bodies are included only when withBody is true.
	GetByHash(ctx context.Context, hash string, withBody bool) ([]*Record, error)

	// DeleteByHash deletes those records and returns how many it deleted.
	DeleteByHash(ctx context.Context, hash string) (int, error)
}

// InFlightLister is implemented by stores that can list their records in
// flight (the requests running now, and keys whose owner died holding
// them), for the admin API.
type InFlightLister interface {
	// ListInFlight returns up to limit live records in flight whose key's
	// Hash sorts after after ("" from the first), in the order of their
	// Hash: the pages of a listing, each record with its key's Hash.
	ListInFlight(ctx context.Context, after string, limit int) ([]HashedRecord, error)
}

// OutcomeUnknownKeeper is implemented by stores that can list the
// records whose outcome is unknown (Response.OutcomeUnknown) and delete
// one, for the admin API: how an operator finds the keys that a failed
// upstream left and frees a key once the operation is reconciled.
type OutcomeUnknownKeeper interface {
	// ListOutcomeUnknown returns up to limit live outcome-unknown records
	// whose key's Hash sorts after after ("" from the first), in the order
	// of their Hash, each with its key's Hash. Their responses carry no
	// body.
	ListOutcomeUnknown(ctx context.Context, after string, limit int) ([]HashedRecord, error)

	// ReleaseOutcomeUnknown deletes the live outcome-unknown records whose
	// key's Hash is hash, and no other record (never one in flight or one
	// that holds a response): each check and delete is one atomic
	// operation. It returns how many it deleted; the next request with
	// such a key runs.
	ReleaseOutcomeUnknown(ctx context.Context, hash string) (int, error)
}

// HashedRecord is a record and its key's Hash.
type HashedRecord struct {
	KeyHash string
	Record  *Record
}

// KeyLimiter is implemented by stores that cannot hold every key: a
// Reserve of a longer Key.ID fails with an error wrapping ErrInvalid.
// A caller that bounds its keys (the Caddy module's max_key_length) can
// refuse, at start-up, a bound the store cannot hold.
type KeyLimiter interface {
	// MaxKeyLength returns the longest Key.ID, in bytes, that the store
	// holds when Key.Scope is 64 bytes long (the Caddy module's scopes,
	// a hex SHA-256).
	MaxKeyLength() int
}

// Waiter is implemented by stores that can tell a waiting request when an
// in-flight record may have changed, instead of having it poll.
type Waiter interface {
	// Wait blocks until the record for key may have left the in-flight
	// state (completed, released, deleted, taken over, or its lease
	// lapsed), maxWait has passed, or ctx is done. It may return early on
	// a false alarm (callers look again), but not routinely: with nothing
	// happening it blocks for about maxWait.
	Wait(ctx context.Context, key Key, maxWait time.Duration) error
}
