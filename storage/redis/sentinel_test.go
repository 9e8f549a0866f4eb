package redis

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/storagetest"
)

// TestSentinel runs the store on a Sentinel-managed primary (a private
// primary, its replica and a Sentinel that requires a password), then
// fails the primary over: completed records replicated before the
// failover are still replayed, new keys are reserved and completed on the
// new primary, and a waiter still learns of a completion.
func TestSentinel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a primary, a replica and a Sentinel")
	}
	sentinel := redistest.StartSentinel(t, "sentinel-secret")
	newStore := func(prefix string) *Store {
		renew, err := NewRenewClient(ClientOptions{
			Addrs:            []string{sentinel.Addr},
			MasterName:       sentinel.MasterName,
			SentinelPassword: sentinel.Password,
		})
		if err != nil {
			t.Fatal(err)
		}
		s := New(goredis.NewFailoverClient(&goredis.FailoverOptions{
			MasterName:       sentinel.MasterName,
			SentinelAddrs:    []string{sentinel.Addr},
			SentinelPassword: sentinel.Password,
		}), Options{KeyPrefix: prefix, RenewClient: renew})
		t.Cleanup(func() { s.Close() })
		return s
	}
	prefix := testPrefix()
	s := newStore(prefix)

	t.Run("Suite", func(t *testing.T) { storagetest.Run(t, s) })

	t.Run("FactsNameThePrimary", func(t *testing.T) {
		d, err := s.Durability(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		n := d.(DurabilityFacts).Nodes
		if len(n) != 1 || n[0].Addr != sentinel.Primary.Addr || n[0].Role != "master" {
			t.Fatalf("nodes %+v, want the primary at %s", n, sentinel.Primary.Addr)
		}
	})

	t.Run("WrongSentinelPassword", func(t *testing.T) {
		bad := New(goredis.NewFailoverClient(&goredis.FailoverOptions{
			MasterName:    sentinel.MasterName,
			SentinelAddrs: []string{sentinel.Addr},
			// No password: the Sentinel refuses to say where the primary is.
		}), Options{KeyPrefix: prefix, Timeout: 2 * time.Second})
		defer bad.Close()
		_, err := bad.Reserve(t.Context(), storage.Key{Scope: "s", ID: "no-auth"}, fp, time.Minute)
		if err == nil {
			t.Fatal("Reserve through a Sentinel that refused the client succeeded")
		}
	})

	t.Run("Failover", func(t *testing.T) {
		ctx := t.Context()
		before := storage.Key{Scope: "s", ID: "before-failover"}
		tok := acquire(t, s, before, time.Minute)
		if err := s.Complete(ctx, before, tok, textResponse("first"), time.Hour); err != nil {
			t.Fatal(err)
		}
		sentinel.WaitReplicated(t)
		oldPrimary := sentinel.Primary.Addr
		sentinel.Failover(t)

		// The client learns of the switch from the Sentinel; until then an
		// operation may fail on the demoted primary (READONLY) and is
		// answered as a store error. Each attempt uses a key of its own,
		// so that one that failed after writing cannot shadow the next.
		var acquired storage.Key
		var token storage.Token
		for i, deadline := 0, time.Now().Add(60*time.Second); ; i++ {
			key := storage.Key{Scope: "s", ID: fmt.Sprintf("after-failover-%d", i)}
			res, err := s.Reserve(ctx, key, fp, time.Minute)
			if err == nil && res.Outcome == storage.Acquired {
				acquired, token = key, res.Token
				break
			}
			if err == nil {
				t.Fatalf("Reserve of a new key after the failover: %v, want acquired", res.Outcome)
			}
			if time.Now().After(deadline) {
				t.Fatalf("no reservation on the new primary within a minute: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		// Renewals follow the failover too, on their own client: it
		// learns of the switch from the Sentinel as well (until then a
		// batch may meet the demoted primary).
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			batch := []storage.Renewal{{Key: acquired, Token: token, Lease: time.Minute}}
			err := s.RenewBatch(ctx, batch)
			if err == nil && batch[0].Err == nil {
				break
			}
			if err == nil && errors.Is(batch[0].Err, storage.ErrLeaseLost) {
				t.Fatal("RenewBatch on the new primary: the lease is lost")
			}
			if time.Now().After(deadline) {
				t.Fatalf("no renewal on the new primary within a minute: %v, %v", err, batch[0].Err)
			}
		}
		if err := s.Complete(ctx, acquired, token, textResponse("second"), time.Hour); err != nil {
			t.Fatalf("Complete on the new primary: %v", err)
		}
		for key, body := range map[storage.Key]string{before: "first", acquired: "second"} {
			res, err := s.Reserve(ctx, key, fp, time.Minute)
			if err != nil || res.Outcome != storage.Replay || string(res.Record.Response.Body) != body {
				t.Fatalf("%s after the failover: %v %v, want a replay of %q", key.ID, res.Outcome, err, body)
			}
		}
		// The records live on the new primary, not only in the old one.
		admin := goredis.NewClient(&goredis.Options{Addr: sentinel.Primary.Addr})
		defer admin.Close()
		if sentinel.Primary.Addr == oldPrimary || admin.Exists(ctx, s.keyName(acquired)).Val() != 1 {
			t.Fatalf("the record is not on the promoted primary %s", sentinel.Primary.Addr)
		}

		// A waiter on another store (instance) still hears of completions.
		owner, waiter := s, newStore(prefix)
		key := storage.Key{Scope: "s", ID: "wait-after-failover"}
		tok = acquire(t, owner, key, time.Minute)
		done := make(chan error, 1)
		go func() { done <- waiter.Wait(context.Background(), key, time.Minute) }()
		for deadline := time.Now().Add(30 * time.Second); !admin.HExists(ctx, owner.keyName(key), "w").Val(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("no waiter registered within 30s")
			}
		}
		start := time.Now()
		if err := owner.Complete(ctx, key, tok, textResponse("waited"), time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("Wait after the failover: %v", err)
		}
		// Well under the minute the waiter would sit out unwoken.
		if took := time.Since(start); took > 20*time.Second {
			t.Fatalf("the waiter heard of the completion after %v, want at once", took)
		}
	})
}
