package postgres

// Fallbacks returns how many times Reserve had to read the record in a
// second statement.
func (s *Store) Fallbacks() int64 { return s.fallbacks.Load() }

// CleanupLockKey returns the advisory lock key that cleanup takes.
func (s *Store) CleanupLockKey() int64 { return s.cleanupLock }
