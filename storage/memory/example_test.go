package memory_test

import (
	"context"
	"fmt"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/memory"
)

func Example() {
	ctx := context.Background()
	store := memory.New(memory.Options{})
	defer store.Close()

	key := storage.Key{Scope: "client-1", ID: "order-42"}
	fp := []byte("fingerprint of the request")

	// The first request claims the key under a lease...
	res, _ := store.Reserve(ctx, key, fp, 30*time.Second)
	fmt.Println(res.Outcome)
	// ...and records its response when done.
	_ = store.Complete(ctx, key, res.Token, &storage.Response{Status: 201, Body: []byte(`{"id":42}`)}, 24*time.Hour)

	// A retry gets the recorded response; another request under the same
	// key is a mismatch.
	res, _ = store.Reserve(ctx, key, fp, 30*time.Second)
	fmt.Println(res.Outcome, res.Record.Response.Status, string(res.Record.Response.Body))
	res, _ = store.Reserve(ctx, key, []byte("another request"), 30*time.Second)
	fmt.Println(res.Outcome)
	// Output:
	// acquired
	// replay 201 {"id":42}
	// mismatch
}
