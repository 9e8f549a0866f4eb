package redis

import (
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/storagetest"
)

// TestConformanceWithAndWithoutPersistence runs the suite on private
// servers under both settings a deployment uses: no persistence (a cache
// that loses everything on restart) and an append-only file fsynced on
// every write, whose writes answer only once they are on disk.
func TestConformanceWithAndWithoutPersistence(t *testing.T) {
	for name, start := range map[string]func(testing.TB, ...string) *redistest.Server{
		"without persistence": redistest.StartServerArgs,
		"appendonly":          redistest.StartPersistentServer,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			storagetest.Run(t, newTestStore(t, start(t).Addr, Options{}))
		})
	}
}

// TestPersistentServerKeepsRecordsAcrossACrash checks what the persistent
// server is for: a record acknowledged before a crash (SIGKILL) is
// replayed after the restart, and a lease still fences.
func TestPersistentServerKeepsRecordsAcrossACrash(t *testing.T) {
	srv := redistest.StartPersistentServer(t)
	s := newTestStore(t, srv.Addr, Options{})
	ctx := t.Context()
	done := storage.Key{Scope: "persist", ID: "done"}
	running := storage.Key{Scope: "persist", ID: "running"}
	if err := s.Complete(ctx, done, acquire(t, s, done, time.Minute), textResponse("kept"), time.Hour); err != nil {
		t.Fatal(err)
	}
	tok := acquire(t, s, running, time.Minute)

	srv.Restart(t) // kills it first

	res, err := s.Reserve(ctx, done, fp, time.Minute)
	if err != nil || res.Outcome != storage.Replay || string(res.Record.Response.Body) != "kept" {
		t.Fatalf("after the crash: Reserve(done) = %v, %v; want the recorded replay", res.Outcome, err)
	}
	if res, err := s.Reserve(ctx, running, fp, time.Minute); err != nil || res.Outcome != storage.Conflict {
		t.Fatalf("after the crash: Reserve(running) = %v, %v; want conflict", res.Outcome, err)
	}
	if err := s.Complete(ctx, running, tok, textResponse("late"), time.Hour); err != nil {
		t.Fatalf("the lease taken before the crash: Complete: %v", err)
	}
}

// The facts warn of what a server may lose without a fault of the
// store's: keys evicted under an evicting maxmemory-policy (named, with
// the fix), and every record on a restart of a primary that keeps
// nothing on disk and has no replica; a persistent noeviction server is
// fine. (The facts are the start-up line's and GET /idempotency/stores'.)
func TestFactsWarnOfEvictionAndOfNoPersistence(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(testing.TB) *redistest.Server
		want  []string // in the error; none: no error
	}{
		{"allkeys-lru", func(t testing.TB) *redistest.Server {
			return redistest.StartServerArgs(t, "--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru", "--appendonly", "yes")
		}, []string{"maxmemory-policy allkeys-lru", "maxmemory 104857600", "set maxmemory-policy noeviction"}},
		{"volatile-ttl", func(t testing.TB) *redistest.Server {
			return redistest.StartServerArgs(t, "--maxmemory-policy", "volatile-ttl", "--appendonly", "yes")
		}, []string{"maxmemory-policy volatile-ttl", "noeviction"}},
		{"nothing on disk", func(t testing.TB) *redistest.Server {
			return redistest.StartServerArgs(t, "--save", "", "--appendonly", "no")
		}, []string{"keeps nothing on disk", "a restart loses every record", "appendonly"}},
		{"appendonly, noeviction", func(t testing.TB) *redistest.Server {
			return redistest.StartServerArgs(t, "--appendonly", "yes", "--maxmemory-policy", "noeviction")
		}, nil},
		{"snapshots", func(t testing.TB) *redistest.Server {
			return redistest.StartServerArgs(t, "--save", "3600 1", "--appendonly", "no")
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestStore(t, tc.start(t).Addr, Options{})
			facts, err := s.Durability(t.Context())
			if facts == nil {
				t.Fatalf("no facts: %v", err)
			}
			node := facts.(DurabilityFacts).Nodes[0]
			if node.MaxmemoryPolicy == unknown || node.Save == unknown || node.Maxmemory == unknown {
				t.Fatalf("facts lack the memory policy or the snapshots: %+v", node)
			}
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Durability: %v, want no warning", err)
				}
				return
			}
			if err == nil || storage.Unavailable(err) {
				t.Fatalf("Durability: %v, want a warning (the store still works)", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the warning does not say %q: %v", w, err)
				}
			}
		})
	}
}
