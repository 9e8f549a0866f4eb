//go:build unix

package postgres_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/servers"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

// notReplicatedOps records the calls of Options.OnNotReplicated.
type notReplicatedOps struct {
	mu  sync.Mutex
	ops []string
}

func (n *notReplicatedOps) add(op string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.ops = append(n.ops, op)
}

func (n *notReplicatedOps) take() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := n.ops
	n.ops = nil
	return out
}

// cutStandby is a private primary whose synchronous standby streams
// through a proxy the test cuts, and a store on the primary made as the
// Caddy module makes it, whose timeout cancels a commit's wait.
type cutStandby struct {
	primary, standby *servers.Postgres
	link             *caddyproc.Proxy
	store            *postgres.Store
	notReplicated    *notReplicatedOps
}

func newCutStandby(t *testing.T) *cutStandby {
	t.Helper()
	c := &cutStandby{notReplicated: &notReplicatedOps{}}
	_, c.primary, c.standby = pgtest.ReplicatedVia(t, func(addr string) string {
		var err error
		if c.link, err = caddyproc.NewProxy(addr); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.link.Close)
		return c.link.Addr
	})
	cfg, err := postgres.NewPoolConfig(c.primary.DSN, 4)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.store, err = postgres.New(pool, postgres.Options{CreateTable: true, Timeout: time.Second, CleanupInterval: -1,
		OnNotReplicated: c.notReplicated.add})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.store.Close() })
	if err := c.store.Ping(context.Background()); err != nil {
		t.Fatal(err) // creates the table, before commits wait for the standby
	}
	if err := c.primary.AlterSystem("synchronous_standby_names", "*"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "the standby turns synchronous", func() bool {
		d, err := c.store.Facts(context.Background())
		return err == nil && len(d.Standbys) == 1 && d.Standbys[0].SyncState == "sync"
	})
	return c
}

// wantNotReplicated fails unless err says that the commit is on the
// primary alone: ErrNotReplicated, unavailable (so that on_storage_error
// applies).
func wantNotReplicated(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, storage.ErrNotReplicated) || !storage.Unavailable(err) {
		t.Fatalf("%s: %v; want an error wrapping ErrNotReplicated and ErrUnavailable", what, err)
	}
}

// TestACancelledWaitForTheSynchronousStandbyIsNotReplicated: with the
// synchronous standby cut off, a commit waits for it until the store's
// timeout cancels the wait, and PostgreSQL answers the cancelled wait
// with a warning and success: committed on the primary alone. The store
// reads the warning: the reservation fails as not replicated (holding its
// key on the primary, for fail_open), the completion too, and so does
// the completion sent again while the standby is away; once the standby
// is back, the completion sent again is acknowledged (the record is the
// lease's, completed already). A connection that carried the warning
// does not taint the next statement on it. Before the fix, the
// reservation and the completion both succeeded.
func TestACancelledWaitForTheSynchronousStandbyIsNotReplicated(t *testing.T) {
	c := newCutStandby(t)
	s := c.store
	ctx := context.Background()
	key := func(id string) storage.Key { return storage.Key{Scope: "sync-cut", ID: id} }

	running, err := s.Reserve(ctx, key("running"), fpA, time.Minute)
	if err != nil || running.Outcome != storage.Acquired {
		t.Fatalf("reserve with the standby in sync: %+v, %v", running, err)
	}

	c.link.Cut()
	// The facts say it once the primary saw the standby go, as the
	// start-up line and the admin API show them.
	testutil.Eventually(t, time.Minute, "the facts say that no synchronous standby streams", func() bool {
		_, err := s.Facts(ctx)
		return errors.Is(err, storage.ErrNotReplicated) && storage.Unavailable(err)
	})
	start := time.Now()
	res, err := s.Reserve(ctx, key("cut"), fpA, time.Minute)
	wantNotReplicated(t, "reserve with the standby cut off", err)
	if took := time.Since(start); took < time.Second {
		t.Errorf("reserve failed after %v, before the store's timeout cancelled the wait", took)
	}
	if res.Outcome != storage.Acquired || res.Token == 0 {
		t.Errorf("reserve with the standby cut off: %+v; want the reservation the primary holds (acquired, its token)", res)
	}
	err = s.Complete(ctx, key("running"), running.Token, textResponse("done"), time.Hour)
	wantNotReplicated(t, "complete with the standby cut off", err)
	err = s.Complete(ctx, key("running"), running.Token, textResponse("done"), time.Hour)
	wantNotReplicated(t, "the completion sent again with the standby still cut off", err)
	if got := c.notReplicated.take(); !slices.Equal(got, []string{"reserve", "complete", "complete"}) {
		t.Errorf("OnNotReplicated %q; want reserve, complete, complete", got)
	}
	if d, _ := s.Facts(ctx); d.SyncWaitsCancelled != 3 {
		t.Errorf("facts say %d waits cancelled, want 3", d.SyncWaitsCancelled)
	}
	// A release is not waited for: its loss in a failover costs a 409
	// until the lease lapses, never a second run.
	if err := s.Release(ctx, key("cut"), res.Token); err != nil {
		t.Errorf("release with the standby cut off: %v", err)
	}
	if got := c.notReplicated.take(); len(got) != 0 {
		t.Errorf("OnNotReplicated %q for a release", got)
	}
	// The record is on the primary: its replay is served there.
	if rec, err := s.Get(ctx, key("running"), true); err != nil || rec.State != storage.Completed {
		t.Fatalf("get on the primary: %+v, %v; want it completed", rec, err)
	}
	// A retry is answered from the record, as the primary has it: a
	// replay, or a mismatch, changes nothing and waits for no standby.
	// (It failed as not replicated, and fail_open ran the request again.)
	if res, err := s.Reserve(ctx, key("running"), fpA, time.Minute); err != nil || res.Outcome != storage.Replay {
		t.Fatalf("the retry of the completed key with the standby cut off: %+v, %v; want the replay", res, err)
	}
	if res, err := s.Reserve(ctx, key("running"), fpB, time.Minute); err != nil || res.Outcome != storage.Mismatch {
		t.Fatalf("another request with the completed key, the standby cut off: %+v, %v; want the mismatch", res, err)
	}
	c.notReplicated.take() // the retries' waits, if they took a lock

	if err := c.link.Restore(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "the completion sent again is acknowledged once the standby is back", func() bool {
		err = s.Complete(ctx, key("running"), running.Token, textResponse("done"), time.Hour)
		return !errors.Is(err, storage.ErrNotReplicated)
	})
	if !errors.Is(err, storage.ErrLeaseLost) || storage.Unavailable(err) {
		t.Fatalf("the completion sent again with the standby back: %v; want ErrLeaseLost (completed by this lease already)", err)
	}
	c.notReplicated.take() // those sent again before the standby was back
	// Every connection of the pool carried a warning by now; none is
	// taken for the next commit's.
	for i := range 8 {
		if res, err := s.Reserve(ctx, key("after-"+string(rune('a'+i))), fpA, time.Minute); err != nil || res.Outcome != storage.Acquired {
			t.Fatalf("reserve %d with the standby back: %+v, %v", i, res, err)
		}
	}
	if got := c.notReplicated.take(); len(got) != 0 {
		t.Errorf("OnNotReplicated %q with the standby back", got)
	}
}

// TestACompletionTheStandbyMissedLandsOnThePromotedStandby: the standby
// is cut off while a request runs, its completion's wait is cancelled,
// and the primary dies: the promoted standby holds the reservation in
// flight under the request's lease (a retry would run again once it
// lapsed). The completion, sent again, lands there; before the fix the
// store answered the completion with success and nobody sent it again.
func TestACompletionTheStandbyMissedLandsOnThePromotedStandby(t *testing.T) {
	c := newCutStandby(t)
	ctx := context.Background()
	key := storage.Key{Scope: "sync-cut", ID: "promoted"}

	res, err := c.store.Reserve(ctx, key, fpA, time.Minute)
	if err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("reserve with the standby in sync: %+v, %v", res, err)
	}
	c.link.Cut()
	wantNotReplicated(t, "complete with the standby cut off", c.store.Complete(ctx, key, res.Token, textResponse("done"), time.Hour))

	c.primary.Kill()
	if err := c.standby.Promote(); err != nil {
		t.Fatal(err)
	}
	onPromoted := failoverStore(t, c.standby.DSN)
	rec, err := onPromoted.Get(ctx, key, false)
	if err != nil || rec.State != storage.InFlight || rec.Token != res.Token {
		t.Fatalf("the promoted standby holds %+v, %v; want the reservation in flight under the request's lease", rec, err)
	}
	if err := onPromoted.Complete(ctx, key, res.Token, textResponse("done"), time.Hour); err != nil {
		t.Fatalf("the completion sent again to the promoted standby: %v", err)
	}
	if r, err := onPromoted.Reserve(ctx, key, fpA, time.Minute); err != nil || r.Outcome != storage.Replay || string(r.Record.Response.Body) != "done" {
		t.Fatalf("a retry on the promoted standby: %+v, %v; want the replay", r, err)
	}
}

// textResponse is a 200 answer with body.
func textResponse(body string) *storage.Response {
	return &storage.Response{Status: 200, Body: []byte(body)}
}
