package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/internal/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

// These tests run the handler on the PostgreSQL store of the test server
// (IDEMPOTENCY_POSTGRES_DSN, see internal/pgtest), each on a table of its
// own.

// onPostgres provisions h on a PostgreSQL store for dsn and table; extra
// adds JSON members to the storage config (`"max_conns":3`). Pools default
// to 8 connections, not pgx's one per CPU: on a big machine, test packages
// running in parallel would otherwise exhaust the server's connections.
func onPostgres(t *testing.T, h *Handler, dsn, table, extra string) *Handler {
	t.Helper()
	cfg := map[string]any{"backend": "postgres", "dsn": dsn, "table": table, "max_conns": 8}
	if extra != "" {
		if err := json.Unmarshal([]byte("{"+extra+"}"), &cfg); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.StorageRaw = raw
	return provision(t, h)
}

// pgRows counts the rows of table.
func pgRows(t *testing.T, dsn, table string) int {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(t.Context(), `SELECT count(*) FROM `+pgx.Identifier{table}.Sanitize()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPostgresConcurrentSameKeyRunsOnce(t *testing.T) {
	dsn := pgtest.Require(t)
	assertConcurrentSameKeyRunsOnce(t, onPostgres(t, &Handler{}, dsn, pgtest.Table(t, dsn), ""))
}

func TestPostgresWaitModeAllGetTheResponse(t *testing.T) {
	dsn := pgtest.Require(t)
	h := onPostgres(t, &Handler{InFlight: "wait", WaitTimeout: cfDur(10 * time.Second)}, dsn, pgtest.Table(t, dsn), "")
	up := slowUpstream(200 * time.Millisecond)
	for _, r := range fire(h, up, 50, "order-1", `{"amount":10}`) {
		if r.code != http.StatusCreated || string(r.body) != `{"id":"ord_1"}` {
			t.Fatalf("wait mode: got %d %q, want every request to get the 201", r.code, r.body)
		}
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream ran %d times, want exactly 1", n)
	}
}

func TestPostgresReplayIsIdentical(t *testing.T) {
	dsn := pgtest.Require(t)
	h := onPostgres(t, &Handler{}, dsn, pgtest.Table(t, dsn), "")
	body := make([]byte, 0, 1024)
	for i := range 1024 {
		body = append(body, byte(i))
	}
	up := &upstream{serve: func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header()["Set-Cookie"] = []string{"a=1; Path=/", "b=2"}
		w.Header().Set("Location", "/orders/42")
		w.Header().Set("X-Empty", "")
		w.WriteHeader(http.StatusAccepted)
		_, err := w.Write(body)
		return err
	}}
	first := serve(h, up, request("k", `{"a":1}`))
	replay := serve(h, up, request("k", `{"a":1}`))
	if up.calls.Load() != 1 {
		t.Fatalf("upstream ran %d times", up.calls.Load())
	}
	if replay.Code != first.Code || !bytes.Equal(replay.Body.Bytes(), first.Body.Bytes()) {
		t.Fatalf("replay %d with %d bytes, first %d with %d bytes", replay.Code, replay.Body.Len(), first.Code, first.Body.Len())
	}
	if replay.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatal("replay not marked")
	}
	got := replay.Header().Clone()
	got.Del("Idempotent-Replayed")
	if !maps.EqualFunc(got, first.Header(), slices.Equal) {
		t.Fatalf("replay headers %v, first %v", got, first.Header())
	}
	if w := serve(h, up, request("k", `{"a":2}`)); w.Code != http.StatusUnprocessableEntity {
		t.Fatalf("same key, other body: %d, want 422", w.Code)
	}
}

func TestPostgresExpiryAndCleanup(t *testing.T) {
	dsn := pgtest.Require(t)
	table := pgtest.Table(t, dsn)
	h := onPostgres(t, &Handler{TTL: cfDur(time.Second)}, dsn, table, `"cleanup_interval":"100ms"`)
	up := &upstream{}
	if w := serve(h, up, request("k", "{}")); w.Code != http.StatusCreated {
		t.Fatalf("first: %d", w.Code)
	}
	if w := serve(h, up, request("k", "{}")); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("within the ttl: %d, not replayed", w.Code)
	}
	if n := pgRows(t, dsn, table); n != 1 {
		t.Fatalf("%d rows, want 1", n)
	}
	// The periodic cleanup removes the expired row.
	if !eventually(t, 5*time.Second, func() bool { return pgRows(t, dsn, table) == 0 }) {
		t.Fatal("the expired row was not cleaned up")
	}
	if w := serve(h, up, request("k", "{}")); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("after expiry: %d replayed=%q, want a new execution", w.Code, w.Header().Get("Idempotent-Replayed"))
	}
	if up.calls.Load() != 2 {
		t.Fatalf("upstream ran %d times, want 2", up.calls.Load())
	}
}

// TestPostgresTwoInstancesShareOneDatabase runs two handlers with pools of
// their own (another max_conns is another configuration), as two Caddy
// instances would, and alternates concurrent requests between them.
func TestPostgresTwoInstancesShareOneDatabase(t *testing.T) {
	dsn := pgtest.Require(t)
	table := pgtest.Table(t, dsn)
	a := onPostgres(t, &Handler{}, dsn, table, `"max_conns":3`)
	b := onPostgres(t, &Handler{}, dsn, table, `"max_conns":4`)
	if a.store == b.store {
		t.Fatal("the two instances share a store; they must not")
	}
	up := slowUpstream(200 * time.Millisecond)
	const n = 40
	responses := make([]*responseSnapshot, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		h := a
		if i%2 == 1 {
			h = b
		}
		wg.Go(func() {
			<-start
			w := serve(h, up, request("order-7", `{"amount":7}`))
			responses[i] = &responseSnapshot{code: w.Code, header: w.Header()}
		})
	}
	close(start)
	wg.Wait()
	if up.calls.Load() != 1 {
		t.Fatalf("upstream ran %d times across two instances, want 1", up.calls.Load())
	}
	created := 0
	for i, r := range responses {
		switch {
		case r.code == http.StatusCreated && r.header.Get("Idempotent-Replayed") == "":
			created++
		case r.code == http.StatusCreated, r.code == http.StatusConflict:
		default:
			t.Errorf("request %d: %d", i, r.code)
		}
	}
	if created != 1 {
		t.Fatalf("%d requests ran the upstream's response fresh, want 1", created)
	}
	// Each instance replays what the other recorded.
	for _, h := range []*Handler{a, b} {
		if w := serve(h, up, request("order-7", `{"amount":7}`)); w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("replay: %d", w.Code)
		}
	}
}

func TestPostgresDownFollowsOnStorageError(t *testing.T) {
	const down = "postgres://postgres@127.0.0.1:1/test?sslmode=disable"
	closed := onPostgres(t, &Handler{}, down, "down_closed", "")
	up := &upstream{}
	w := serve(closed, up, request("k", "{}"))
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("fail_closed with PostgreSQL down: %d, want 503", w.Code)
	}
	if p := problemOf(t, w); p.Type != "urn:caddy-idempotency:store-unavailable" {
		t.Fatalf("problem %+v", p)
	}
	if up.calls.Load() != 0 {
		t.Fatal("fail_closed ran the upstream")
	}

	open := onPostgres(t, &Handler{OnStorageError: "fail_open"}, down, "down_open", "")
	if w := serve(open, up, request("k", "{}")); w.Code != http.StatusCreated {
		t.Fatalf("fail_open with PostgreSQL down: %d, want the upstream's 201", w.Code)
	}
	if up.calls.Load() != 1 {
		t.Fatalf("fail_open: upstream ran %d times, want 1", up.calls.Load())
	}
}

// TestPostgresReloadKeepsThePool provisions a second config with the same
// storage before cleaning up the first, as a reload does: the store (and
// its pool) must survive, and keep its records.
func TestPostgresReloadKeepsThePool(t *testing.T) {
	dsn := pgtest.Require(t)
	raw := json.RawMessage(fmt.Sprintf(`{"backend":"postgres","dsn":%q,"table":%q}`, dsn, pgtest.Table(t, dsn)))
	oldCtx, cancelOld := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancelOld()
	old := &Handler{StorageRaw: raw}
	if err := old.Provision(oldCtx); err != nil {
		t.Fatal(err)
	}
	up := &upstream{}
	serve(old, up, request("k", "{}"))

	next := provision(t, &Handler{StorageRaw: raw})
	if next.store != old.store {
		t.Fatal("the reloaded config got another store")
	}
	cancelOld() // the old config is cleaned up after the new one started
	if w := serve(next, up, request("k", "{}")); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after the reload: %d, not replayed", w.Code)
	}
}

// TestPostgresStatementsPerRequest measures the handler end to end in a
// database of the test's own, on one connection: a new POST commits two
// statements (reserve, complete), a replay one.
func TestPostgresStatementsPerRequest(t *testing.T) {
	dsn := pgtest.Require(t)
	dbDSN, db := pgtest.Database(t, dsn)
	h := onPostgres(t, &Handler{}, dbDSN, "idempotency_keys", `"max_conns":1`)
	session := h.store.(*postgres.Store).Pool()
	up := &upstream{}
	n := 0
	newPost := func() {
		n++
		if w := serve(h, up, request(fmt.Sprint("new-", n), "{}")); w.Code != http.StatusCreated {
			t.Fatalf("new POST: %d", w.Code)
		}
	}
	replay := func() {
		if w := serve(h, up, request("new-1", "{}")); w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("replay: %d", w.Code)
		}
	}
	newPost() // creates the table and prepares the statements
	replay()
	if got := pgtest.CountCommits(t, dsn, db, session, nil, newPost); got != 2 {
		t.Errorf("a new POST committed %d statements, want 2", got)
	}
	if got := pgtest.CountCommits(t, dsn, db, session, nil, replay); got != 1 {
		t.Errorf("a replay committed %d statements, want 1", got)
	}
}

// TestPostgresCaddyfile runs a real Caddy configured from a Caddyfile with
// the postgres block.
func TestPostgresCaddyfile(t *testing.T) {
	dsn := pgtest.Require(t)
	t.Setenv("IDEM_TEST_PG_DSN", dsn)
	up := newCountingUpstream(t)
	base := loadCaddyfile(t, freePort(t), `
	idempotency {
		storage postgres {
			dsn {env.IDEM_TEST_PG_DSN}
			table `+pgtest.Table(t, dsn)+`
			cleanup_interval 1m
			max_conns 4
		}
	}
	reverse_proxy `+up.Listener.Addr().String())
	post(t, base+"/orders", "k", "{}")
	resp, body := post(t, base+"/orders", "k", "{}")
	if resp.Header.Get("Idempotent-Replayed") != "true" || string(body) != up.body {
		t.Fatalf("second POST: %d replayed=%q", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
	}
	if up.calls.Load() != 1 {
		t.Fatalf("upstream ran %d times, want 1", up.calls.Load())
	}
}
