package fingerprint

import (
	"bytes"
	"slices"
)

// member locates one encoded object member inside parser.dst. Offsets, not
// slices, because dst may be reallocated while later members are appended.
type member struct {
	start, end         int // the encoded name and value
	nameStart, nameEnd int // the decoded name bytes, inside the encoded name
}

// sortKey is what sorting moves around: small, so that swaps are cheap, and
// carrying the first name bytes, so that most comparisons are one integer
// compare.
type sortKey struct {
	prefix uint64 // the first 8 name bytes, big-endian, zero-padded
	index  int    // the member's position in source order
}

// namePrefix packs the first 8 bytes of name. Zero padding keeps the order:
// when two prefixes differ, the first differing byte is a real byte of at
// least one name, and a missing byte sorts like 0x00, at or below any byte;
// when prefixes are equal the names are compared in full.
func namePrefix(name []byte) uint64 {
	if len(name) >= 8 {
		return uint64(name[0])<<56 | uint64(name[1])<<48 | uint64(name[2])<<40 | uint64(name[3])<<32 |
			uint64(name[4])<<24 | uint64(name[5])<<16 | uint64(name[6])<<8 | uint64(name[7])
	}
	var x uint64
	for i := range 8 {
		x <<= 8
		if i < len(name) {
			x |= uint64(name[i])
		}
	}
	return x
}

func (p *parser) name(m member) []byte { return p.dst[m.nameStart:m.nameEnd] }

// inOrder reports whether b may follow a without reordering.
func (p *parser) inOrder(a, b member) bool {
	return bytes.Compare(p.name(a), p.name(b)) <= 0
}

// sortMembers reorders the encoded members ms, which are contiguous in
// p.dst, by name. Members are encoded in source order first and only
// permuted when found out of order, because many clients send objects in a
// fixed order and most objects are small.
func (p *parser) sortMembers(ms []member) {
	keys := p.sc.keys[:0]
	for i, m := range ms {
		keys = append(keys, sortKey{namePrefix(p.name(m)), i})
	}
	p.sc.keys = keys
	// Ties on the name fall back to the source index, which makes the order
	// total and so the sort stable: duplicate names keep their source order,
	// as {"a":1,"a":2} and {"a":2,"a":1} mean different things to last-wins
	// parsers.
	cmp := func(a, b sortKey) int {
		if a.prefix != b.prefix {
			if a.prefix < b.prefix {
				return -1
			}
			return 1
		}
		if c := bytes.Compare(p.name(ms[a.index]), p.name(ms[b.index])); c != 0 {
			return c
		}
		return a.index - b.index
	}
	if len(keys) <= 12 {
		// Insertion sort beats the generic sort on the small objects
		// typical of API bodies.
		for i := 1; i < len(keys); i++ {
			k := keys[i]
			j := i
			for ; j > 0 && cmp(keys[j-1], k) > 0; j-- {
				keys[j] = keys[j-1]
			}
			keys[j] = k
		}
	} else {
		slices.SortFunc(keys, cmp)
	}
	// Members are contiguous in source order, from ms[0].start to
	// ms[n-1].end; copy them aside and write them back in sorted order.
	lo, hi := ms[0].start, ms[len(ms)-1].end
	p.sc.region = append(p.sc.region[:0], p.dst[lo:hi]...)
	w := lo
	for _, k := range keys {
		m := ms[k.index]
		w += copy(p.dst[w:], p.sc.region[m.start-lo:m.end-lo])
	}
}
