package memory

import (
	"errors"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// TestUndecodableRecordIsAnErrorNotAPanic plants completed records the
// store cannot decode (a status of 42, which Complete used to accept from
// an upstream answering "HTTP/1.1 042 x", and bytes that are no encoding
// at all): every path that reads them answers an error wrapping
// storage.ErrCorrupt, where the store used to panic for the record's
// whole ttl, and Delete still clears them.
func TestUndecodableRecordIsAnErrorNotAPanic(t *testing.T) {
	for name, enc := range map[string][]byte{
		"status 42": storage.AppendResponse(nil, &storage.Response{Status: 42, Body: []byte("x")}),
		"garbage":   {0xff, 0x00, 0x01},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			s := New(Options{})
			defer s.Close()
			key := storage.Key{Scope: "s", ID: "k"}
			res, err := s.Reserve(ctx, key, []byte("fp"), time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(ctx, key, res.Token, &storage.Response{Status: 201}, time.Hour); err != nil {
				t.Fatal(err)
			}
			sh, id := s.shardFor(key)
			sh.mu.Lock()
			sh.m[id].resp = enc
			sh.mu.Unlock()

			_, reserveErr := s.Reserve(ctx, key, []byte("fp"), time.Minute)
			_, getErr := s.Get(ctx, key, true)
			_, getHeadErr := s.Get(ctx, key, false)
			_, byHashErr := s.GetByHash(ctx, key.Hash(), true)
			for op, err := range map[string]error{"Reserve": reserveErr, "Get": getErr, "Get without body": getHeadErr, "GetByHash": byHashErr} {
				if !errors.Is(err, storage.ErrCorrupt) {
					t.Errorf("%s: %v, want an error wrapping storage.ErrCorrupt", op, err)
				}
			}
			// Another request under the key is still told it mismatches.
			if res, err := s.Reserve(ctx, key, []byte("other"), time.Minute); err != nil || res.Outcome != storage.Mismatch {
				t.Errorf("Reserve with another fingerprint: %v, %v; want mismatch", res.Outcome, err)
			}
			if err := s.Delete(ctx, key); err != nil {
				t.Fatalf("Delete: %v", err)
			}
			if res, err := s.Reserve(ctx, key, []byte("fp"), time.Minute); err != nil || res.Outcome != storage.Acquired {
				t.Fatalf("Reserve after Delete: %v, %v; want acquired", res.Outcome, err)
			}
		})
	}
}
