package postgres

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// MaxDuration is the longest lease, TTL or LapsedGrace the store keeps:
// longer ones (up to math.MaxInt64 nanoseconds) are cut to it. A time
// that far ahead is still a valid timestamptz, and the arithmetic never
// overflows into an error or a time in the past.
const MaxDuration = 100 * 365 * 24 * time.Hour

// micros converts a duration to whole microseconds, timestamptz's
// resolution, for the statements' intervals: rounded up, so that a
// sub-microsecond lease or TTL is not zero, and saturated at MaxDuration.
func micros(d time.Duration) int64 {
	d = min(max(d, 0), MaxDuration)
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// fromMicros converts microseconds from the server into a duration,
// saturated at MaxDuration (a row someone else wrote may expire in the
// year 200000).
func fromMicros(us int64) time.Duration {
	if us > int64(MaxDuration/time.Microsecond) {
		return MaxDuration
	}
	return time.Duration(max(us, 0)) * time.Microsecond
}

// PostgreSQL refuses to index a row whose index entry is larger than a
// third of a page, less some overhead: 2704 bytes with the default 8 kB
// pages (BTMaxItemSize, B-tree version 4, PostgreSQL 12 and later). The
// primary key's entry holds the scope and the key, so a key past the
// limit would fail every Reserve with a program_limit_exceeded error (and
// the handler would answer 503). The store refuses it first, as the
// caller's mistake (storage.ErrInvalid). The entry is computed for values
// stored uncompressed: PostgreSQL may compress a long, repetitive key
// into fitting, but the bound must not depend on what a key contains.
const (
	maxIndexEntry = 2704
	// indexTupleHeader is IndexTupleData: a heap TID and t_info.
	indexTupleHeader = 8
	// maxAlign is MAXALIGN on 64-bit servers.
	maxAlign = 8
	// moduleScopeLen is the length of the Caddy module's scopes (hex
	// SHA-256), for which MaxKeyLength is given.
	moduleScopeLen = 64
)

// indexEntrySize is the size of the primary key's index entry for a
// scope and a key of the given lengths in bytes, laid out as PostgreSQL
// does: a text of up to 126 bytes takes a 1-byte header and no alignment,
// a longer one a 4-byte header aligned on 4 bytes; the whole entry is
// MAXALIGNed.
func indexEntrySize(scopeLen, keyLen int) int {
	n := indexTupleHeader
	for _, l := range []int{scopeLen, keyLen} {
		if l <= 126 {
			n += 1 + l
		} else {
			n = (n+3)&^3 + 4 + l
		}
	}
	return (n + maxAlign - 1) &^ (maxAlign - 1)
}

// checkKey refuses, before any I/O, a key PostgreSQL could not store: one
// whose index entry would be too large, or that a text column cannot
// hold (a NUL byte, or bytes that are not UTF-8).
func checkKey(key storage.Key) error {
	for _, part := range []string{key.Scope, key.ID} {
		if !utf8.ValidString(part) || strings.IndexByte(part, 0) >= 0 {
			return fmt.Errorf("%w: a PostgreSQL text column holds UTF-8 without NUL bytes, and the key or its scope is not such text", storage.ErrInvalid)
		}
	}
	if indexEntrySize(len(key.Scope), len(key.ID)) > maxIndexEntry {
		return fmt.Errorf("%w: a key of %d bytes in a scope of %d bytes is longer than PostgreSQL can index (for %d-byte scopes, at most %d bytes)",
			storage.ErrInvalid, len(key.ID), len(key.Scope), moduleScopeLen, maxKeyLength)
	}
	return nil
}

// maxKeyLength is the longest key for the module's scopes.
var maxKeyLength = func() int {
	n := 0
	for indexEntrySize(moduleScopeLen, n+1) <= maxIndexEntry {
		n++
	}
	return n
}()

var _ storage.KeyLimiter = (*Store)(nil)

// MaxKeyLength implements storage.KeyLimiter: the longest Key.ID, in
// bytes, that Reserve accepts with a 64-byte Scope (the Caddy module's
// hex SHA-256): 2624 with PostgreSQL's default 8 kB pages. Longer keys
// fail with storage.ErrInvalid.
func (s *Store) MaxKeyLength() int { return maxKeyLength }
