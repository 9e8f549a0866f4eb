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

// BatchStats returns how many batches of reserves and of completions the
// store sent, and the most statements in one batch of each.
func (s *Store) BatchStats() (reserves, largestReserve, completes, largestComplete int) {
	s.reserves.mu.Lock()
	reserves, largestReserve = s.reserves.batches, s.reserves.largest
	s.reserves.mu.Unlock()
	s.completes.mu.Lock()
	completes, largestComplete = s.completes.batches, s.completes.largest
	s.completes.mu.Unlock()
	return
}

// Queued returns how many statements wait for the next batch, of either
// kind.
func (s *Store) Queued() int {
	s.reserves.mu.Lock()
	n := len(s.reserves.queue)
	s.reserves.mu.Unlock()
	s.completes.mu.Lock()
	n += len(s.completes.queue)
	s.completes.mu.Unlock()
	return n
}

// LockedAnswers returns how many reserve statements found their row
// locked by another transaction.
func (s *Store) LockedAnswers() int64 { return s.lockedAnswers.Load() }

// RenewChunk is how many leases one renewal transaction renews at most.
const RenewChunk = renewChunk
