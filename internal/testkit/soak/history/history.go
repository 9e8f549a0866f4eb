// Package history is the record of a chaos soak (soak/, `make soak`) and
// its checker. The soak logs every client attempt, every upstream
// execution and every fault it injects; Check judges the whole history
// against the promise of docs/guarantees.md:
//
//  1. no duplicate execution of a (scope, key) that a documented exception
//     does not excuse, and which exception excused each one that is;
//  2. replays agree with each other and with the execution they name;
//  3. no client gets an answer made for another key, scope or request;
//  4. liveness: once the faults have stopped and a quiet period passed,
//     every intent gets a final answer (no key stuck in flight);
//  5. no 5xx the documentation does not list for the situation;
//  6. no body accepted as complete (a clean end, no error) that is
//     shorter than what the upstream sent for it, and no answer cut
//     short for a client that reads steadily, however slowly;
//  7. no unrelated key refused (409, 503) while one PostgreSQL row is
//     locked by an outside transaction;
//  8. no new key refused store-full while made-up sources' refusals
//     hold most of the store;
//  9. no answer cut short because its upstream was silent for longer
//     than the stall timeout (a client is judged only while a write to
//     it is pending);
//  10. no retry that may wait refused at once while one key's storm of
//     retries waits on its instance.
//
// Times are offsets from the start of the run, all read from one clock
// (the soak's process), so that a history can be saved, loaded and
// checked again, and unit tests can write histories by hand.
package history

import (
	"encoding/json"
	"io"
	"os"
	"time"
)

// History is everything one soak run did and saw.
type History struct {
	Params     Params
	Intents    []Intent
	Attempts   []Attempt
	Executions []Execution
	Faults     []Fault
	Crashes    []Crash
	// NemesisEnd is when the last fault ended: from then on nothing is
	// injected.
	NemesisEnd time.Duration
	// SweepStart is when the liveness sweep began, after the quiet
	// period; 0 when the run ended before it.
	SweepStart time.Duration
}

// Params are the settings the promise is judged against.
type Params struct {
	Seed        int64
	LockTimeout time.Duration
	// Tolerance is the fraction of LockTimeout below which a store outage
	// or a stall must never run a key twice (docs/guarantees.md).
	Tolerance float64
	// StoreTimeout is the stores' per-call timeout (the storage blocks'
	// timeout): a 503 can come that long after a fault.
	StoreTimeout time.Duration
	// RedisReconnect is how long go-redis may keep failing after Redis is
	// reachable again (about a second, docs/guarantees.md): it lengthens
	// every Redis outage.
	RedisReconnect time.Duration
	// StoreLatency and StoreJitter are the one-way latency of every link
	// to a store, all run long (a store a network hop away): no excuse.
	StoreLatency, StoreJitter time.Duration
	// MemoryMaxKeys is the max_keys of the memory route's store (one per
	// instance); 0 when there is no memory route.
	MemoryMaxKeys int
}

// Store names.
const (
	Redis    = "redis"
	Postgres = "postgres"
	// Memory is the in-process store of one instance: its intents are
	// pinned to that instance (Intent.Instance).
	Memory = "memory"
)

// Sources of intents: the part of the workload that sent them.
const (
	SourceWorker = ""           // a client worker of the steady workload
	SourceScale  = "scale"      // a scale wave: thousands of long requests at once, each retried elsewhere
	SourceSlow   = "slow"       // a client over HTTP/1.1, HTTP/2, h2c or HTTP/3 that reads slowly, stalls or hangs up
	SourceMadeUp = "made-up"    // a made-up credential that the upstream refuses (404), never seen again
	SourceFill   = "fill"       // a real client's new key on a store the made-up credentials filled
	SourceLocked = "locked"     // the key whose PostgreSQL row an outside transaction holds locked
	SourceBurst  = "lock-burst" // unrelated new keys sent while a row is locked
	// SourceStorm is a waiter storm's key: a long first request and a
	// burst of retries with large bodies on its instance.
	SourceStorm = "storm"
	// SourceStormOther is another client's key in flight on the storm's
	// instance, whose retry comes once the storm is in.
	SourceStormOther = "storm-other"
)

// Intent is one operation a client wants done once: a key, in a scope,
// with a body, on a route (whose store and on_storage_error it names).
type Intent struct {
	ID         int
	Scope      string // the Authorization header: the scope marker
	Key        string
	Path       string
	Store      string // Redis or Postgres
	FailOpen   bool   // the route has on_storage_error fail_open
	BodyDigest string // of the request body
	Senders    int    // clients sending it at the same time
	// Source is the part of the workload that sent it (Source*).
	Source string `json:",omitempty"`
	// Instance pins the intent to one instance (the memory store's
	// intents); "" for any.
	Instance string `json:",omitempty"`
}

// MadeUp reports whether the intent is a made-up credential's.
func (in *Intent) MadeUp() bool { return in.Source == SourceMadeUp }

// Attempt is one request a client sent for an intent, and what it got.
type Attempt struct {
	Intent   int
	Sender   int
	Seq      int  // the sender's attempt number, from 1
	Sweep    bool // sent by the liveness sweep
	Instance string
	Start    time.Duration
	End      time.Duration

	// What the attempt asked the upstream for (request headers that are
	// not part of the fingerprint).
	AskDelay  time.Duration
	AskStatus int  // 0: the upstream's default (201)
	AskBreak  bool // break off mid-body after the status
	AskSize   int  // > 0: a body of this many bytes (X-Upstream-Size)
	// AskFail is how the upstream, or the proxy in front of it, was to
	// fail (X-Upstream-Fail: Fail*), "" for not at all.
	AskFail string `json:",omitempty"`
	// AskSilence, with AskSize, is how long the upstream sends nothing
	// once its headers (or its first bytes) are out.
	AskSilence time.Duration `json:",omitempty"`
	HungUp     bool          // the client hung up mid-request on purpose

	// How the client spoke and read: Proto "" is HTTP/1.1 with the
	// steady workload's client; Read "" reads at once, ReadSlow reads
	// ReadRate bytes a second throughout, ReadStall stops reading for
	// StallFor and then reads the rest at once.
	Proto    string        `json:",omitempty"`
	Read     string        `json:",omitempty"`
	ReadRate int           `json:",omitempty"`
	StallFor time.Duration `json:",omitempty"`

	Status      int    // 0: no response
	Err         string // the request or reading its body failed
	Replayed    bool   // Idempotent-Replayed: true
	BodyOmitted bool   // Idempotent-Body-Omitted: true
	Problem     string // the type of a problem+json answer
	Execution   int64  // X-Execution: the upstream execution it names
	BodyDigest  string // of the body read (whole or not)
	BodyBytes   int    // how many body bytes were read
	// From the upstream's JSON answer, when the body is one.
	BodyExecution int64
	BodyKey       string
	BodyScope     string
}

// Execution is one request the upstream served.
type Execution struct {
	N            int64 // X-Execution
	Key          string
	Scope        string
	Path         string
	Instance     string // the Caddy instance that passed it on
	BodyDigest   string // of the request body
	Start, End   time.Duration
	Status       int
	AnswerDigest string
	AnswerBytes  int  // how many body bytes it wrote
	BrokeOff     bool // sent the status, then broke off mid-body
	// Failed is how it failed (Fail*: its proxy's response-header
	// timeout, a reset or an EOF once it read the request, a reset
	// mid-body), "" when it did not.
	Failed string `json:",omitempty"`
}

// How an attempt asks its upstream, or the proxy in front of it, to fail
// (X-Upstream-Fail).
const (
	FailTimeout   = "timeout"    // the proxy's response_header_timeout passes before the upstream answers
	FailReset     = "reset"      // the upstream resets the connection once it read the request
	FailEOF       = "eof"        // the upstream closes it once it read the request
	FailRefused   = "refused"    // the proxy dials an address that refuses connections: nothing is sent
	FailResetBody = "reset-body" // the upstream resets the connection mid-body, after its status
)

// unknownOutcome reports whether x's request reached the upstream and got
// no status back: the key is kept as an outcome-unknown record (every
// retry gets 502 outcome-unknown and never runs).
func (x *Execution) unknownOutcome() bool {
	return x.Failed == FailTimeout || x.Failed == FailReset || x.Failed == FailEOF
}

// Ways of reading an answer (Attempt.Read).
const (
	ReadSlow  = "slow"
	ReadStall = "stall"
)

// FaultKind names what the nemesis did.
type FaultKind string

// Fault kinds.
const (
	Kill         FaultKind = "kill"          // kill -9 of an instance, then a restart
	Pause        FaultKind = "pause"         // SIGSTOP of an instance, then SIGCONT
	Stall        FaultKind = "stall"         // an instance's link to a store black-holed
	Cut          FaultKind = "cut"           // an instance's link to a store cut (refused, closed)
	StoreRestart FaultKind = "store-restart" // a store stopped cleanly and started again
	StoreKill    FaultKind = "store-kill"    // a store killed (kill -9) and started again
	Reload       FaultKind = "reload"        // a config reload through the admin API
	// Latency: an instance's link to a store delays every byte (a store
	// 10-80 ms away, round trip, with jitter) for a while. It is no
	// outage: nothing it does is excused.
	Latency FaultKind = "latency"
	// Lock: an outside transaction holds one PostgreSQL row locked (an
	// uncommitted INSERT of a key clients then send, or FOR UPDATE of a
	// lapsed row a request must take over) for a while. Only that key
	// may wait or be refused.
	Lock FaultKind = "lock"
)

// OnALink reports whether the fault is on an instance's link to a store.
func (k FaultKind) OnALink() bool { return k == Stall || k == Cut || k == Latency }

// Fault is one fault, from when it began to when it was healed (for a
// kill, the restarted instance answering; for a store, the store taking
// connections again).
type Fault struct {
	Kind     FaultKind
	Instance string // "" for store faults
	Store    string // "" for instance faults
	Start    time.Duration
	End      time.Duration
	Note     string // what varied (a reload's config), or why applying it failed
	// Key and Scope name the record a Lock holds.
	Key   string `json:",omitempty"`
	Scope string `json:",omitempty"`
}

// Crash is a Caddy instance that panicked or exited on its own.
type Crash struct {
	Instance string
	At       time.Duration
	What     string
}

// Save writes h as JSON to path.
func (h *History) Save(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	if err := enc.Encode(h); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Load reads a history that Save wrote.
func Load(r io.Reader) (*History, error) {
	var h History
	if err := json.NewDecoder(r).Decode(&h); err != nil {
		return nil, err
	}
	return &h, nil
}

// releases reports whether status frees the key (release_on's default:
// 5xx 401 403 407 408 429).
func releases(status int) bool {
	switch status {
	case 401, 403, 407, 408, 429:
		return true
	}
	return status >= 500 && status <= 599
}

// final reports whether a got the answer its intent was after: the
// upstream's own answer (new or replayed), whole, and one that does not
// free the key.
func (a *Attempt) final() bool {
	if a.Problem == ProblemOutcomeUnknown && a.Err == "" {
		return true // the key's answer for good: its outcome is unknown
	}
	return a.Status > 0 && a.Err == "" && !a.HungUp && a.Execution > 0 && !releases(a.Status)
}
