package memory

import (
	"bytes"
	"time"
	"unsafe"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// fpInline is the fingerprint size kept inside the entry: a SHA-256, which
// is what the Caddy handler uses, so a new key costs one allocation.
const fpInline = 32

// entry is one record. All fields are guarded by the shard lock, except that
// fp and resp, once set, never change: they are handed out to callers. A
// takeover therefore replaces the entry rather than reusing it.
type entry struct {
	fp []byte // points into fpBuf when it fits
	// token is the lease of a record in flight. Once completed, a record
	// has no lease: a refusal record keeps its place in the refusal lists
	// here (refusal.go), any other zero.
	token   storage.Token
	created int64 // nanoseconds since Store.base
	expires int64 // lease lapse (in flight) or expiry (completed)
	scope   scopeID

	// resp is the completed response in storage's binary encoding; nil in
	// flight. One pointer-free block rather than a header map of strings:
	// a million records must not weigh on every garbage collection.
	resp []byte

	// detail is the completed record's Response.Detail; nil in flight.
	detail []byte

	// done is made by the first Wait on an in-flight entry and closed when
	// the entry stops being that in-flight record, to wake the waiters.
	done chan struct{}

	fpBuf [fpInline]byte
}

// mapSlot is what a record costs in its shard's map besides the entry: the
// key (a recordID) and the pointer, at the 7/8 load factor Go's maps keep,
// plus a control byte.
const mapSlot = (int64(unsafe.Sizeof(recordID{}))+8)*8/7 + 1

// entryCost is the footprint of an in-flight entry for a fingerprint of
// fpLen bytes: the entry, its map slot and, when it does not fit inside
// the entry, the fingerprint.
func entryCost(fpLen int) int64 {
	n := int64(unsafe.Sizeof(entry{})) + mapSlot
	if fpLen > fpInline {
		n += int64(fpLen)
	}
	return n
}

// footprint is what the store counts for e against MaxBytes: its
// entryCost, plus the block holding the encoded response and detail of a
// completed record, plus a refusal record's place in the refusal lists.
func (e *entry) footprint() int64 {
	n := entryCost(len(e.fp)) + int64(cap(e.resp)+cap(e.detail))
	if e.isRefusal() {
		n += refusalCost
	}
	return n
}

func newEntry(fp []byte, token storage.Token, now int64, lease time.Duration, scope scopeID) *entry {
	e := &entry{
		token:   token,
		created: now,
		expires: after(now, lease),
		scope:   scope,
	}
	// Copy: callers may reuse their slice once Reserve returns.
	if len(fp) <= fpInline {
		e.fp = e.fpBuf[:copy(e.fpBuf[:], fp)]
	} else {
		e.fp = append(make([]byte, 0, len(fp)), fp...) // exactly entryCost's
	}
	return e
}

// live reports whether the entry still counts as present at now.
func (e *entry) live(now int64) bool {
	return now < e.expires
}

// owns reports whether token names the entry's lease. A lapsed lease that
// nobody took over still counts: only a takeover fences the old owner.
func (e *entry) owns(token storage.Token) bool {
	return e.resp == nil && token != 0 && e.token == token
}

// wake releases the waiters of an entry that is no longer the same
// in-flight record.
func (e *entry) wake() {
	if e.done != nil {
		close(e.done)
		e.done = nil
	}
}

// reservation answers a Reserve that found the live entry e.
func (s *Store) reservation(e *entry, fp []byte) storage.Reservation {
	switch {
	case !bytes.Equal(e.fp, fp):
		if e.detail == nil {
			return storage.Reservation{Outcome: storage.Mismatch}
		}
		return storage.Reservation{Outcome: storage.Mismatch, Record: &storage.Record{Detail: e.detail}}
	case e.resp != nil:
		// The caller decodes the record once the shard is unlocked.
		return storage.Reservation{Outcome: storage.Replay}
	}
	// The token stays out: only the owner may complete or release.
	return storage.Reservation{Outcome: storage.Conflict, Record: &storage.Record{
		Fingerprint: e.fp,
		State:       storage.InFlight,
		CreatedAt:   s.at(e.created),
		ExpiresAt:   s.at(e.expires),
	}}
}

// completed decodes the record of a completed entry. The body and the
// fingerprint alias the entry, which never changes them. The store encoded
// the record itself and Complete refuses what could not be decoded, so an
// error means memory was corrupted or a bug: it is reported as an error
// wrapping storage.ErrCorrupt, never a panic, so that one bad record
// costs its own requests and nothing else.
func (s *Store) completed(e *entry, withBody bool) (*storage.Record, error) {
	c := new(completedRecord)
	if err := storage.DecodeResponseInto(&c.resp, e.resp, c.values[:0]); err != nil {
		return nil, err
	}
	if !withBody {
		c.resp.Body = nil
	}
	c.rec = storage.Record{
		Fingerprint: e.fp,
		State:       storage.Completed,
		Response:    &c.resp,
		CreatedAt:   s.at(e.created),
		ExpiresAt:   s.at(e.expires),
		Detail:      e.detail,
	}
	return &c.rec, nil
}

// completedRecord is a record, its response and its header values (when
// there are few, as there usually are) in one allocation.
type completedRecord struct {
	rec    storage.Record
	resp   storage.Response
	values [4]string
}
