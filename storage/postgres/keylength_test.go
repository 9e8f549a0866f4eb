package postgres_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

// moduleScope is a scope as the Caddy module makes them: 64 hex digits.
const moduleScope = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// randomKey returns n random visible ASCII bytes, as a client's key may
// be: nothing that PostgreSQL could compress into fitting.
func randomKey(n int) string {
	var b strings.Builder
	for range n {
		b.WriteByte(byte(0x21 + rand.IntN(0x7e-0x21+1)))
	}
	return b.String()
}

// TestLongestKeyWorksAndLongerIsInvalid uses keys at MaxKeyLength, which
// must work through every operation, and one byte longer, which Reserve
// refuses as invalid (never unavailable) before any I/O. PostgreSQL
// itself refuses to index the longer key, so the bound is exact.
func TestLongestKeyWorksAndLongerIsInvalid(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.Require(t)
	s := newStore(t, postgres.Options{})
	var limiter storage.KeyLimiter = s
	max := limiter.MaxKeyLength()
	if max != 2624 {
		t.Errorf("MaxKeyLength() = %d, want 2624 (8 kB pages)", max)
	}

	for range 3 {
		key := storage.Key{Scope: moduleScope, ID: randomKey(max)}
		tok := acquire(t, s, key, fpA, time.Minute)
		wantOutcome(t, s, key, fpA, storage.Conflict)
		ok(t, s.Renew(ctx, key, tok, time.Minute))
		ok(t, s.Complete(ctx, key, tok, &storage.Response{Status: 201, Body: []byte("long")}, time.Hour))
		wantOutcome(t, s, key, fpA, storage.Replay)
		if recs, err := s.GetByHash(ctx, key.Hash(), true); err != nil || len(recs) != 1 {
			t.Fatalf("GetByHash: %d records, %v", len(recs), err)
		}
		ok(t, s.Delete(ctx, key))
	}

	offline := openStore(t, testPool(t, "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=5", 1), postgres.Options{CreateTable: true})
	for name, id := range map[string]string{
		"one byte too long":         randomKey(max + 1),
		"long and compressible":     strings.Repeat("k", 10*max),
		"short key in a long scope": "k",
	} {
		key := storage.Key{Scope: moduleScope, ID: id}
		if name == "short key in a long scope" {
			key.Scope = strings.Repeat("s", 2*max)
		}
		for store, st := range map[string]*postgres.Store{"store": s, "store without a server": offline} {
			began := time.Now()
			res, err := st.Reserve(ctx, key, fpA, time.Minute)
			if !errors.Is(err, storage.ErrInvalid) || storage.Unavailable(err) || res.Token != 0 {
				t.Errorf("%s, %s: Reserve = %v (token %d), %v; want storage.ErrInvalid and no token", name, store, res.Outcome, res.Token, err)
			}
			if took := time.Since(began); store != "store" && took > time.Second {
				t.Errorf("%s: refused after %v: it tried to reach the server", name, took)
			}
		}
	}

	// PostgreSQL cannot index one byte more: the bound is not cautious.
	_, _ = s.Get(ctx, storage.Key{}, false) // the table exists
	err := execErr(t, dsn, `INSERT INTO `+s.Table()+` (scope, key, fingerprint, state, token, created_at, expires_at)
VALUES ($1, $2, '\x00', 1, 1, now(), now())`, moduleScope, randomKey(max+1))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "54000" {
		t.Fatalf("inserting a key of %d bytes by hand: %v, want SQLSTATE 54000 (index row too large)", max+1, err)
	}
}

// TestKeysATextColumnCannotHoldAreInvalid: a NUL byte or bytes that are
// not UTF-8 (which the Caddy module never sends, but a library caller
// may) are refused as invalid, not sent to fail as a data exception.
func TestKeysATextColumnCannotHoldAreInvalid(t *testing.T) {
	s := newStore(t, postgres.Options{})
	for name, key := range map[string]storage.Key{
		"NUL in the key":         {Scope: moduleScope, ID: "a\x00b"},
		"invalid UTF-8 key":      {Scope: moduleScope, ID: "a\xffb"},
		"NUL in the scope":       {Scope: "s\x00", ID: "k"},
		"invalid UTF-8 in scope": {Scope: "\xc3", ID: "k"},
	} {
		if _, err := s.Reserve(t.Context(), key, fpA, time.Minute); !errors.Is(err, storage.ErrInvalid) {
			t.Errorf("%s: %v, want storage.ErrInvalid", name, err)
		}
	}
}

// execErr runs one statement on a connection of its own and returns its
// error.
func execErr(t *testing.T, dsn, sql string, args ...any) error {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	ok(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(t.Context(), sql, args...)
	return err
}
