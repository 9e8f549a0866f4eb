package storagetest

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// benchBatch bounds the records a benchmark adds before it cleans up, with
// the timer stopped: a bounded store (the memory store's MaxKeys) never
// fills up and a shared server does not grow with b.N.
const benchBatch = 4096

// benchKeys is how many completed keys the parallel replay spreads over, so
// that a sharded store is measured across its shards.
const benchKeys = 1024

// Bench runs one sub-benchmark per operation against store, reporting
// allocations: Reserve of a new key, Reserve replaying a completed key with
// a 1 KiB body (serially and from parallel goroutines), Complete, Release,
// Renew and Get (with and without the body). It uses keys of fresh random
// scopes and deletes what it creates.
func Bench(b *testing.B, store storage.Store) {
	b.Run("ReserveNew", func(b *testing.B) {
		ctx := b.Context()
		batched(b, nil, func(key storage.Key, _ storage.Token) storage.Token {
			res, err := store.Reserve(ctx, key, fpA, longLease)
			if err != nil || res.Outcome != storage.Acquired {
				b.Fatalf("Reserve: %v %v", res.Outcome, err)
			}
			return res.Token
		}, func(key storage.Key, tok storage.Token) {
			benchErr(b, "Release", store.Release(ctx, key, tok))
		})
	})
	b.Run("ReserveReplay", func(b *testing.B) {
		ctx := b.Context()
		key := benchCompleted(b, store, randomHex(16), "replay")
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			res, err := store.Reserve(ctx, key, fpA, longLease)
			if err != nil || res.Outcome != storage.Replay {
				b.Fatalf("Reserve: %v %v", res.Outcome, err)
			}
		}
	})
	b.Run("ReserveReplayParallel", func(b *testing.B) {
		ctx := b.Context()
		scope := randomHex(16)
		keys := make([]storage.Key, benchKeys)
		for i := range keys {
			keys[i] = benchCompleted(b, store, scope, strconv.Itoa(i))
		}
		var next atomic.Uint64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			// Goroutines start at different keys and walk them in turn.
			i := next.Add(benchKeys / 16)
			for pb.Next() {
				res, err := store.Reserve(ctx, keys[i%benchKeys], fpA, longLease)
				if err != nil || res.Outcome != storage.Replay {
					b.Errorf("Reserve: %v %v", res.Outcome, err)
					return
				}
				i++
			}
		})
	})
	b.Run("Complete", func(b *testing.B) {
		ctx := b.Context()
		resp := benchResponse()
		batched(b, func(key storage.Key) storage.Token {
			return benchAcquire(b, store, key)
		}, func(key storage.Key, tok storage.Token) storage.Token {
			benchErr(b, "Complete", store.Complete(ctx, key, tok, resp, longTTL))
			return tok
		}, func(key storage.Key, _ storage.Token) {
			benchErr(b, "Delete", store.Delete(ctx, key))
		})
	})
	b.Run("Release", func(b *testing.B) {
		ctx := b.Context()
		batched(b, func(key storage.Key) storage.Token {
			return benchAcquire(b, store, key)
		}, func(key storage.Key, tok storage.Token) storage.Token {
			benchErr(b, "Release", store.Release(ctx, key, tok))
			return tok
		}, nil)
	})
	b.Run("Renew", func(b *testing.B) {
		ctx := b.Context()
		key := storage.Key{Scope: randomHex(16), ID: "renew"}
		tok := benchAcquire(b, store, key)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			benchErr(b, "Renew", store.Renew(ctx, key, tok, longLease))
		}
		b.StopTimer()
		benchErr(b, "Release", store.Release(ctx, key, tok))
	})
	for _, withBody := range []bool{false, true} {
		name := "Get"
		if withBody {
			name = "GetWithBody"
		}
		b.Run(name, func(b *testing.B) {
			ctx := b.Context()
			key := benchCompleted(b, store, randomHex(16), "get")
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				_, err := store.Get(ctx, key, withBody)
				benchErr(b, "Get", err)
			}
		})
	}
}

// batched times op once per iteration, each time on a key of its own.
// Keys are made, and prepared by setup when not nil, in batches of
// benchBatch with the timer stopped; op gets setup's token and returns the
// one cleanup, when not nil, gets after the batch, also untimed.
func batched(b *testing.B, setup func(storage.Key) storage.Token, op func(storage.Key, storage.Token) storage.Token, cleanup func(storage.Key, storage.Token)) {
	keys := make([]storage.Key, benchBatch)
	toks := make([]storage.Token, benchBatch)
	ids := make([]string, benchBatch)
	for i := range ids {
		ids[i] = "bench-" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; {
		n := min(benchBatch, b.N-done)
		b.StopTimer()
		scope := randomHex(16)
		for i := range n {
			keys[i] = storage.Key{Scope: scope, ID: ids[i]}
			toks[i] = 0
			if setup != nil {
				toks[i] = setup(keys[i])
			}
		}
		b.StartTimer()
		for i := range n {
			toks[i] = op(keys[i], toks[i])
		}
		b.StopTimer()
		if cleanup != nil {
			for i := range n {
				cleanup(keys[i], toks[i])
			}
		}
		b.StartTimer()
		done += n
	}
}

// benchResponse is a typical small JSON answer: two headers, 1 KiB body.
func benchResponse() *storage.Response {
	return &storage.Response{
		Status: http.StatusCreated,
		Header: http.Header{
			"Content-Type": {"application/json"},
			"Location":     {"/orders/12345"},
		},
		Body: bytes.Repeat([]byte("0123456789abcdef"), 64),
	}
}

func benchAcquire(b *testing.B, store storage.Store, key storage.Key) storage.Token {
	b.Helper()
	res, err := store.Reserve(context.Background(), key, fpA, longLease)
	if err != nil || res.Outcome != storage.Acquired {
		b.Fatalf("Reserve(%q): %v %v", key.ID, res.Outcome, err)
	}
	return res.Token
}

// benchCompleted returns a key holding benchResponse for fpA, deleted when
// the benchmark ends.
func benchCompleted(b *testing.B, store storage.Store, scope, id string) storage.Key {
	b.Helper()
	key := storage.Key{Scope: scope, ID: id}
	err := store.Complete(context.Background(), key, benchAcquire(b, store, key), benchResponse(), longTTL)
	benchErr(b, "Complete", err)
	b.Cleanup(func() { store.Delete(context.Background(), key) })
	return key
}

func benchErr(b *testing.B, op string, err error) {
	if err != nil {
		b.Helper()
		b.Fatalf("%s: %v", op, err)
	}
}
