package fingerprint

import (
	"bytes"
	"encoding/binary"
	"hash/maphash"
	"sync"
)

// The memo of canonical sums. Canonicalising a JSON body is most of what a
// fingerprint costs, and a retry (a replay) sends the very bytes of a
// request seen before. So a Fingerprinter remembers, for the requests it
// canonicalised last, their raw parts (the frame of method, path, query
// and headers, and the body as sent) with the fingerprint it computed: a
// request whose raw parts are remembered gets that fingerprint without
// being parsed. The fingerprint is a function of exactly those parts (the
// body is canonicalised only when the headers declare JSON, checked before
// the memo is asked, and with the Fingerprinter's fixed options), so the
// memo never changes an answer, only its cost.
//
// Raw parts of at most memoRawMax bytes are kept as they are and found by
// a maphash of them (seeded per memo), then compared byte for byte: a
// SHA-256 pass over a 1 KiB body costs more than the rest of a memory
// replay's hashing together. Larger ones are kept as their SHA-256, whose
// pass is small next to canonicalising them, so that the memo never keeps
// more than memoShards × memoSlots × memoRawMax bytes of requests.
//
// It is small and bounded: memoShards × memoSlots entries, each slot
// holding the last request whose hash falls on it.
const (
	memoShards = 8
	memoSlots  = 64
	memoRawMax = 2 << 10
	memoTag    = 'M' // before the raw body's length: no fingerprint frames this way
)

type sumMemo struct {
	seed   maphash.Seed
	shards [memoShards]memoShard
}

func newSumMemo() *sumMemo { return &sumMemo{seed: maphash.MakeSeed()} }

type memoShard struct {
	mu    sync.Mutex
	slots [memoSlots]memoEntry
}

type memoEntry struct {
	hash   uint64
	raw    []byte     // the framed parts, when small; its capacity is reused
	digest [Size]byte // their SHA-256, when large (raw is then empty)
	sum    [Size]byte
	used   bool
}

// memoKey names a request's raw parts: framed (the frame, then memoTag
// and the body's length) and the body.
type memoKey struct {
	framed, body []byte
	hash         uint64
	digest       [Size]byte // for large parts only
}

func (k *memoKey) large() bool { return len(k.framed)+len(k.body) > memoRawMax }

// key frames the request's raw parts (appending to frame, perhaps moving
// it) and hashes them; st's hash computes the digest of large ones.
func (m *sumMemo) key(st *sumState, frame, body []byte) memoKey {
	framed := binary.AppendUvarint(append(frame, memoTag), uint64(len(body)))
	k := memoKey{framed: framed, body: body}
	if k.large() {
		st.h.Reset()
		st.h.Write(framed)
		st.h.Write(body)
		st.h.Sum(st.sum[:0]) // not into k, which the interface would move to the heap
		k.digest = st.sum
		k.hash = binary.LittleEndian.Uint64(k.digest[:8])
		return k
	}
	k.hash = maphash.Bytes(m.seed, framed) ^ maphash.Bytes(m.seed, body)*0x9e3779b97f4a7c15
	return k
}

func (m *sumMemo) slot(k *memoKey) (*memoShard, *memoEntry) {
	sh := &m.shards[k.hash%memoShards]
	return sh, &sh.slots[(k.hash/memoShards)%memoSlots]
}

func (e *memoEntry) holds(k *memoKey) bool {
	if !e.used || e.hash != k.hash {
		return false
	}
	if k.large() {
		return len(e.raw) == 0 && e.digest == k.digest
	}
	n := len(k.framed)
	return len(e.raw) == n+len(k.body) && bytes.Equal(e.raw[:n], k.framed) && bytes.Equal(e.raw[n:], k.body)
}

// get copies the remembered fingerprint of k's request into sum.
func (m *sumMemo) get(k *memoKey, sum *[Size]byte) bool {
	sh, e := m.slot(k)
	sh.mu.Lock()
	ok := e.holds(k)
	if ok {
		*sum = e.sum
	}
	sh.mu.Unlock()
	return ok
}

func (m *sumMemo) put(k *memoKey, sum *[Size]byte) {
	sh, e := m.slot(k)
	sh.mu.Lock()
	e.hash, e.sum, e.used = k.hash, *sum, true
	e.raw = e.raw[:0]
	if k.large() {
		e.digest = k.digest
	} else {
		if n := len(k.framed) + len(k.body); cap(e.raw) < n {
			// Exactly what it needs: append's growth would leave a slot
			// up to half as much again, past the bound the docs give.
			e.raw = make([]byte, 0, n)
		}
		e.raw = append(append(e.raw, k.framed...), k.body...)
	}
	sh.mu.Unlock()
}
