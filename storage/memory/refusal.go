package memory

import (
	"math"
	"sync"
	"unsafe"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// Refusal records give way under pressure. A completed record whose
// status is a refusal (400-499) is kept and replayed as any other, but
// when a new key finds the store full, the oldest refusal records are
// evicted to make room (after the expired ones), and when a new key finds
// its scope past its share, the scope's own oldest refusal record is.
// A refused request did nothing, so a retry that runs again because its
// record gave way cannot double an effect; records in flight and records
// of other statuses never give way. Otherwise requests that the upstream
// refuses (made-up credentials, each one a scope of its own, sent to
// paths that answer 404) could fill the store and shut out every new key.
//
// The store lists its refusal records from the oldest, as a whole and per
// scope: two doubly linked lists threaded through one slab of nodes,
// linked by index, so that they hold no pointer for the garbage
// collector to scan and cost one node per refusal record and nothing per
// other record. A record's node is kept in its entry's token field, which
// a completed record has no other use for. Linking, unlinking and finding
// the oldest are O(1): a Reserve under pressure costs one eviction.
//
// Lock order: refusals.mu is taken last, under a record shard's lock (when
// a record is completed or removed), or alone (to find the oldest); it is
// never held while taking another lock.

// refusal reports whether a record of status gives way under pressure.
func refusal(status int) bool { return status >= 400 && status <= 499 }

// none is the index of no node.
const none = -1

// refusalNode is one refusal record's place in the lists.
type refusalNode struct {
	id    recordID
	scope scopeID
	all   link // in the store's list; next is the free list's link once freed
	own   link // in its scope's list
}

type link struct{ prev, next int32 }

// list is the oldest and the newest node of a list.
type list struct{ head, tail int32 }

var emptyList = list{none, none}

// refusalCost is what a refusal record costs besides its entry: its node,
// and its scope's list in the map of scopes (shared by the scope's
// refusal records, counted for each).
const refusalCost = int64(unsafe.Sizeof(refusalNode{})) + (int64(unsafe.Sizeof(scopeID(0)))+int64(unsafe.Sizeof(list{})))*8/7 + 1

// maxRefusals bounds the nodes: their indexes are int32. A store allowed
// more records than that does not track its refusal records.
const maxRefusals = math.MaxInt32 - 1

// refusals lists the store's refusal records.
type refusals struct {
	mu     sync.Mutex
	nodes  []refusalNode
	free   int32 // first free node
	all    list
	scopes map[scopeID]list // nil: the store has no shares, no scope lists
	n      int              // nodes in use
}

// init makes r empty, with scope lists when scoped.
func (r *refusals) init(scoped bool) {
	r.free, r.all = none, emptyList
	if scoped {
		r.scopes = make(map[scopeID]list)
	}
}

// add lists the refusal record id of scope as the newest, and returns
// the token its entry keeps (its node, plus one so that it is not zero).
func (r *refusals) add(id recordID, scope scopeID) storage.Token {
	r.mu.Lock()
	defer r.mu.Unlock()
	at := r.free
	if at == none {
		at = int32(len(r.nodes))
		r.nodes = append(r.nodes, refusalNode{})
	} else {
		r.free = r.nodes[at].all.next
	}
	nd := &r.nodes[at]
	*nd = refusalNode{id: id, scope: scope}
	r.n++
	nd.all = r.append(&r.all, at, func(i int32) *link { return &r.nodes[i].all })
	if r.scopes != nil {
		own, ok := r.scopes[scope]
		if !ok {
			own = emptyList
		}
		nd.own = r.append(&own, at, func(i int32) *link { return &r.nodes[i].own })
		r.scopes[scope] = own
	}
	return storage.Token(at) + 1
}

// append makes at the tail of l, whose links field gives, and returns
// at's link.
func (r *refusals) append(l *list, at int32, links func(int32) *link) link {
	lk := link{prev: l.tail, next: none}
	if l.tail == none {
		l.head = at
	} else {
		links(l.tail).next = at
	}
	l.tail = at
	return lk
}

// unlink removes from l the node at, whose link in l is lk.
func (r *refusals) unlink(l *list, lk link, links func(int32) *link) {
	if lk.prev == none {
		l.head = lk.next
	} else {
		links(lk.prev).next = lk.next
	}
	if lk.next == none {
		l.tail = lk.prev
	} else {
		links(lk.next).prev = lk.prev
	}
}

// remove takes the refusal record whose entry keeps token off the lists.
func (r *refusals) remove(token storage.Token) {
	at := int32(token - 1)
	r.mu.Lock()
	defer r.mu.Unlock()
	nd := r.nodes[at]
	r.unlink(&r.all, nd.all, func(i int32) *link { return &r.nodes[i].all })
	if r.scopes != nil {
		own := r.scopes[nd.scope]
		r.unlink(&own, nd.own, func(i int32) *link { return &r.nodes[i].own })
		if own.head == none {
			delete(r.scopes, nd.scope)
		} else {
			r.scopes[nd.scope] = own
		}
	}
	r.n--
	if r.n == 0 {
		// None left: let the slab go rather than keep the largest it
		// ever was.
		r.nodes, r.free = nil, none
		return
	}
	r.nodes[at] = refusalNode{all: link{prev: none, next: r.free}}
	r.free = at
}

// oldest returns the oldest refusal record (of scope, when scoped) and
// the token its entry keeps; false when there is none.
func (r *refusals) oldest(scope scopeID, scoped bool) (recordID, storage.Token, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at := r.all.head
	if scoped {
		own, ok := r.scopes[scope]
		if !ok {
			return recordID{}, 0, false
		}
		at = own.head
	}
	if at == none {
		return recordID{}, 0, false
	}
	return r.nodes[at].id, storage.Token(at) + 1, true
}

// isRefusal reports whether e is a completed refusal record on the lists
// (whose token is its place in them).
func (e *entry) isRefusal() bool {
	return e.resp != nil && e.token != 0
}

// forgetRefusal takes e off the refusal lists if it is on them. The
// caller holds e's shard lock and is removing e.
func (s *Store) forgetRefusal(e *entry) {
	if e.isRefusal() {
		s.refusals.remove(e.token)
	}
}

// maxEvictTries bounds the refusal records evictRefusal looks at: each
// one it cannot evict went meanwhile (evicted, deleted or swept by another
// goroutine), so the next try looks at a newer one.
const maxEvictTries = 64

// evictRefusal evicts the oldest refusal record (of scope, when scoped)
// and reports whether it evicted one. The caller holds no record shard's
// lock.
func (s *Store) evictRefusal(scope scopeID, scoped bool) bool {
	if !s.tracksRefusals {
		return false
	}
	for range maxEvictTries {
		id, token, ok := s.refusals.oldest(scope, scoped)
		if !ok {
			return false
		}
		sh := &s.shards[id[0]&(numShards-1)]
		sh.mu.Lock()
		// Between finding it and taking the lock, the record may have
		// gone, and its node be another record's by now.
		if e := sh.m[id]; e != nil && e.isRefusal() && e.token == token {
			s.remove(sh, id, e)
			sh.mu.Unlock()
			s.evicted.Add(1)
			if s.onRemove != nil {
				s.onRemove(false, 1)
			}
			return true
		}
		sh.mu.Unlock()
	}
	return false
}

// EvictedRefusals returns how many refusal records the store has evicted
// to make room for new keys (see the package documentation). It is meant
// for tests and metrics.
func (s *Store) EvictedRefusals() int64 {
	return s.evicted.Load()
}
