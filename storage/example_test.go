package storage_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/memory"
)

// message is what a queue delivers, at least once.
type message struct {
	ID      string // the producer's id: the idempotency key
	Payload string
}

// consume processes each message at most once per id, whatever the queue
// redelivers and however many workers share the store (use Redis or
// PostgreSQL for workers on several machines).
func consume(ctx context.Context, store storage.Store, msg message, process func(message) string) string {
	key := storage.Key{Scope: "orders-queue", ID: msg.ID}
	fp := sha256.Sum256([]byte(msg.Payload))
	res, err := store.Reserve(ctx, key, fp[:], time.Minute)
	if err != nil {
		return "store unavailable: leave it on the queue, it comes back"
	}
	switch res.Outcome {
	case storage.Replay:
		return "duplicate: already done, acknowledge it"
	case storage.Conflict:
		return "another worker has it: redeliver later"
	case storage.Mismatch:
		return "same id, other payload: dead-letter it"
	}
	result := process(msg)
	if err := store.Complete(ctx, key, res.Token, &storage.Response{Status: 200, Body: []byte(result)}, 24*time.Hour); err != nil {
		// Not recorded: a redelivery may process it again. Release
		// instead when processing failed, so that it is retried.
		return "processed, but not recorded: " + err.Error()
	}
	return "processed: " + result
}

// Example shows the pattern this module grew from, outside HTTP: a queue
// consumer that processes each message once.
func Example() {
	ctx := context.Background()
	store := memory.New(memory.Options{})
	defer store.Close()
	charge := func(m message) string { return "charged " + m.Payload }

	for _, m := range []message{
		{"msg-1", "10 EUR"},
		{"msg-1", "10 EUR"}, // redelivered
		{"msg-2", "25 EUR"},
		{"msg-1", "99 EUR"}, // a producer bug: the id reused
	} {
		fmt.Println(m.ID, consume(ctx, store, m, charge))
	}
	// Output:
	// msg-1 processed: charged 10 EUR
	// msg-1 duplicate: already done, acknowledge it
	// msg-2 processed: charged 25 EUR
	// msg-1 same id, other payload: dead-letter it
}
