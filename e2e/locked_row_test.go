package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// A PostgreSQL row locked by a transaction outside the module (an
// operator's open BEGIN, a migration script, a report with SELECT ... FOR
// UPDATE) holds up the requests for that one key, and no other:
// docs/guarantees.md, "PostgreSQL batches never let one blocked statement
// (a locked row) hold up other keys".
//
// The locked row is a lapsed lease (its owner died): a request for that
// key does not find a live record, so its reserve statement goes on to
// the INSERT ... ON CONFLICT DO UPDATE that takes lapsed rows over, and
// that waits for the row lock. (A live row would not do: reserve answers
// a live row from its snapshot, without a lock.) The key's client retries
// all along, as clients do on 409 and 503, and one more request for it
// comes with the unrelated ones: its reservation is on its way, and in
// their batch, when they arrive. The row stays locked until every
// unrelated key has been answered (a few seconds at most, where the
// review held it for 8 s), and the test checks that the transaction
// holding it is still open then.

// lockedRowKeys is how many unrelated new keys arrive while the row is
// locked: the review's figure (89 of 90 got 503 before the fix).
const lockedRowKeys = 90

// lockedRowKey is the key whose row is locked.
const lockedRowKey = "order-locked-row"

// lockedRow is an instance on PostgreSQL whose lockedRowKey row a
// transaction of the test holds locked.
type lockedRow struct {
	up    *caddyproc.Upstream
	inst  *caddyproc.Instance
	store backend

	tx      pgx.Tx
	release func() // rolls the transaction back; idempotent

	// The locked key's client: it sends lockedRowKey every
	// lockedRowRetryPause until stop, and keeps what it got.
	stop    chan struct{}
	stopped chan struct{}
	mu      sync.Mutex
	answers []reply
}

const lockedRowRetryPause = 20 * time.Millisecond

// newLockedRow starts Caddy with policy (on_storage_error), writes a
// lapsed lease of lockedRowKey into the table (a crashed owner's), locks
// its row in a transaction, starts the key's client and returns once its
// reserve statement waits for the lock.
func newLockedRow(t *testing.T, policy string) *lockedRow {
	t.Helper()
	l := &lockedRow{up: newUpstream(t), store: onPostgres(t), stop: make(chan struct{}), stopped: make(chan struct{})}
	l.inst = startCaddy(t, "caddy", site{routes: route(l.up, l.store.storage+"\non_storage_error "+policy)})
	if r := post(l.inst.URL(), "/orders", "warm", `{"amount":1}`); !r.isNew() {
		t.Fatalf("first request (it creates the table): %s", describe(r))
	}
	table := pgx.Identifier{l.store.table}.Sanitize()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	conn, err := pgx.Connect(ctx, pgtest.DSN())
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close(ctx)
		cancel()
	})
	// The scope the handler stores for this client (host and no
	// Authorization: the same as the warm-up request's).
	var scope string
	if err := conn.QueryRow(ctx, "SELECT scope FROM "+table+" WHERE key = 'warm'").Scan(&scope); err != nil {
		t.Fatalf("reading the scope of the warm-up record: %v", err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO "+table+` (scope, key, fingerprint, state, token, created_at, expires_at)
		VALUES ($1, $2, '\x00'::bytea, 1, 4242, now() - interval '1 minute', now() - interval '1 second')`, scope, lockedRowKey); err != nil {
		t.Fatalf("writing a lapsed lease: %v", err)
	}
	l.tx, err = conn.Begin(ctx)
	if err == nil {
		var one int
		err = l.tx.QueryRow(ctx, "SELECT 1 FROM "+table+" WHERE scope = $1 AND key = $2 FOR UPDATE", scope, lockedRowKey).Scan(&one)
	}
	if err != nil {
		t.Fatalf("locking the row: %v", err)
	}
	var once sync.Once
	l.release = func() { once.Do(func() { _ = l.tx.Rollback(ctx) }) }
	t.Cleanup(l.release)

	go func() {
		defer close(l.stopped)
		for {
			r := post(l.inst.URL(), "/orders", lockedRowKey, `{"amount":1}`)
			l.mu.Lock()
			l.answers = append(l.answers, r)
			l.mu.Unlock()
			select {
			case <-l.stop:
				return
			case <-time.After(lockedRowRetryPause):
			}
		}
	}()
	t.Cleanup(func() { l.stopClient() })

	// The event the test is about: the module's reserve statement for the
	// locked key meets the transaction's row lock. It waits for it (seen
	// in pg_stat_activity), or, should the store wait only briefly before
	// it gives up, its client is told 409 (the record is busy).
	mon, err := pgx.Connect(ctx, pgtest.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer mon.Close(ctx)
	waiting := fmt.Sprintf(`SELECT count(*) FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND query LIKE '%%INSERT INTO %s%%'`, table)
	testutil.Eventually(t, 30*time.Second, "the locked key's reserve statement to meet the row lock", func() bool {
		n := 0
		if err := mon.QueryRow(ctx, waiting).Scan(&n); err != nil {
			t.Fatalf("%s: %v", waiting, err)
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		return n > 0 || slices.ContainsFunc(l.answers, func(r reply) bool { return r.status == 409 })
	})
	return l
}

// stillLocked fails the test unless the transaction is still open, and so
// still holds the row lock (a lock lasts as long as its transaction).
func (l *lockedRow) stillLocked(t *testing.T, when string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var one int
	if err := l.tx.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("%s: the transaction holding the row lock is gone (%v): the test proves nothing", when, err)
	}
}

// stopClient stops the locked key's client and returns what it got.
func (l *lockedRow) stopClient() []reply {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.stopped
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.answers
}

// lockedKeyWaited fails unless every answer the locked key's client got
// while the row was locked was 409 (the record is busy: retry) or 503,
// and the upstream never ran the key.
func (l *lockedRow) lockedKeyWaited(t *testing.T, answers []reply) {
	t.Helper()
	kinds := make(map[string]int)
	var off []string
	for _, r := range answers {
		switch {
		case r.status == 409:
			kinds["409"]++
		case r.status == 503:
			kinds["503"]++
		default:
			kinds[fmt.Sprint(r.status)]++
			off = append(off, describe(r))
		}
	}
	t.Logf("the locked key's client got, while its row was locked: %v", kinds)
	if len(answers) == 0 {
		t.Fatal("the locked key's client got no answer while its row was locked")
	}
	if n := l.up.Executions(lockedRowKey); n > 0 || len(off) > 0 {
		t.Errorf("while its row was locked, the upstream ran the locked key %d times, and its client got %d answers other than 409 or 503, e.g. %s",
			n, len(off), strings.Join(off[:min(3, len(off))], "; "))
	}
}

// lockedKeyRunsOnceReleased releases the lock: the locked key's next
// request takes the lapsed lease over and runs once, and is replayed
// from then on.
func (l *lockedRow) lockedKeyRunsOnceReleased(t *testing.T) {
	t.Helper()
	before := l.up.Executions(lockedRowKey)
	l.release()
	if r := retryPast409(l.inst, lockedRowKey, `{"amount":1}`, 10*time.Second); !r.isNew() || r.execution() != before+1 {
		t.Fatalf("the locked key once its row is unlocked: %s, want it to run (execution %d)", describe(r), before+1)
	}
	if r := post(l.inst.URL(), "/orders", lockedRowKey, `{"amount":1}`); !r.isReplayOf(before + 1) {
		t.Fatalf("the locked key again: %s, want the replay of execution %d", describe(r), before+1)
	}
}

// sendUnrelated sends lockedRowKeys new keys at once, each copies times
// at once (a double submit with 2), and returns the replies per key. A
// request for the locked key goes with them, as it would among a client
// population's traffic: its answer joins those of the locked key's client.
func (l *lockedRow) sendUnrelated(copies int) [][]reply {
	replies := make([][]reply, lockedRowKeys)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range replies {
		replies[i] = make([]reply, copies)
		for c := range copies {
			wg.Go(func() {
				<-start
				replies[i][c] = post(l.inst.URL(), "/orders", unrelatedKey(i), `{"amount":2}`)
			})
		}
	}
	wg.Go(func() {
		<-start
		r := post(l.inst.URL(), "/orders", lockedRowKey, `{"amount":1}`)
		l.mu.Lock()
		l.answers = append(l.answers, r)
		l.mu.Unlock()
	})
	close(start)
	wg.Wait()
	return replies
}

func unrelatedKey(i int) string { return fmt.Sprintf("order-unrelated-%02d", i) }

// While one row is locked by an outside transaction for as long as the
// test needs, 90 unrelated new keys arrive at once, with the locked key's
// reservation on its way all along. Every one of them must get its
// upstream's answer (201) while the row is still locked; the locked key
// gets 409 or 503 and never runs, and runs once when the lock is gone.
//
// Guards the review's finding C: a reserve waiting for the row lock held
// up the batch it was in, and every batch after it, until its statement
// timeout (2 s, the default), so that 89 of 90 unrelated keys got 503.
// Measured on the code of the finding: 90 of 90 got 503, in 3 runs of 3
// (about 5 s each), the locked key 503. With a prototype of the fix (a
// lock wait of 200 ms, then storage.ErrBusy, answered 409): 90 of 90 got
// 201 and the locked key 409, in about 2 s.
func TestALockedRowHoldsUpNoOtherKey(t *testing.T) {
	l := newLockedRow(t, "fail_closed")
	replies := l.sendUnrelated(1)
	l.stillLocked(t, "once every unrelated key was answered")
	answers := l.stopClient()

	kinds := make(map[string]int)
	var off []string
	for i, rs := range replies {
		r := rs[0]
		if r.isNew() && r.execution() == 1 {
			kinds["201"]++
			continue
		}
		if r.problem() != "" {
			kinds[fmt.Sprintf("%d %s", r.status, strings.TrimPrefix(r.problem(), "urn:caddy-idempotency:"))]++
		} else {
			kinds[fmt.Sprint(r.status)]++
		}
		off = append(off, unrelatedKey(i)+": "+describe(r))
	}
	t.Logf("%d unrelated keys while the row was locked: %v", lockedRowKeys, kinds)
	if len(off) > 0 {
		t.Errorf("%d of %d unrelated keys did not get their upstream's answer while another key's row was locked, e.g. %s",
			len(off), lockedRowKeys, strings.Join(off[:min(3, len(off))], "; "))
	}
	for i := range lockedRowKeys {
		if n := l.up.Executions(unrelatedKey(i)); n > 1 {
			t.Errorf("the upstream ran %s %d times", unrelatedKey(i), n)
		}
	}
	l.lockedKeyWaited(t, answers)
	l.lockedKeyRunsOnceReleased(t)
}

// The same with on_storage_error fail_open, each unrelated key sent twice
// at once (a double submit): every unrelated key runs exactly once, and
// the locked key never runs while its row is locked. A locked row is not
// an unreachable store: the store answered, so fail_open must not pass the
// locked key on, and the other keys must never wait long enough to look
// unreachable.
//
// Guards the review's finding C under fail_open: the unrelated keys'
// reservations timed out behind the blocked batch, fail_open ran both
// copies of each, and the locked key ran on every retry. Measured on the
// code of the finding: both copies ran for 90, 90 and 90 of the 90 keys
// (53 and 81 in earlier runs), and the locked key ran 2, 3 and 3 times
// while its row was locked. With the prototype of the fix: every key ran
// once (the other copy got 409), the locked key never, in about 2 s.
func TestALockedRowUnderFailOpenRunsNoKeyTwice(t *testing.T) {
	l := newLockedRow(t, "fail_open")
	replies := l.sendUnrelated(2)
	l.stillLocked(t, "once every unrelated key was answered")
	answers := l.stopClient()

	var twice, off []string
	for i, rs := range replies {
		key := unrelatedKey(i)
		if n := l.up.Executions(key); n != 1 {
			twice = append(twice, fmt.Sprintf("%s (%d executions)", key, n))
		}
		fresh := 0
		for _, r := range rs {
			switch {
			case r.isNew() && r.execution() == 1:
				fresh++
			case r.isConflict(), r.isReplayOf(1): // the other copy runs
			default:
				off = append(off, key+": "+describe(r))
			}
		}
		if fresh != 1 {
			off = append(off, fmt.Sprintf("%s: %d of its 2 copies ran", key, fresh))
		}
	}
	t.Logf("%d unrelated keys sent twice while the row was locked: %d ran more or less than once, %d answers were neither the one execution, 409 nor its replay",
		lockedRowKeys, len(twice), len(off))
	if len(twice) > 0 {
		t.Errorf("the upstream did not run %d of %d double-submitted keys exactly once while another key's row was locked, e.g. %s",
			len(twice), lockedRowKeys, strings.Join(twice[:min(5, len(twice))], ", "))
	}
	if len(off) > 0 {
		t.Errorf("%d answers to double-submitted keys were neither their one execution, 409 (the other copy runs) nor its replay, e.g. %s", len(off), strings.Join(off[:min(3, len(off))], "; "))
	}
	l.lockedKeyWaited(t, answers)
	l.lockedKeyRunsOnceReleased(t)
}

// lockedStormCopies, lockedStormClients and lockedStormRounds are the
// rig of issue 38's review: per round, 20 concurrent requests for the
// locked key and 10 other clients, each sending a new key twice at once
// (a double submit); three rounds.
const (
	lockedStormCopies  = 20
	lockedStormClients = 10
	lockedStormRounds  = 3
)

// sendStorm sends one round of the rig: lockedStormCopies requests for
// the locked key and lockedStormClients new keys twice each, all at once.
// It returns the unrelated keys' replies and the locked key's.
func (l *lockedRow) sendStorm(round int) (unrelated map[string][]reply, locked []reply) {
	unrelated = make(map[string][]reply)
	locked = make([]reply, lockedStormCopies)
	var mu sync.Mutex
	start := make(chan struct{})
	var wg sync.WaitGroup
	for c := range lockedStormClients {
		key := fmt.Sprintf("order-storm-%d-%02d", round, c)
		for range 2 {
			wg.Go(func() {
				<-start
				r := post(l.inst.URL(), "/orders", key, `{"amount":3}`)
				mu.Lock()
				unrelated[key] = append(unrelated[key], r)
				mu.Unlock()
			})
		}
	}
	for i := range locked {
		wg.Go(func() {
			<-start
			locked[i] = post(l.inst.URL(), "/orders", lockedRowKey, `{"amount":1}`)
		})
	}
	close(start)
	wg.Wait()
	return unrelated, locked
}

// Many concurrent requests for one locked key hold up that key alone:
// docs/guarantees.md, "A locked PostgreSQL row holds up its own key
// only, however many requests for it arrive at once". Three rounds of 20
// concurrent requests for the locked key with 10 other clients sending a
// new key twice at once: every unrelated key runs exactly once, no
// unrelated request gets 503, and the locked key never runs while its row
// is held, under fail_closed and fail_open alike.
//
// Guards issue 38's finding: each of the 20 statements for the locked key
// went out in a batch of its own, waited the lock wait, and rolled back
// the innocent statements batched with it, which then met the next one:
// 49 of 60 unrelated requests got 503, and under fail_open 15 to 20 of 30
// unrelated double submits ran twice and the locked key ran 32 to 34
// times. Measured on the code before the fix (main 7b26018): under
// fail_closed, 43 of 60 unrelated requests got 503 (18 keys never ran);
// under fail_open, 28 of 30 unrelated keys ran twice and the locked key
// 42 times. With the fix: none, 6 runs of 6, idle and with both cores
// kept busy.
func TestALockedKeyStormHoldsUpNoOtherKey(t *testing.T) {
	for _, policy := range []string{"fail_closed", "fail_open"} {
		t.Run(policy, func(t *testing.T) {
			l := newLockedRow(t, policy)
			var lockedAnswers []reply
			var twice, unavailable, off []string
			for round := range lockedStormRounds {
				unrelated, locked := l.sendStorm(round)
				l.stillLocked(t, fmt.Sprintf("after round %d", round+1))
				lockedAnswers = append(lockedAnswers, locked...)
				for _, key := range slices.Sorted(maps.Keys(unrelated)) {
					if n := l.up.Executions(key); n != 1 {
						twice = append(twice, fmt.Sprintf("%s (%d executions)", key, n))
					}
					for _, r := range unrelated[key] {
						switch {
						case r.status == 503:
							unavailable = append(unavailable, key+": "+describe(r))
						case r.isNew() && r.execution() == 1, r.isConflict(), r.isReplayOf(1):
						default:
							off = append(off, key+": "+describe(r))
						}
					}
				}
			}
			answers := append(l.stopClient(), lockedAnswers...)
			t.Logf("%d rounds of %d requests for the locked key with %d double-submitted new keys: %d unrelated keys ran other than once, %d unrelated requests got 503, %d other answers",
				lockedStormRounds, lockedStormCopies, lockedStormClients, len(twice), len(unavailable), len(off))
			all := lockedStormRounds * lockedStormClients
			if len(twice) > 0 {
				t.Errorf("%d of %d unrelated keys did not run exactly once while another key's row was locked, e.g. %s",
					len(twice), all, strings.Join(twice[:min(5, len(twice))], ", "))
			}
			if len(unavailable) > 0 {
				t.Errorf("%d of %d unrelated requests got 503 while another key's row was locked, e.g. %s",
					len(unavailable), 2*all, strings.Join(unavailable[:min(3, len(unavailable))], "; "))
			}
			if len(off) > 0 {
				t.Errorf("%d unrelated answers were neither their key's one execution, 409 nor its replay, e.g. %s", len(off), strings.Join(off[:min(3, len(off))], "; "))
			}
			l.lockedKeyWaited(t, answers)
			l.lockedKeyRunsOnceReleased(t)
		})
	}
}

// lockedLeaseKeys are the requests in flight whose rows the test locks at
// once; lockedLeaseHold is how long, at lock_timeout lockedLeaseLease.
const (
	lockedLeaseKeys  = 5
	lockedLeaseLease = 2 * time.Second
	lockedLeaseHold  = 3 * time.Second
)

// An outside lock never lets a live lease be taken over:
// docs/guarantees.md, "A row locked from outside never lets a live lease
// be taken over". Requests running on instance a, whose owner lives and
// renews, have their rows locked by an outside transaction for 3 s at
// lock_timeout 2s (the renewals cannot land meanwhile, and the leases
// lapse), while instance b retries every key every 100 ms: when the lock
// goes, a's renewals land before any takeover, and every key runs once.
//
// Guards issue 38's finding: renewals skipped the locked rows (SKIP
// LOCKED), the leases lapsed, and the takeover queued on the lock won the
// moment it went: 2 executions, 3 of 3 runs. Measured on the code before
// the fix (main 7b26018): all 5 keys ran twice. With the fix: once each,
// 9 runs of 9, idle and with both cores kept busy.
func TestALockedLeaseIsNotTakenOver(t *testing.T) {
	store := onPostgres(t)
	up := newUpstream(t)
	s := site{routes: route(up, store.storage+"\nlock_timeout "+lockedLeaseLease.String()+"\nin_flight reject")}
	a, b := startCaddy(t, "a", s), startCaddy(t, "b", s)
	table := pgx.Identifier{store.table}.Sanitize()

	work := lockedLeaseHold + 3*lockedLeaseLease
	keys := make([]string, lockedLeaseKeys)
	firsts := make([]<-chan reply, lockedLeaseKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("order-locked-lease-%d", i)
		firsts[i] = running(t, up, a, keys[i], `{"amount":10}`, work)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgtest.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var n int
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM (SELECT 1 FROM "+table+" WHERE key = ANY($1) AND state = 1 FOR UPDATE) l", keys).Scan(&n); err != nil || n != lockedLeaseKeys {
		t.Fatalf("locking the rows of the requests in flight: %d of %d locked, %v", n, lockedLeaseKeys, err)
	}
	locked := time.Now()

	// b retries every key every 100 ms, from the moment the rows are
	// locked until the first requests have answered.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	retries := make(map[string]int)
	for _, key := range keys {
		wg.Go(func() {
			for {
				r := post(b.URL(), "/orders", key, `{"amount":10}`)
				mu.Lock()
				switch {
				case r.isConflict():
					retries["409"]++
				case r.isNew():
					retries["ran"]++
				case r.replayed():
					retries["replayed"]++
				default:
					retries[fmt.Sprint(r.status)]++
				}
				mu.Unlock()
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		})
	}
	time.Sleep(time.Until(locked.Add(lockedLeaseHold)))
	if err := tx.Rollback(ctx); err != nil {
		t.Fatalf("letting the rows go: %v", err)
	}
	for i, key := range keys {
		if r := <-firsts[i]; !r.isNew() || r.execution() != 1 {
			t.Errorf("the first request of %s: %s, want its own execution", key, describe(r))
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("b's retries while and after the rows were locked: %v", retries)
	for _, key := range keys {
		if n := up.Executions(key); n != 1 {
			t.Errorf("the upstream ran %s %d times: its lease was taken over when the outside lock went", key, n)
		}
	}
}
