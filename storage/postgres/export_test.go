package postgres

import "github.com/caddy-idempotency/caddy-idempotency/storage"

// Fallbacks returns how many times Reserve had to read the record in a
// second statement.
func (s *Store) Fallbacks() int64 { return s.fallbacks.Load() }

// Retries returns how many Reserve rounds PostgreSQL rolled back for a
// conflict.
func (s *Store) Retries() int64 { return s.serializationFailures.Load() + s.deadlocks.Load() }

// SerializationFailures returns how many Reserve rounds PostgreSQL rolled
// back for a serialization failure.
func (s *Store) SerializationFailures() int64 { return s.serializationFailures.Load() }

// CleanupLockKey returns the advisory lock key that cleanup takes.
func (s *Store) CleanupLockKey() int64 { return s.cleanupLock }

// Listening implements storagetest.WaitProbe.
func (s *Store) Listening(key storage.Key) bool { return s.watches.listening(key) }

// TrustSessions makes the store use its pool's sessions at whatever
// isolation they run, as if the pool pinned READ COMMITTED: what a
// PostgreSQL-compatible database that does not offer it, or a proxy that
// drops the start-up parameter, leaves the store with. Only the retries
// then keep it correct.
func (s *Store) TrustSessions() { s.pinned = true }
