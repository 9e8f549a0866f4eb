package memory

import (
	"hash/maphash"
	"sync"
	"unsafe"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// scopeID names a scope in the per-scope counts: a seeded 64-bit hash of
// Key.Scope, so that an entry remembers its scope in eight pointer-free
// bytes. Two scopes that collide share one bound, which with 64 bits and
// a secret seed no client can arrange.
type scopeID uint64

// scopeUse is what one scope holds: records and their footprint.
type scopeUse struct {
	n     int32
	bytes int64
}

// scopeShard counts the records of the scopes that hash to it. Lock order:
// a record shard's lock, then a scope shard's.
type scopeShard struct {
	scopeState
	_ [128 - unsafe.Sizeof(scopeState{})%128]byte
}

type scopeState struct {
	mu sync.Mutex
	m  map[scopeID]scopeUse
}

func (s *Store) scopeOf(key storage.Key) scopeID {
	return scopeID(maphash.String(s.seed, key.Scope))
}

// pressed reports whether the store is under pressure: it holds half of
// its records or half of its bytes. Only then does a scope's share bind.
func (s *Store) pressed() bool {
	return 2*s.count.Load() >= s.max || 2*s.bytes.Load() >= s.maxBytes
}

// admitScope counts one more record of cost bytes for scope, unless the
// store is under pressure and the scope holds its share already.
func (s *Store) admitScope(scope scopeID, cost int64) bool {
	return s.useScope(scope, 1, cost, true)
}

// growScope counts cost more bytes for scope; with check, only if the
// store is not under pressure or the scope stays within its share.
func (s *Store) growScope(scope scopeID, cost int64, check bool) bool {
	return s.useScope(scope, 0, cost, check)
}

func (s *Store) useScope(scope scopeID, n int32, cost int64, check bool) bool {
	if s.maxScope == 0 {
		return true
	}
	sc := &s.scopes[scope&(numShards-1)]
	sc.mu.Lock()
	defer sc.mu.Unlock()
	u := sc.m[scope]
	if check && ((n > 0 && u.n+n > s.maxScope) || u.bytes+cost > s.maxScopeBytes) && s.pressed() {
		return false
	}
	u.n += n
	u.bytes += cost
	sc.m[scope] = u
	return true
}

// forgetScope counts n records and bytes bytes fewer for scope.
func (s *Store) forgetScope(scope scopeID, n int32, bytes int64) {
	if s.maxScope == 0 {
		return
	}
	sc := &s.scopes[scope&(numShards-1)]
	sc.mu.Lock()
	u := sc.m[scope]
	u.n -= n
	u.bytes -= bytes
	if u.n > 0 {
		sc.m[scope] = u
	} else {
		delete(sc.m, scope)
	}
	sc.mu.Unlock()
}
