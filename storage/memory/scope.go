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

// scopeShard counts the records of the scopes that hash to it. Lock order:
// a record shard's lock, then a scope shard's.
type scopeShard struct {
	scopeState
	_ [128 - unsafe.Sizeof(scopeState{})%128]byte
}

type scopeState struct {
	mu sync.Mutex
	m  map[scopeID]int32
}

func (s *Store) scopeOf(key storage.Key) scopeID {
	return scopeID(maphash.String(s.seed, key.Scope))
}

// admitScope counts one more record for scope if it has room.
func (s *Store) admitScope(scope scopeID) bool {
	if s.maxScope == 0 {
		return true
	}
	sc := &s.scopes[scope&(numShards-1)]
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.m[scope] >= s.maxScope {
		return false
	}
	sc.m[scope]++
	return true
}

// forgetScope counts n records fewer for scope.
func (s *Store) forgetScope(scope scopeID, n int32) {
	if s.maxScope == 0 {
		return
	}
	sc := &s.scopes[scope&(numShards-1)]
	sc.mu.Lock()
	if left := sc.m[scope] - n; left > 0 {
		sc.m[scope] = left
	} else {
		delete(sc.m, scope)
	}
	sc.mu.Unlock()
}
