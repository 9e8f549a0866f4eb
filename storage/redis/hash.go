package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

var _ storage.HashFinder = (*Store)(nil)

// GetByHash implements storage.HashFinder: a key name is the prefix and
// the hex of the Digest's first 16 bytes, of which the Hash is the first
// half, so the records are found with SCAN on every primary.
func (s *Store) GetByHash(ctx context.Context, hash string, withBody bool) ([]*storage.Record, error) {
	names, err := s.namesByHash(ctx, hash)
	if err != nil {
		return nil, err
	}
	var out []*storage.Record
	for _, name := range names {
		rec, err := s.getName(ctx, name, withBody)
		switch {
		case errors.Is(err, storage.ErrNotFound):
		case err != nil:
			return nil, err
		default:
			out = append(out, rec)
		}
	}
	return out, nil
}

// DeleteByHash implements storage.HashFinder.
func (s *Store) DeleteByHash(ctx context.Context, hash string) (int, error) {
	names, err := s.namesByHash(ctx, hash)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, name := range names {
		switch err := s.deleteName(ctx, name); {
		case errors.Is(err, storage.ErrNotFound):
		case err != nil:
			return n, err
		default:
			n++
		}
	}
	return n, nil
}

// namesByHash returns the key names of the store that start with hash.
func (s *Store) namesByHash(ctx context.Context, hash string) ([]string, error) {
	if s.invalid != nil {
		return nil, fmt.Errorf("redis scan: %w", s.invalid)
	}
	if len(hash) != storage.HashLen || !isHex(hash) {
		return nil, nil
	}
	pattern := escapeGlob(s.prefix) + hash + "*"
	var mu sync.Mutex
	var names []string
	scan := func(ctx context.Context, c goredis.Cmdable) error {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			names = append(names, iter.Val())
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	if cc, ok := s.client.(*goredis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, s.client)
	}
	if err != nil {
		return nil, fmt.Errorf("redis scan: %w", classify(err))
	}
	return names, nil
}

// escapeGlob escapes the characters SCAN's MATCH treats as a pattern.
func escapeGlob(s string) string {
	var b []byte
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return string(b)
}

// isHex reports whether s holds lower-case hex digits only, so that it
// cannot carry SCAN pattern characters.
func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
