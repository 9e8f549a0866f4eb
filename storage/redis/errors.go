package redis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/redact"
)

// classify is classify with the error's message scrubbed of the client's
// passwords (redact.Wrap): every error of the store's own leaves through
// it.
func (s *Store) classify(err error) error { return redact.Wrap(classify(err), s.secrets) }

// secretsOf returns the passwords client was built with.
func secretsOf(client goredis.UniversalClient) []string {
	var pws []string
	switch c := client.(type) {
	case *goredis.Client:
		pws = []string{c.Options().Password}
	case *goredis.ClusterClient:
		pws = []string{c.Options().Password}
	}
	var out []string
	for _, pw := range pws {
		if pw != "" {
			out = append(out, pw)
		}
	}
	return out
}

// classify wraps err in storage.ErrUnavailable when it means that Redis
// could not be reached or could not answer in time, and returns it as it
// is otherwise: only the first kind may let a caller go on without the
// store (the Caddy module's fail_open). An error Redis answered about the
// record or the request itself (CORRUPT from the scripts, WRONGTYPE at the
// record's key, OOM refusing a write, NOAUTH, NOPERM) proves that the
// store is there and said no.
func classify(err error) error {
	if err == nil || errors.Is(err, storage.ErrUnavailable) || !unreachable(err) {
		return err
	}
	return fmt.Errorf("%w: %w", storage.ErrUnavailable, err)
}

// unreachable reports whether err means that Redis could not be reached
// or could not answer in time.
func unreachable(err error) bool {
	var ne net.Error
	switch {
	case errors.Is(err, storage.ErrCorrupt), errors.Is(err, storage.ErrInvalid):
		return false
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		// Too slow, refused, reset, or closed by the server mid-reply.
		return true
	case errors.Is(err, goredis.ErrClosed), errors.Is(err, goredis.ErrPoolTimeout),
		errors.Is(err, goredis.ErrPoolExhausted), errors.Is(err, errStoreClosed), errors.Is(err, errClosed):
		// No connection to be had: every one is busy, or the client is
		// closed (a store closing under a request of a configuration
		// being unloaded).
		return true
	case goredis.IsLoadingError(err), goredis.IsMasterDownError(err), goredis.IsClusterDownError(err),
		goredis.IsTryAgainError(err), goredis.IsReadOnlyError(err), goredis.IsNoReplicasError(err),
		goredis.IsMaxClientsError(err), goredis.HasErrorPrefix(err, "BUSY "), isMoved(err):
		// The server is there but cannot serve writes for now: loading
		// its data, a replica cut off from its primary or still the old
		// primary during a failover, a cluster slot without a node, too
		// few replicas for min-replicas-to-write, no room for another
		// client, a script running past busy-reply-threshold, or a
		// Cluster slot that moved under a node-by-node pipeline.
		return true
	}
	// go-redis's own errors for a deployment it cannot reach.
	msg := err.Error()
	for _, s := range []string{
		"redis: all sentinels specified in configuration are unreachable",
		"redis: cluster has no nodes",
		"redis: connection is not usable",
		"redis: connection unusable",
	} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
