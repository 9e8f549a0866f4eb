package redis

import (
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
