package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

// patientLockWait is the lock wait of the stores whose tests hold a
// statement on a locked row for as long as they need it: longer than any
// test runs.
const patientLockWait = 10 * time.Minute

// oneSenderStore is newStore on a pool of three connections, which makes
// the store send one batch of each kind at a time (half the pool, at
// least one), and with a lock wait of patientLockWait: a request held on a
// row lock is the batch out for as long as the test needs, and the
// requests made meanwhile queue for the next batch. Batches are set up
// that way, deterministically, to test what a batch does.
func oneSenderStore(t *testing.T, opts postgres.Options) *postgres.Store {
	t.Helper()
	dsn := pgtest.Require(t)
	if opts.Table == "" {
		opts.Table = pgtest.Table(t, dsn)
	}
	if opts.LockWait == 0 {
		opts.LockWait = patientLockWait
	}
	opts.CreateTable = true
	return openStore(t, testPool(t, dsn, 3), opts)
}

// blockedReserve starts a reserve of a key another transaction is
// inserting: on a oneSenderStore, it is the store's batch out (a request
// alone sends its own statement) until release ends that transaction, and
// every reserve made meanwhile queues for the next batch. wait returns the
// blocked reserve's error.
func blockedReserve(t *testing.T, s *postgres.Store, dsn string) (release func(), wait func() error) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	ok(t, err)
	tx, err := conn.Begin(ctx)
	ok(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO `+s.Table()+` (scope, key, fingerprint, state, token, created_at, expires_at)
		VALUES ('block', 'leader', '\x00', 1, 1, now(), now() + interval '1 minute')`)
	ok(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := s.Reserve(ctx, storage.Key{Scope: "block", ID: "leader"}, fpA, time.Minute)
		done <- err
	}()
	// The reserve is out once the server shows it waiting for the lock.
	pgtest.WaitForLockWait(t, dsn, s.Table())
	return heldBy(ctx, tx, conn, done)
}

// heldBy returns what ends tx, letting the statement it holds go on, and
// what waits for that statement's result on done.
func heldBy(ctx context.Context, tx pgx.Tx, conn *pgx.Conn, done <-chan error) (release func(), wait func() error) {
	return func() {
			tx.Rollback(ctx)
			conn.Close(ctx)
		}, func() error {
			return <-done
		}
}

// TestReservesWaitingTogetherShareOneBatch sends 16 keys, each reserved
// twice at once, in one batch (one commit): each key has exactly one
// winner, the other request in the same batch sees its row in flight;
// then the 16 completions go out together, and every key replays.
func TestReservesWaitingTogetherShareOneBatch(t *testing.T) {
	dsn := pgtest.Require(t)
	s := oneSenderStore(t, postgres.Options{})
	completed(t, s, storage.Key{Scope: "warm", ID: "up"}, time.Hour) // the table exists
	const keys = 16
	release, blocked := blockedReserve(t, s, dsn)
	var mu sync.Mutex
	won := map[string][]storage.Token{}
	conflicts := map[string]int{}
	var wg sync.WaitGroup
	for i := range 2 * keys {
		wg.Go(func() {
			key := storage.Key{Scope: "batch", ID: fmt.Sprint(i % keys)}
			res, err := s.Reserve(t.Context(), key, fpA, time.Minute)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Errorf("reserve %s: %v", key.ID, err)
			case res.Outcome == storage.Acquired:
				won[key.ID] = append(won[key.ID], res.Token)
			case res.Outcome == storage.Conflict:
				conflicts[key.ID]++
			default:
				t.Errorf("reserve %s: %v", key.ID, res.Outcome)
			}
		})
	}
	for s.Queued() < 2*keys {
		time.Sleep(time.Millisecond)
	}
	release()
	if err := blocked(); err != nil {
		t.Fatalf("the blocked reserve: %v", err)
	}
	wg.Wait()
	if _, largest, _, _ := s.BatchStats(); largest != keys {
		t.Fatalf("the largest batch of reserves held %d statements, want %d (one per key)", largest, keys)
	}
	for i := range keys {
		id := fmt.Sprint(i)
		if len(won[id]) != 1 || conflicts[id] != 1 {
			t.Fatalf("key %s: %d winners, %d conflicts; want one of each", id, len(won[id]), conflicts[id])
		}
	}

	// The completions queue behind one held back by a row lock too.
	releaseC, blockedC := blockedComplete(t, s, dsn)
	for id, toks := range won {
		wg.Go(func() {
			key := storage.Key{Scope: "batch", ID: id}
			if err := s.Complete(t.Context(), key, toks[0], &storage.Response{Status: 201, Body: []byte(id)}, time.Hour); err != nil {
				t.Errorf("complete %s: %v", id, err)
			}
		})
	}
	for s.Queued() < keys {
		time.Sleep(time.Millisecond)
	}
	releaseC()
	if err := blockedC(); err != nil {
		t.Fatalf("the blocked completion: %v", err)
	}
	wg.Wait()
	if _, _, _, largest := s.BatchStats(); largest != keys {
		t.Fatalf("the largest batch of completions held %d statements, want all %d", largest, keys)
	}
	for id := range won {
		res, err := s.Reserve(t.Context(), storage.Key{Scope: "batch", ID: id}, fpA, time.Minute)
		if err != nil || res.Outcome != storage.Replay || string(res.Record.Response.Body) != id {
			t.Fatalf("key %s after its batch completed: %v %v, want its replay", id, res.Outcome, err)
		}
	}
}

// TestARefusedBatchRunsEachStatementAlone: a statement the server refuses
// rolls its batch back; every other statement of it then runs alone and
// succeeds, and the refused one gets the error it gets alone (never an
// outage, so fail_open does not apply).
func TestARefusedBatchRunsEachStatementAlone(t *testing.T) {
	dsn := pgtest.Require(t)
	s := oneSenderStore(t, postgres.Options{})
	completed(t, s, storage.Key{Scope: "warm", ID: "up"}, time.Hour)
	pgtest.Exec(t, dsn, `ALTER TABLE `+s.Table()+` ADD CONSTRAINT refuse_bad CHECK (key <> 'bad')`)
	release, blocked := blockedReserve(t, s, dsn)
	errs := make([]error, 4)
	outcomes := make([]storage.Outcome, 4)
	var wg sync.WaitGroup
	for i, id := range []string{"a", "b", "bad", "c"} {
		wg.Go(func() {
			res, err := s.Reserve(t.Context(), storage.Key{Scope: "refused", ID: id}, fpA, time.Minute)
			outcomes[i], errs[i] = res.Outcome, err
		})
	}
	for s.Queued() < 4 {
		time.Sleep(time.Millisecond)
	}
	release()
	if err := blocked(); err != nil {
		t.Fatalf("the blocked reserve: %v", err)
	}
	wg.Wait()
	if _, largest, _, _ := s.BatchStats(); largest != 4 {
		t.Fatalf("the batch held %d statements, want 4", largest)
	}
	for i, id := range []string{"a", "b", "bad", "c"} {
		if id == "bad" {
			var pgErr *pgconn.PgError
			if !errors.As(errs[i], &pgErr) || pgErr.Code != "23514" || storage.Unavailable(errs[i]) {
				t.Errorf("the refused statement: %v, want its own check violation, not an outage", errs[i])
			}
			continue
		}
		if errs[i] != nil || outcomes[i] != storage.Acquired {
			t.Errorf("key %s of the refused batch: %v %v, want it acquired on its own", id, outcomes[i], errs[i])
		}
	}
}

// blockedComplete holds a completion back on the table, which another
// transaction holds, as blockedReserve does a reserve.
func blockedComplete(t *testing.T, s *postgres.Store, dsn string) (release func(), wait func() error) {
	t.Helper()
	ctx := context.Background()
	key := storage.Key{Scope: "block", ID: "completer"}
	tok := acquire(t, s, key, fpA, time.Minute)
	conn, err := pgx.Connect(ctx, dsn)
	ok(t, err)
	tx, err := conn.Begin(ctx)
	ok(t, err)
	// A completion never waits for a row (batch.go); it waits for the
	// table, at the guard, while another transaction holds it in SHARE
	// mode.
	_, err = tx.Exec(ctx, `LOCK TABLE `+s.Table()+` IN SHARE MODE`)
	ok(t, err)
	done := make(chan error, 1)
	go func() { done <- s.Complete(ctx, key, tok, &storage.Response{Status: 201}, time.Hour) }()
	pgtest.WaitForLockWait(t, dsn, s.Table())
	return heldBy(ctx, tx, conn, done)
}

// holdRow locks the row of key in an outside transaction (an operator's
// open BEGIN; SELECT ... FOR UPDATE) until the release returned, or the
// test's end; still reports whether that transaction still holds it,
// asked from a third session without waiting.
func holdRow(t *testing.T, dsn string, s *postgres.Store, key storage.Key) (release func(), still func() bool) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	ok(t, err)
	tx, err := conn.Begin(ctx)
	ok(t, err)
	tag, err := tx.Exec(ctx, `SELECT 1 FROM `+s.Table()+` WHERE scope = $1 AND key = $2 FOR UPDATE`, key.Scope, key.ID)
	ok(t, err)
	if tag.RowsAffected() != 1 {
		t.Fatalf("holdRow: no row for %v", key)
	}
	released := false
	release = func() {
		if !released {
			released = true
			tx.Rollback(ctx)
			conn.Close(ctx)
		}
	}
	t.Cleanup(release)
	still = func() bool {
		probe, err := pgx.Connect(ctx, dsn)
		ok(t, err)
		defer probe.Close(ctx)
		ptx, err := probe.Begin(ctx)
		ok(t, err)
		defer ptx.Rollback(ctx)
		_, err = ptx.Exec(ctx, `SELECT 1 FROM `+s.Table()+` WHERE scope = $1 AND key = $2 FOR UPDATE NOWAIT`, key.Scope, key.ID)
		var pgErr *pgconn.PgError
		return errors.As(err, &pgErr) && pgErr.Code == "55P03"
	}
	return release, still
}

// TestALockedRowBusiesOnlyItsKey: an outside transaction (an operator's
// open BEGIN) holds the rows of two keys while 90 requests for new keys
// reserve and complete, and requests for the held keys reserve (an
// expired record to take over), complete and release (a running request's
// own). On a pool as the Caddy module makes it (NewPoolConfig, 16
// connections), every one of the 90 succeeds, and all of it happens while
// the outside transaction still holds its rows: nobody waited for it to
// end. Each request for a held key is answered with an error wrapping
// storage.ErrBusy once it has waited the lock wait (the default, 500ms),
// never an outage (fail_open must not run it), and the keys work once the
// rows are let go. The store has no Timeout, so that a loaded machine
// cannot fail a request on time: a request held until the rows are let go
// would never return.
func TestALockedRowBusiesOnlyItsKey(t *testing.T) {
	const n = 90
	dsn := pgtest.Require(t)
	s := openStore(t, pinnedPool(t, dsn, 16), postgres.Options{Table: pgtest.Table(t, dsn), CreateTable: true})
	expired := storage.Key{Scope: "held", ID: "expired"}
	completed(t, s, expired, time.Hour)
	pgtest.Exec(t, dsn, `UPDATE `+s.Table()+` SET expires_at = now() - interval '1 second' WHERE key = 'expired'`)
	running := storage.Key{Scope: "held", ID: "running"}
	tok := acquire(t, s, running, fpA, time.Minute)
	releaseExpired, stillExpired := holdRow(t, dsn, s, expired)
	releaseRunning, stillRunning := holdRow(t, dsn, s, running)

	start := make(chan struct{})
	var wg sync.WaitGroup
	var reserveErr, completeErr, releaseErr error
	wg.Go(func() {
		<-start
		_, reserveErr = s.Reserve(t.Context(), expired, fpA, time.Minute)
	})
	wg.Go(func() {
		<-start
		completeErr = s.Complete(t.Context(), running, tok, &storage.Response{Status: 201}, time.Hour)
	})
	wg.Go(func() {
		<-start
		releaseErr = s.Release(t.Context(), running, tok)
	})
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			<-start
			key := storage.Key{Scope: "free", ID: fmt.Sprint(i)}
			res, err := s.Reserve(t.Context(), key, fpA, time.Minute)
			switch {
			case err != nil:
				errs[i] = fmt.Errorf("reserve: %w", err)
			case res.Outcome != storage.Acquired:
				errs[i] = fmt.Errorf("reserve: %v, want acquired", res.Outcome)
			default:
				if err := s.Complete(t.Context(), key, res.Token, &storage.Response{Status: 201}, time.Hour); err != nil {
					errs[i] = fmt.Errorf("complete: %w", err)
				}
			}
		})
	}
	finished := make(chan struct{})
	go func() {
		wg.Wait()
		close(finished)
	}()
	close(start)
	receive(t, finished, "the requests")
	if !stillExpired() || !stillRunning() {
		t.Fatal("the outside transaction no longer holds its rows")
	}

	for i, err := range errs {
		if err != nil {
			t.Errorf("new key %d: %v, want reserved and completed while another key's row is held", i, err)
		}
	}
	for what, err := range map[string]error{"reserve": reserveErr, "complete": completeErr, "release": releaseErr} {
		if !errors.Is(err, storage.ErrBusy) || storage.Unavailable(err) {
			t.Errorf("%s of a key whose row is held: %v, want ErrBusy, not unavailable", what, err)
		}
	}

	releaseExpired()
	releaseRunning()
	if got := outcome(t, s, expired, fpA); got != storage.Acquired {
		t.Errorf("the expired key once its row is let go: %v, want taken over", got)
	}
	ok(t, s.Complete(t.Context(), running, tok, &storage.Response{Status: 201}, time.Hour))
}

// TestBatchesGoOutWhileOneWaitsOnALockedRow: a reserve of an expired
// record whose row another transaction holds waits for it (with a lock
// wait longer than the test, so that it waits all along), in the process,
// never on the server; meanwhile 90 requests for new keys reserve and
// complete, in the batches that go out, and all are done while the first
// still waits: a locked row holds up nobody else.
func TestBatchesGoOutWhileOneWaitsOnALockedRow(t *testing.T) {
	const n = 90
	dsn := pgtest.Require(t)
	s := openStore(t, pinnedPool(t, dsn, 16), postgres.Options{Table: pgtest.Table(t, dsn), CreateTable: true, LockWait: patientLockWait})
	completed(t, s, storage.Key{Scope: "warm", ID: "up"}, time.Hour)
	heldKey := storage.Key{Scope: "held", ID: "k"}
	completed(t, s, heldKey, time.Hour)
	pgtest.Exec(t, dsn, `UPDATE `+s.Table()+` SET expires_at = now() - interval '1 second' WHERE key = 'k'`)
	hold, _ := holdRow(t, dsn, s, heldKey)
	before := s.LockedAnswers()
	held := goReserve(t.Context(), s, heldKey, fpA)
	testutil.Eventually(t, 30*time.Second, "the held key's reserve to find its row locked", func() bool { return s.LockedAnswers() > before })

	errs := make(chan error, n)
	for i := range n {
		go func() {
			key := storage.Key{Scope: "free", ID: fmt.Sprint(i)}
			res, err := s.Reserve(t.Context(), key, fpA, time.Minute)
			if err == nil && res.Outcome != storage.Acquired {
				err = fmt.Errorf("%v, want acquired", res.Outcome)
			}
			if err == nil {
				err = s.Complete(t.Context(), key, res.Token, &storage.Response{Status: 201}, time.Hour)
			}
			errs <- err
		}()
	}
	for i := range n {
		if err := receive(t, errs, "a request for a new key while a batch waits on a row"); err != nil {
			t.Errorf("request %d for a new key: %v", i, err)
		}
	}
	select {
	case r := <-held:
		t.Fatalf("the reserve of the held key returned (%v %v) before its row was let go", r.res.Outcome, r.err)
	default:
	}
	if w := lockWaits(t, dsn, s.Table()); w != 0 {
		t.Fatalf("%d statements wait for a lock on the server, want none", w)
	}

	hold()
	if r := receive(t, held, "the reserve of the held key"); r.err != nil || r.res.Outcome != storage.Acquired {
		t.Fatalf("the held key once its row was let go: %v %v, want acquired", r.res.Outcome, r.err)
	}
}

// lockTimeoutTracer counts the statements that failed with
// lock_not_available.
type lockTimeoutTracer struct {
	timeouts atomic.Int64
}

func (*lockTimeoutTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (tr *lockTimeoutTracer) TraceQueryEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	tr.count(d.Err)
}

func (*lockTimeoutTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (tr *lockTimeoutTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	tr.count(d.Err)
}

func (*lockTimeoutTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (tr *lockTimeoutTracer) count(err error) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		tr.timeouts.Add(1)
	}
}

// TestABatchWithALockedRowRunsTheOthersAgain: one batch of three reserves
// holds a new key that an outside transaction is inserting (the one wait
// a batch's statement still makes on the server: the INSERT must learn
// whether it conflicts). That statement (the culprit) waits the lock wait
// and fails with lock_not_available, which rolls the batch back: its
// request gets ErrBusy at once, never run again, and the two others,
// rolled back with it, go out again in a batch of their own and acquire
// their keys, while the key is still held.
func TestABatchWithALockedRowRunsTheOthersAgain(t *testing.T) {
	dsn := pgtest.Require(t)
	cfg, err := pgxpool.ParseConfig(dsn)
	ok(t, err)
	cfg.MaxConns = 3 // one sender of each kind, as oneSenderStore
	tr := new(lockTimeoutTracer)
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	ok(t, err)
	s := openStore(t, pool, postgres.Options{Table: pgtest.Table(t, dsn), CreateTable: true, LockWait: 100 * time.Millisecond})
	culprit := storage.Key{Scope: "batch", ID: "b-held"}
	completed(t, s, storage.Key{Scope: "warm", ID: "up"}, time.Hour)
	holdKey(t, dsn, s.Table(), culprit.Scope, culprit.ID)
	still := func() bool { return lockWaits(t, dsn, s.Table()) == 0 && s.Queued() == 0 }

	// The batch out, alone, waits for a connection: the test holds them
	// all. The reserves made meanwhile queue for the next batch.
	var conns []*pgxpool.Conn
	for range cfg.MaxConns {
		c, err := pool.Acquire(t.Context())
		ok(t, err)
		conns = append(conns, c)
	}
	before, _, _, _ := s.BatchStats()
	lead := goReserve(t.Context(), s, storage.Key{Scope: "batch", ID: "lead"}, fpA)
	testutil.Eventually(t, 30*time.Second, "the lone reserve to go out", func() bool {
		n, _, _, _ := s.BatchStats()
		return n > before
	})
	a := goReserve(t.Context(), s, storage.Key{Scope: "batch", ID: "a"}, fpA)
	b := goReserve(t.Context(), s, culprit, fpA)
	c := goReserve(t.Context(), s, storage.Key{Scope: "batch", ID: "c"}, fpA)
	queued(t, s, 3)
	for _, c := range conns {
		c.Release()
	}
	if r := receive(t, lead, "the batch out"); r.err != nil || r.res.Outcome != storage.Acquired {
		t.Fatalf("the batch out: %v %v, want acquired", r.res.Outcome, r.err)
	}

	rb := receive(t, b, "the reserve of the held row")
	if !errors.Is(rb.err, storage.ErrBusy) || storage.Unavailable(rb.err) {
		t.Fatalf("the reserve of the held row: %v, want ErrBusy, not unavailable", rb.err)
	}
	for _, ch := range []<-chan reserveResult{a, c} {
		if r := receive(t, ch, "a reserve batched with the held row"); r.err != nil || r.res.Outcome != storage.Acquired {
			t.Errorf("a reserve batched with the held row: %v %v, want acquired", r.res.Outcome, r.err)
		}
	}
	if !still() {
		t.Fatal("statements still wait")
	}
	if _, err := s.Get(t.Context(), culprit, false); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("the held key: %v, want not found (the outside transaction's insert is not committed)", err)
	}
	reserves, largest, _, _ := s.BatchStats()
	if reserves -= before; reserves != 3 || largest != 3 {
		t.Errorf("%d batches of reserves, the largest of %d; want 3 (the lone one, the three, the two sent again), the largest of 3", reserves, largest)
	}
	if got := tr.timeouts.Load(); got != 1 {
		t.Errorf("%d statements gave up on a lock, want the culprit once (it must not run again)", got)
	}
}

// TestALockedKeyGoesAloneAfterItsLockWait: once a statement of a key
// waited the lock wait on the server (a new key another transaction is
// inserting), the key's next statements go alone, on connections of
// their own, for a while: the statements queued with one never share its
// batch, so they never wait a second lock wait for it.
func TestALockedKeyGoesAloneAfterItsLockWait(t *testing.T) {
	dsn := pgtest.Require(t)
	cfg, err := pgxpool.ParseConfig(dsn)
	ok(t, err)
	cfg.MaxConns = 3
	tr := new(lockTimeoutTracer)
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	ok(t, err)
	s := openStore(t, pool, postgres.Options{Table: pgtest.Table(t, dsn), CreateTable: true, LockWait: time.Second})
	held := storage.Key{Scope: "alone", ID: "held"}
	completed(t, s, storage.Key{Scope: "warm", ID: "up"}, time.Hour)
	holdKey(t, dsn, s.Table(), held.Scope, held.ID)
	if r := receive(t, goReserve(t.Context(), s, held, fpA), "the first reserve of the held key"); !errors.Is(r.err, storage.ErrBusy) {
		t.Fatalf("the first reserve of the held key: %v %v, want ErrBusy", r.res.Outcome, r.err)
	}

	// The next ones queue (the test holds every connection) with three
	// reserves of other keys.
	var conns []*pgxpool.Conn
	for range cfg.MaxConns {
		c, err := pool.Acquire(t.Context())
		ok(t, err)
		conns = append(conns, c)
	}
	before, _, _, _ := s.BatchStats()
	lead := goReserve(t.Context(), s, storage.Key{Scope: "alone", ID: "lead"}, fpA)
	testutil.Eventually(t, 30*time.Second, "the lone reserve to go out", func() bool {
		n, _, _, _ := s.BatchStats()
		return n > before
	})
	again := goReserve(t.Context(), s, held, fpA)
	others := []<-chan reserveResult{
		goReserve(t.Context(), s, storage.Key{Scope: "alone", ID: "a"}, fpA),
		goReserve(t.Context(), s, storage.Key{Scope: "alone", ID: "b"}, fpA),
		goReserve(t.Context(), s, storage.Key{Scope: "alone", ID: "c"}, fpA),
	}
	queued(t, s, 4)
	for _, c := range conns {
		c.Release()
	}
	for _, ch := range append(others, lead) {
		if r := receive(t, ch, "a reserve of another key"); r.err != nil || r.res.Outcome != storage.Acquired {
			t.Errorf("a reserve of another key: %v %v, want acquired", r.res.Outcome, r.err)
		}
	}
	if r := receive(t, again, "the next reserve of the held key"); !errors.Is(r.err, storage.ErrBusy) {
		t.Fatalf("the next reserve of the held key: %v %v, want ErrBusy", r.res.Outcome, r.err)
	}
	reserves, largest, _, _ := s.BatchStats()
	if reserves -= before; reserves != 2 || largest != 3 {
		t.Errorf("%d batches of reserves after the first, the largest of %d; want 2 (the lone one, the three), the largest of 3: the held key went alone", reserves, largest)
	}
	if got := tr.timeouts.Load(); got != 2 {
		t.Errorf("%d statements gave up on a lock, want 2 (the first reserve of the held key, and the next, alone)", got)
	}
}
