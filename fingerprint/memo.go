package fingerprint

import (
	"encoding/binary"
	"sync"
)

// The memo of canonical sums. Canonicalising a JSON body is most of what a
// fingerprint costs, and a retry (a replay) sends the very bytes of a
// request seen before. So a Fingerprinter remembers, for the requests it
// canonicalised last, the SHA-256 of their raw parts (the frame of method,
// path, query and headers, and the body as sent) with the fingerprint it
// computed: a request whose raw digest is remembered gets that fingerprint
// without being parsed. The fingerprint is a function of exactly those
// parts (the body is canonicalised only when the headers declare JSON,
// checked before the memo is asked, and with the Fingerprinter's fixed
// options), so the memo never changes an answer, only its cost.
//
// It is small and bounded: memoShards × memoSlots entries, each slot
// holding the last request whose digest falls on it.
const (
	memoShards = 8
	memoSlots  = 64
	memoTag    = 'M' // before the raw body's length: no fingerprint frames this way
)

type sumMemo struct {
	shards [memoShards]memoShard
}

type memoShard struct {
	mu    sync.Mutex
	slots [memoSlots]memoEntry
}

type memoEntry struct {
	raw, sum [Size]byte
	used     bool
}

// rawDigest sets st.sum to the digest of frame and the raw body, and
// returns frame (appended to past its length, perhaps moved).
func rawDigest(st *sumState, frame, body []byte) []byte {
	st.h.Reset()
	framed := binary.AppendUvarint(append(frame, memoTag), uint64(len(body)))
	st.h.Write(framed)
	st.h.Write(body)
	st.h.Sum(st.sum[:0])
	return framed[:len(frame)]
}

func (m *sumMemo) slot(raw *[Size]byte) (*memoShard, int) {
	return &m.shards[raw[0]%memoShards], int(raw[1]) % memoSlots
}

// get copies the remembered fingerprint of raw into sum.
func (m *sumMemo) get(raw, sum *[Size]byte) bool {
	sh, i := m.slot(raw)
	sh.mu.Lock()
	e := &sh.slots[i]
	ok := e.used && e.raw == *raw
	if ok {
		*sum = e.sum
	}
	sh.mu.Unlock()
	return ok
}

func (m *sumMemo) put(raw, sum *[Size]byte) {
	sh, i := m.slot(raw)
	sh.mu.Lock()
	sh.slots[i] = memoEntry{raw: *raw, sum: *sum, used: true}
	sh.mu.Unlock()
}
