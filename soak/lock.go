package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/soak/history"
)

// The lock fault: an outside transaction (an operator's open psql
// session, a migration, another service sharing the table) holds one
// PostgreSQL row locked for a while, past the store's statement timeout:
// either an uncommitted INSERT of a key that clients then send, or a
// lapsed lease's row held FOR UPDATE, which a request must take over.
// Meanwhile the locked key is sent by lockedSenders clients at once
// (issue 38's storm: each of them, in a batch of its own, once stalled
// every batch) and a burst of unrelated new keys arrives, each sent twice at once (a double submit), half of them
// on the fail_open route. Only the locked key may wait or be refused
// (history.checkLocks); no other key runs twice (a fail_open pass-through
// that a lock caused is no excuse).

// lockScope is the Authorization of the keys the lock fault sends.
const lockScope = "Bearer soak-lock"

// lockBurstKeys is how many unrelated keys a lock fault sends;
// lockedSenders how many clients send the locked key at once.
const (
	lockBurstKeys = 30
	lockedSenders = 20
)

// Lock variants (planned.Variant).
const (
	lockInsert   = 0 // an uncommitted INSERT of a new key
	lockTakeover = 1 // a lapsed lease's row held FOR UPDATE
)

// locker is the nemesis's part that locks rows: the scope as the store
// writes it (learnt once, from a key it sent), and a count of locks.
type locker struct {
	mu    sync.Mutex
	scope string // the scope column of lockScope's records
	n     int
}

// storedScope returns the scope column of lockScope's records: the
// first time, it sends a key of that scope and reads its row back.
func (nm *nemesis) storedScope(ctx context.Context, conn *pgx.Conn) (string, error) {
	nm.lk.mu.Lock()
	defer nm.lk.mu.Unlock()
	if nm.lk.scope != "" {
		return nm.lk.scope, nil
	}
	cl := nm.cl
	in := intentSpec{Intent: history.Intent{Scope: lockScope, Key: "lock-warm", Senders: 1, Source: history.SourceBurst}}
	in.on(routeAt("/postgres/"))
	in.body = []byte(`{"warm":true}`)
	in.BodyDigest = digest(in.body)
	cl.register(&in)
	cl.send(ctx, &in, 1, rngFor(cl.seed, 12), sendPlan{first: &behaviour{timeout: 4 * cl.L}, budget: 20 * time.Second})
	var scope string
	if err := conn.QueryRow(ctx, `SELECT scope FROM soak_keys WHERE key = 'lock-warm' LIMIT 1`).Scan(&scope); err != nil {
		return "", fmt.Errorf("reading the scope of %s: %w", lockScope, err)
	}
	nm.lk.scope = scope
	return scope, nil
}

// lockRow applies a Lock: it locks a row of a new key for p.For (from
// when the row is locked: f.Start), and sends the locked key and a burst
// of unrelated keys meanwhile; ctx ends it early (an interrupted run).
func (nm *nemesis) lockRow(ctx context.Context, p planned, f *history.Fault, wait func(time.Duration)) error {
	setup, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(setup, nm.c.pgDSN())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	scope, err := nm.storedScope(setup, conn)
	if err != nil {
		return err
	}
	nm.lk.mu.Lock()
	nm.lk.n++
	n := nm.lk.n
	nm.lk.mu.Unlock()
	key := fmt.Sprintf("lock-%d", n)
	if p.Variant == lockTakeover {
		// A record whose lease lapsed (its instance died): the next
		// request takes it over, with an UPDATE that waits for the lock.
		if _, err := conn.Exec(setup, `INSERT INTO soak_keys (scope, key, fingerprint, state, token, created_at, expires_at)
VALUES ($1, $2, '\x00', 1, 1, now() - interval '1 minute', now() - interval '1 second')`, scope, key); err != nil {
			return err
		}
	}
	tx, err := conn.Begin(setup)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // a rollback after a failure
	switch p.Variant {
	case lockTakeover:
		f.Note = "a lapsed lease's row held FOR UPDATE"
		_, err = tx.Exec(setup, `SELECT 1 FROM soak_keys WHERE scope = $1 AND key = $2 FOR UPDATE`, scope, key)
	default:
		f.Note = "an uncommitted INSERT"
		_, err = tx.Exec(setup, `INSERT INTO soak_keys (scope, key, fingerprint, state, token, created_at, expires_at)
VALUES ($1, $2, '\x00', 1, 1, now(), now() + interval '1 hour')`, scope, key)
	}
	if err != nil {
		return err
	}
	f.Start, f.Key, f.Scope = nm.rec.now(), key, lockScope
	nm.cl.lockBurst(ctx, key, n)
	wait(p.For)
	if err := tx.Rollback(context.Background()); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return err
	}
	return nil
}

// lockBurst sends the locked key (from lockedSenders clients, over the
// first 200 ms) and lockBurstKeys unrelated new keys, each twice at once,
// over the first second of a lock.
func (c *clients) lockBurst(ctx context.Context, key string, n int) {
	send := func(in *intentSpec, sender int, after time.Duration, parts ...int) {
		c.extra.Add(1)
		go func() {
			defer c.extra.Done()
			sleep(ctx, after)
			c.send(ctx, in, sender, rngFor(c.seed, append([]int{13, n}, parts...)...), sendPlan{first: &behaviour{timeout: patience(c.L)}})
		}()
	}
	locked := &intentSpec{Intent: history.Intent{Scope: lockScope, Key: key, Senders: lockedSenders, Source: history.SourceLocked}}
	locked.on(routeAt("/postgres/"))
	locked.body = fmt.Appendf(nil, `{"locked":%d}`, n)
	locked.BodyDigest = digest(locked.body)
	c.register(locked)
	for s := 1; s <= lockedSenders; s++ {
		send(locked, s, time.Duration(s-1)*200*time.Millisecond/lockedSenders, -1, s)
	}
	rng := rngFor(c.seed, 14, n)
	for j := range lockBurstKeys {
		in := &intentSpec{Intent: history.Intent{Scope: lockScope, Key: fmt.Sprintf("%s-other-%d", key, j), Senders: 2, Source: history.SourceBurst}}
		in.on(routeAt([]string{"/postgres/", "/pgopen/"}[j%2]))
		in.body = fmt.Appendf(nil, `{"other":"%d-%d"}`, n, j)
		in.BodyDigest = digest(in.body)
		c.register(in)
		at := time.Duration(rng.Int64N(int64(time.Second)))
		send(in, 1, at, j, 1)
		send(in, 2, at+time.Duration(rng.Int64N(int64(50*time.Millisecond))), j, 2)
	}
}
