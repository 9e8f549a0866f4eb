package postgres_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

// Adversarial tests of the batcher (batch.go). Every batch is set up
// deterministically, on a store that sends one batch of each kind at a
// time and waits for a locked row for longer than any test
// (oneSenderStore): a reserve (or completion) held back on a row lock is
// the batch out, the requests started meanwhile queue (Queued), and the
// batch that follows is held on a row another transaction is inserting
// (holdKey) for as long as the test needs it in flight.

// holdKey inserts (scope, id) in a transaction it keeps open until
// release (or the test's end): a reserve of that key waits for it.
func holdKey(t *testing.T, dsn, table, scope, id string) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	ok(t, err)
	tx, err := conn.Begin(ctx)
	ok(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO `+table+` (scope, key, fingerprint, state, token, created_at, expires_at)
		VALUES ($1, $2, '\x00', 1, 1, now(), now() + interval '1 minute')`, scope, id)
	ok(t, err)
	var once sync.Once
	release = func() {
		once.Do(func() {
			tx.Rollback(ctx)
			conn.Close(ctx)
		})
	}
	t.Cleanup(release)
	return release
}

// lockWaits counts the statements on table waiting for a lock.
func lockWaits(t *testing.T, dsn, table string) int {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	ok(t, err)
	defer conn.Close(ctx)
	var n int
	ok(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, table).Scan(&n))
	return n
}

// queued waits until n statements wait for the next batch.
func queued(t *testing.T, s *postgres.Store, n int) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, "requests queued for the next batch", func() bool { return s.Queued() >= n })
}

// drainers counts the goroutines sending batches.
func drainers() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "(*batcher).drain")
		}
		buf = make([]byte, 2*len(buf))
	}
}

type reserveResult struct {
	res storage.Reservation
	err error
}

// goReserve starts a Reserve and returns where its result arrives.
func goReserve(ctx context.Context, s *postgres.Store, key storage.Key, fp []byte) <-chan reserveResult {
	ch := make(chan reserveResult, 1)
	go func() {
		res, err := s.Reserve(ctx, key, fp, time.Minute)
		ch <- reserveResult{res, err}
	}()
	return ch
}

// receive waits for a result that must come while the test holds
// everything else still.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not return", what)
		panic("unreachable")
	}
}

// TestAdversarialBatchSameKeyMixedFingerprints: three reserves of one key
// (two fingerprints) and two of a key whose record expired queue at once:
// a batch holds one statement per key (the others wait for its answer,
// then go in the next), and exactly one wins each key; each other request
// sees the winner's row, in flight (Conflict) for the same fingerprint,
// Mismatch for the other.
func TestAdversarialBatchSameKeyMixedFingerprints(t *testing.T) {
	dsn := pgtest.Require(t)
	s := oneSenderStore(t, postgres.Options{})
	expired := storage.Key{Scope: "adv", ID: "expired"}
	completed(t, s, expired, time.Hour)
	pgtest.Exec(t, dsn, `UPDATE `+s.Table()+` SET expires_at = now() - interval '1 second' WHERE key = 'expired'`)

	release, blocked := blockedReserve(t, s, dsn)
	fresh := storage.Key{Scope: "adv", ID: "fresh"}
	type req struct {
		key storage.Key
		fp  []byte
		ch  <-chan reserveResult
	}
	var reqs []req
	for _, r := range []struct {
		key storage.Key
		fp  []byte
	}{{fresh, fpA}, {fresh, fpB}, {fresh, fpA}, {expired, fpA}, {expired, fpA}} {
		reqs = append(reqs, req{r.key, r.fp, goReserve(t.Context(), s, r.key, r.fp)})
	}
	queued(t, s, len(reqs))
	release()
	ok(t, blocked())

	results := make([]reserveResult, len(reqs))
	for i, r := range reqs {
		results[i] = receive(t, r.ch, "a reserve")
	}
	if _, largest, _, _ := s.BatchStats(); largest != 2 {
		t.Fatalf("the largest batch held %d statements, want 2 (one per key)", largest)
	}
	for _, key := range []storage.Key{fresh, expired} {
		var winner []byte
		for i, r := range reqs {
			if r.key != key {
				continue
			}
			if results[i].err != nil {
				t.Fatalf("reserve %s: %v", key.ID, results[i].err)
			}
			if results[i].res.Outcome == storage.Acquired {
				if winner != nil {
					t.Fatalf("key %s: two winners in one batch", key.ID)
				}
				winner = r.fp
			}
		}
		if winner == nil {
			t.Fatalf("key %s: no winner", key.ID)
		}
		for i, r := range reqs {
			if r.key != key || results[i].res.Outcome == storage.Acquired {
				continue
			}
			want := storage.Conflict
			if string(r.fp) != string(winner) {
				want = storage.Mismatch
			}
			if got := results[i].res.Outcome; got != want {
				t.Errorf("key %s, a loser: %v, want %v", key.ID, got, want)
			}
			if results[i].res.Token != 0 {
				t.Errorf("key %s: a loser learnt a token", key.ID)
			}
		}
	}
}

// batchHeldOnARow returns a store whose next batch will wait for the row
// of adv/zz-held until hold is called, and a lone reserve blocked in
// front of it: the reserves queued before release go out as one batch.
func batchHeldOnARow(t *testing.T) (dsn string, s *postgres.Store, hold, release func(), blocked func() error) {
	t.Helper()
	dsn = pgtest.Require(t)
	s = oneSenderStore(t, postgres.Options{})
	completed(t, s, storage.Key{Scope: "warm", ID: "up"}, time.Hour)
	hold = holdKey(t, dsn, s.Table(), "adv", "zz-held")
	release, blocked = blockedReserve(t, s, dsn)
	return dsn, s, hold, release, blocked
}

// TestAdversarialBatchMemberCancelledInFlight: of a batch held on a row
// lock, one member's caller gives up. It returns at once, with a token
// (its outcome is unknown); the batch runs on for the others, which get
// their own answers; and the reservation it committed for the member that
// left is the token's, so the caller can release it: the key is not stuck.
func TestAdversarialBatchMemberCancelledInFlight(t *testing.T) {
	dsn, s, hold, release, blocked := batchHeldOnARow(t)
	ctxA, cancelA := context.WithCancel(t.Context())
	defer cancelA()
	keyA := storage.Key{Scope: "adv", ID: "a"}
	chA := goReserve(ctxA, s, keyA, fpA)
	chB := goReserve(t.Context(), s, storage.Key{Scope: "adv", ID: "b"}, fpA)
	chC := goReserve(t.Context(), s, storage.Key{Scope: "adv", ID: "zz-held"}, fpA)
	queued(t, s, 3)
	release()
	ok(t, blocked())
	// The batch (a, b, then zz-held) is out and waits for the held row.
	pgtest.WaitForLockWait(t, dsn, s.Table())

	cancelA()
	a := receive(t, chA, "the cancelled member")
	if !errors.Is(a.err, context.Canceled) || storage.Unavailable(a.err) || a.res.Token == 0 {
		t.Fatalf("the cancelled member: %v, token %d; want context.Canceled (not an outage) with its token", a.err, a.res.Token)
	}
	if n := lockWaits(t, dsn, s.Table()); n != 1 {
		t.Fatalf("%d statements wait for the held row after one member left, want the batch still waiting", n)
	}

	hold()
	for _, ch := range []<-chan reserveResult{chB, chC} {
		r := receive(t, ch, "a member still waiting")
		if r.err != nil || r.res.Outcome != storage.Acquired {
			t.Fatalf("a member that kept waiting: %v %v, want acquired", r.res.Outcome, r.err)
		}
	}
	if _, largest, _, _ := s.BatchStats(); largest != 3 {
		t.Fatalf("the batch held %d statements, want 3", largest)
	}
	// The batch committed: the key that the cancelled member reserved is
	// in flight under the token it was given, which releases it.
	rec, err := s.Get(t.Context(), keyA, false)
	ok(t, err)
	if rec.State != storage.InFlight || rec.Token != a.res.Token {
		t.Fatalf("the cancelled member's key: %v token %d, want in flight under its token %d", rec.State, rec.Token, a.res.Token)
	}
	ok(t, s.Release(t.Context(), keyA, a.res.Token))
	if got := outcome(t, s, keyA, fpB); got != storage.Acquired {
		t.Fatalf("the released key: %v, want acquired", got)
	}
}

// TestAdversarialBatchAllMembersLeaveCancelsIt: once every member of a
// batch held on a row lock has given up, the batch is cancelled on the
// server (nothing waits for the lock any more) and rolled back (the key
// it had inserted before waiting is absent); the batcher then serves new
// requests, and its goroutine is gone.
func TestAdversarialBatchAllMembersLeaveCancelsIt(t *testing.T) {
	dsn, s, hold, release, blocked := batchHeldOnARow(t)
	ctxA, cancelA := context.WithCancel(t.Context())
	defer cancelA()
	ctxB, cancelB := context.WithCancel(t.Context())
	defer cancelB()
	first := storage.Key{Scope: "adv", ID: "a-first"}
	chA := goReserve(ctxA, s, first, fpA)
	chB := goReserve(ctxB, s, storage.Key{Scope: "adv", ID: "zz-held"}, fpA)
	queued(t, s, 2)
	release()
	ok(t, blocked())
	pgtest.WaitForLockWait(t, dsn, s.Table())

	cancelA()
	if r := receive(t, chA, "the first member"); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the first member: %v, want context.Canceled", r.err)
	}
	if n := lockWaits(t, dsn, s.Table()); n != 1 {
		t.Fatalf("%d statements wait with one member left, want the batch", n)
	}
	cancelB()
	if r := receive(t, chB, "the last member"); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the last member: %v, want context.Canceled", r.err)
	}
	testutil.Eventually(t, 30*time.Second, "the abandoned batch cancelled on the server", func() bool {
		return lockWaits(t, dsn, s.Table()) == 0
	})
	testutil.Eventually(t, 30*time.Second, "the batch goroutine gone", func() bool { return drainers() == 0 })
	hold()

	if _, err := s.Get(t.Context(), first, false); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("the key the cancelled batch inserted: %v, want it rolled back", err)
	}
	if got := outcome(t, s, first, fpA); got != storage.Acquired {
		t.Fatalf("a reserve after the cancelled batch: %v, want acquired", got)
	}
	if got := outcome(t, s, storage.Key{Scope: "adv", ID: "zz-held"}, fpA); got != storage.Acquired {
		t.Fatalf("the held key after its holder rolled back: %v, want acquired", got)
	}
}

// TestAdversarialBatchRunsForAMemberWithoutDeadline: a batch holds one
// member with a deadline and one without (a store with no Timeout, a
// caller's context with no deadline). When the first member's deadline
// passes while the batch waits on a row lock, that member leaves, but the
// batch must run on for the other, whose context never ends: "the batch
// runs until the latest deadline among its statements", and no deadline
// is the latest. Cutting it at the first member's deadline makes the
// patient member fail with an outage it never had (on a pool whose
// contexts end by closing the connection, pgx's default).
func TestAdversarialBatchRunsForAMemberWithoutDeadline(t *testing.T) {
	dsn := pgtest.Require(t)
	s := oneSenderStore(t, postgres.Options{}) // no Timeout; pgx's default pool
	completed(t, s, storage.Key{Scope: "warm", ID: "up"}, time.Hour)
	hold := holdKey(t, dsn, s.Table(), "adv", "a-held")

	release, blocked := blockedReserve(t, s, dsn)
	// The deadline only has to outlast queueing two requests behind the
	// blocked one (milliseconds); the batch is checked to hold both.
	ctxShort, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	chShort := goReserve(ctxShort, s, storage.Key{Scope: "adv", ID: "short"}, fpA)
	chPatient := goReserve(context.Background(), s, storage.Key{Scope: "adv", ID: "a-held"}, fpA)
	queued(t, s, 2)
	release()
	ok(t, blocked())
	pgtest.WaitForLockWait(t, dsn, s.Table())

	short := receive(t, chShort, "the member with a deadline")
	if !errors.Is(short.err, context.DeadlineExceeded) {
		t.Fatalf("the member with a deadline: %v, want its deadline", short.err)
	}
	if _, largest, _, _ := s.BatchStats(); largest != 2 {
		t.Fatalf("the batch held %d statements, want both (the deadline passed before it went out?)", largest)
	}
	hold()
	p := receive(t, chPatient, "the member without a deadline")
	if p.err != nil || p.res.Outcome != storage.Acquired {
		t.Fatalf("the member without a deadline: %v %v, want acquired once the lock went (the batch was cut at the other member's deadline)", p.res.Outcome, p.err)
	}
}

// TestAdversarialBatchCompleteFencing: completions of one key queue at
// once (they go one per batch): one with the token of a lease that lapsed
// and was taken over, and two with the current token. The stale one changes nothing
// (ErrLeaseLost), exactly one of the current ones records the response,
// and the other finds the key completed (ErrLeaseLost).
func TestAdversarialBatchCompleteFencing(t *testing.T) {
	dsn := pgtest.Require(t)
	s := oneSenderStore(t, postgres.Options{})
	key := storage.Key{Scope: "adv", ID: "fenced"}
	stale := acquire(t, s, key, fpA, time.Minute)
	pgtest.Exec(t, dsn, `UPDATE `+s.Table()+` SET expires_at = now() - interval '1 second' WHERE key = 'fenced'`)
	current := acquire(t, s, key, fpA, time.Minute)
	if current == stale {
		t.Fatal("the takeover kept the token")
	}

	releaseC, blockedC := blockedComplete(t, s, dsn)
	bodies := []string{"stale", "current 1", "current 2"}
	tokens := []storage.Token{stale, current, current}
	errs := make([]error, len(bodies))
	var wg sync.WaitGroup
	for i := range bodies {
		wg.Go(func() {
			errs[i] = s.Complete(t.Context(), key, tokens[i], &storage.Response{Status: 201, Body: []byte(bodies[i])}, time.Hour)
		})
	}
	queued(t, s, len(bodies))
	releaseC()
	ok(t, blockedC())
	wg.Wait()
	if _, _, _, largest := s.BatchStats(); largest != 1 {
		t.Fatalf("the largest batch of completions held %d statements, want 1 (one per key)", largest)
	}
	if !errors.Is(errs[0], storage.ErrLeaseLost) {
		t.Fatalf("the stale lease's completion: %v, want ErrLeaseLost", errs[0])
	}
	var won string
	for i := 1; i < len(bodies); i++ {
		switch {
		case errs[i] == nil && won == "":
			won = bodies[i]
		case errs[i] == nil:
			t.Fatalf("both completions with the current token succeeded")
		case !errors.Is(errs[i], storage.ErrLeaseLost):
			t.Fatalf("completion %q: %v, want nil or ErrLeaseLost", bodies[i], errs[i])
		}
	}
	if won == "" {
		t.Fatal("no completion with the current token succeeded")
	}
	res, err := s.Reserve(t.Context(), key, fpA, time.Minute)
	if err != nil || res.Outcome != storage.Replay || string(res.Record.Response.Body) != won {
		t.Fatalf("the fenced key: %v %v, want the replay of %q", res.Outcome, err, won)
	}
}

// TestAdversarialRefusedCompleteBatch: a completion the server refuses
// rolls its batch back; the other completion of the batch, rerun alone,
// records its response (its first run was rolled back, so it must not
// report a lost lease), and the refused one's lease is still its own.
func TestAdversarialRefusedCompleteBatch(t *testing.T) {
	dsn := pgtest.Require(t)
	s := oneSenderStore(t, postgres.Options{})
	good, bad := storage.Key{Scope: "adv", ID: "good"}, storage.Key{Scope: "adv", ID: "bad"}
	goodTok := acquire(t, s, good, fpA, time.Minute)
	badTok := acquire(t, s, bad, fpA, time.Minute)
	pgtest.Exec(t, dsn, `ALTER TABLE `+s.Table()+` ADD CONSTRAINT refuse_teapot CHECK (status IS DISTINCT FROM 418)`)

	releaseC, blockedC := blockedComplete(t, s, dsn)
	var goodErr, badErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		goodErr = s.Complete(t.Context(), good, goodTok, &storage.Response{Status: 201, Body: []byte("good")}, time.Hour)
	})
	wg.Go(func() {
		badErr = s.Complete(t.Context(), bad, badTok, &storage.Response{Status: 418}, time.Hour)
	})
	queued(t, s, 2)
	releaseC()
	ok(t, blockedC())
	wg.Wait()
	if _, _, _, largest := s.BatchStats(); largest != 2 {
		t.Fatalf("the batch of completions held %d statements, want 2", largest)
	}
	if goodErr != nil {
		t.Fatalf("the completion refused with its batch: %v, want it recorded on its own", goodErr)
	}
	var pgErr *pgconn.PgError
	if !errors.As(badErr, &pgErr) || pgErr.Code != "23514" || storage.Unavailable(badErr) {
		t.Fatalf("the refused completion: %v, want its check violation", badErr)
	}
	res, err := s.Reserve(t.Context(), good, fpA, time.Minute)
	if err != nil || res.Outcome != storage.Replay || string(res.Record.Response.Body) != "good" {
		t.Fatalf("the good key: %v %v, want its replay", res.Outcome, err)
	}
	ok(t, s.Release(t.Context(), bad, badTok))
}

// TestAdversarialBatchBadInputs: the batched operations refuse what they
// cannot run without panicking and without a round trip that could leave
// a batch behind.
func TestAdversarialBatchBadInputs(t *testing.T) {
	pgtest.Require(t)
	s := newStore(t, postgres.Options{})
	ctx := t.Context()
	key := storage.Key{Scope: "adv", ID: "inputs"}
	if err := s.Complete(ctx, key, 1, nil, time.Hour); err == nil {
		t.Error("Complete with a nil response succeeded")
	}
	if err := s.Complete(ctx, key, 0, &storage.Response{Status: 200}, time.Hour); !errors.Is(err, storage.ErrLeaseLost) {
		t.Errorf("Complete with the zero token: %v, want ErrLeaseLost", err)
	}
	if err := s.Complete(ctx, key, 1, &storage.Response{Status: 200}, 0); !errors.Is(err, storage.ErrInvalid) {
		t.Errorf("Complete with no ttl: %v, want ErrInvalid", err)
	}
	if _, err := s.Reserve(ctx, key, fpA, 0); !errors.Is(err, storage.ErrInvalid) {
		t.Errorf("Reserve with no lease: %v, want ErrInvalid", err)
	}
	if _, err := s.Reserve(ctx, storage.Key{}, fpA, time.Minute); err == nil {
		// An empty key may be refused or stored; it must not panic, and a
		// reserve of it must then be a definite answer.
		if got := outcome(t, s, storage.Key{}, fpA); got != storage.Conflict {
			t.Errorf("the empty key reserved twice: %v, want a conflict", got)
		}
	}
	// A nil fingerprint is an empty one, in a batch as alone.
	res, err := s.Reserve(ctx, key, nil, time.Minute)
	if err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("Reserve with a nil fingerprint: %v %v", res.Outcome, err)
	}
	if got := outcome(t, s, key, []byte{}); got != storage.Conflict {
		t.Errorf("the same key with an empty fingerprint: %v, want a conflict", got)
	}
	if n := s.Queued(); n != 0 {
		t.Errorf("%d statements left queued", n)
	}
}

// blockedLeader is blockedReserve on a key of one's own, so that two
// stores on one table can each have a batch out.
func blockedLeader(t *testing.T, s *postgres.Store, dsn, id string) (release func(), wait func() error) {
	t.Helper()
	release = holdKey(t, dsn, s.Table(), "block", id)
	before := lockWaits(t, dsn, s.Table())
	done := make(chan error, 1)
	go func() {
		_, err := s.Reserve(context.Background(), storage.Key{Scope: "block", ID: id}, fpA, time.Minute)
		done <- err
	}()
	testutil.Eventually(t, 30*time.Second, "the leader waiting for its lock", func() bool {
		return lockWaits(t, dsn, s.Table()) > before
	})
	return release, func() error { return receive(t, done, "the blocked leader") }
}

// TestAdversarialTwoBatchesTakeRowsInOneOrder: two instances (stores on
// one table) each send a batch that takes over the same two expired keys,
// which their requests named in opposite orders, and each batch pauses on
// a row lock after its first key. Were the statements run in arrival
// order, each batch would hold one key and wait for the other's
// (a deadlock PostgreSQL breaks by rolling one back); in (scope, key)
// order the second batch waits for the first, which finishes: no
// deadlock, no retry, and the first batch wins both keys.
func TestAdversarialTwoBatchesTakeRowsInOneOrder(t *testing.T) {
	dsn := pgtest.Require(t)
	table := pgtest.Table(t, dsn)
	s1 := oneSenderStore(t, postgres.Options{Table: table})
	s2 := oneSenderStore(t, postgres.Options{Table: table})
	k1, k2 := storage.Key{Scope: "adv", ID: "k1"}, storage.Key{Scope: "adv", ID: "k2"}
	completed(t, s1, k1, time.Hour)
	completed(t, s1, k2, time.Hour)
	pgtest.Exec(t, dsn, `UPDATE `+s1.Table()+` SET expires_at = now() - interval '1 second' WHERE key IN ('k1', 'k2')`)
	hold1 := holdKey(t, dsn, table, "adv", "k1-pause-1")
	hold2 := holdKey(t, dsn, table, "adv", "k1-pause-2")

	release1, blocked1 := blockedLeader(t, s1, dsn, "leader-1")
	release2, blocked2 := blockedLeader(t, s2, dsn, "leader-2")
	var chs1, chs2 []<-chan reserveResult
	// Each request queues before the next starts: the queues hold them
	// in these (opposite) orders.
	for i, id := range []string{"k2", "k1-pause-1", "k1"} {
		chs1 = append(chs1, goReserve(t.Context(), s1, storage.Key{Scope: "adv", ID: id}, fpA))
		queued(t, s1, i+1)
	}
	for i, id := range []string{"k1", "k1-pause-2", "k2"} {
		chs2 = append(chs2, goReserve(t.Context(), s2, storage.Key{Scope: "adv", ID: id}, fpA))
		queued(t, s2, i+1)
	}

	// The first batch takes k1 and pauses; then the second goes out.
	release1()
	ok(t, blocked1())
	testutil.Eventually(t, 30*time.Second, "the first batch paused", func() bool {
		return lockWaits(t, dsn, table) == 2 // it, and the second leader
	})
	release2()
	ok(t, blocked2())
	testutil.Eventually(t, 30*time.Second, "the second batch out", func() bool {
		return lockWaits(t, dsn, table) == 2 // the first batch, and the second (on k1 or its pause)
	})
	// The first batch goes on and commits (k2 among its rows) before the
	// second is let go: let go together, the second could reach k2 first
	// (it waits on its own pause key, not on the first batch).
	hold1()
	for _, ch := range chs1 {
		if r := receive(t, ch, "a reserve of the first batch"); r.err != nil || r.res.Outcome != storage.Acquired {
			t.Errorf("the first batch: %v %v, want acquired", r.res.Outcome, r.err)
		}
	}
	hold2()
	for i, ch := range chs2 {
		want := storage.Conflict
		if i == 1 {
			want = storage.Acquired // its own pause key
		}
		if r := receive(t, ch, "a reserve of the second batch"); r.err != nil || r.res.Outcome != want {
			t.Errorf("the second batch, request %d: %v %v, want %v", i, r.res.Outcome, r.err, want)
		}
	}
	if _, l1, _, _ := s1.BatchStats(); l1 != 3 {
		t.Fatalf("the first batch held %d statements, want 3", l1)
	}
	if _, l2, _, _ := s2.BatchStats(); l2 != 3 {
		t.Fatalf("the second batch held %d statements, want 3", l2)
	}
	if r1, r2 := s1.Retries(), s2.Retries(); r1+r2 != 0 {
		t.Fatalf("%d and %d rounds rolled back for a conflict (a deadlock between the batches), want none", r1, r2)
	}
}

// TestAdversarialBatchAgainstCleanup: unlike a statement alone, a batch
// holds several rows, and cleanup's DELETE takes its expired rows in
// their physical order, not in (scope, key) order. A batch that took
// over expired key a and pauses before expired key b, while cleanup has
// deleted b and waits for a, closes a cycle that PostgreSQL breaks after
// deadlock_timeout by rolling one side back. Either way nothing is lost:
// cleanup retries, a refused batch reruns each statement alone, and
// every reserve ends with the key acquired, once.
func TestAdversarialBatchAgainstCleanup(t *testing.T) {
	dsn := pgtest.Require(t)
	s := oneSenderStore(t, postgres.Options{CleanupInterval: -1})
	// b first, so that its row lies before a's.
	keyA, keyB := storage.Key{Scope: "adv", ID: "a"}, storage.Key{Scope: "adv", ID: "b"}
	completed(t, s, keyB, time.Hour)
	completed(t, s, keyA, time.Hour)
	pgtest.Exec(t, dsn, `UPDATE `+s.Table()+` SET expires_at = now() - interval '1 second' WHERE key IN ('a', 'b')`)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	ok(t, err)
	defer conn.Close(ctx)
	var physicalOrder bool
	ok(t, conn.QueryRow(ctx, `SELECT (SELECT ctid FROM `+s.Table()+` WHERE key = 'b') < (SELECT ctid FROM `+s.Table()+` WHERE key = 'a')`).Scan(&physicalOrder))
	if !physicalOrder {
		t.Fatal("precondition: b's row does not lie before a's")
	}
	var deadlocksBefore int64
	ok(t, conn.QueryRow(ctx, `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&deadlocksBefore))

	hold := holdKey(t, dsn, s.Table(), "adv", "a-pause")
	release, blocked := blockedReserve(t, s, dsn)
	var chs []<-chan reserveResult
	for i, k := range []storage.Key{keyA, {Scope: "adv", ID: "a-pause"}, keyB} {
		chs = append(chs, goReserve(t.Context(), s, k, fpA))
		queued(t, s, i+1)
	}
	release()
	ok(t, blocked())
	pgtest.WaitForLockWait(t, dsn, s.Table()) // the batch took a, waits at a-pause

	type cleanupResult struct {
		n   int64
		err error
	}
	cleaned := make(chan cleanupResult, 1)
	go func() {
		n, err := s.CleanupNow(context.Background())
		cleaned <- cleanupResult{n, err}
	}()
	// Cleanup takes its rows in physical order, not in the batches' key
	// order: were it to wait for a, which the batch holds, while holding
	// b, which the batch wants next, the two would deadlock. It skips the
	// rows others hold instead, so it ends while the batch still holds a.
	c := receive(t, cleaned, "cleanup (while the batch holds a row)")
	if c.err != nil || c.n != 1 {
		t.Errorf("cleanup racing a batch: deleted %d, %v; want b deleted and a skipped", c.n, c.err)
	}
	hold() // the batch goes on to b

	for _, ch := range chs {
		if r := receive(t, ch, "a reserve of the batch"); r.err != nil || r.res.Outcome != storage.Acquired {
			t.Errorf("a reserve racing cleanup: %v %v, want acquired", r.res.Outcome, r.err)
		}
	}
	var deadlocksAfter int64
	ok(t, conn.QueryRow(ctx, `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&deadlocksAfter))
	t.Logf("cleanup deleted %d rows; deadlocks in the database: %d; reserve rounds retried: %d",
		c.n, deadlocksAfter-deadlocksBefore, s.Retries())
	for _, k := range []storage.Key{keyA, keyB} {
		if got := outcome(t, s, k, fpA); got != storage.Conflict {
			t.Errorf("key %s after the race: %v, want in flight (acquired once)", k.ID, got)
		}
	}
}
