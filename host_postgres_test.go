package idempotency

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

// These PostgreSQL-specific tests run the handler on the test server
// (IDEMPOTENCY_POSTGRES_DSN, see internal/testkit/pgtest), each on a table or a
// database of its own; the scenarios every store shares run on the backend
// matrix (matrix_test.go).

// onPostgres provisions h on a PostgreSQL store for dsn and table; extra
// adds JSON members to the storage config (`"max_conns":3`).
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

// TestPostgresCleanupDeletesExpiredRows checks that the handler's
// cleanup_interval runs the periodic cleanup: the expired row goes, and
// the key runs again.
func TestPostgresCleanupDeletesExpiredRows(t *testing.T) {
	dsn := pgtest.Require(t)
	table := pgtest.Table(t, dsn)
	h := onPostgres(t, &Handler{TTL: caddy.Duration(time.Second)}, dsn, table, `"cleanup_interval":"1s"`)
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
	testutil.Eventually(t, 15*time.Second, "the periodic cleanup to delete the expired row", func() bool { return pgRows(t, dsn, table) == 0 })
	if w := serve(h, up, request("k", "{}")); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("after expiry: %d replayed=%q, want a new execution", w.Code, w.Header().Get("Idempotent-Replayed"))
	}
	if up.Calls.Load() != 2 {
		t.Fatalf("upstream ran %d times, want 2", up.Calls.Load())
	}
}

// TestPostgresStatementsPerRequest measures the handler end to end in a
// database of the test's own, on one connection: a new POST commits two
// statements (reserve, complete), a replay one.
func TestPostgresStatementsPerRequest(t *testing.T) {
	dsn := pgtest.Require(t)
	dbDSN, db := pgtest.Database(t, dsn)
	h := onPostgres(t, &Handler{}, dbDSN, "idempotency_keys", `"max_conns":1`)
	session := h.rawStore().(*postgres.Store).Pool()
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

// TestPostgresFailoverFactsAndReadOnlyServer runs handlers on a private
// primary and its streaming standby (pgtest.Replicated): GET
// /idempotency/stores shows what protects each store's records across a
// failover, and a store connected to the standby answers requests by
// on_storage_error, with one log line that says what to do.
func TestPostgresFailoverFactsAndReadOnlyServer(t *testing.T) {
	_, primary, standby := pgtest.Replicated(t)
	table := pgtest.Name("idem_failover_")
	onPrimary := onPostgres(t, &Handler{}, primary.DSN, table, "")
	up := &upstream{}
	if w := serve(onPrimary, up, request("k", "{}")); w.Code != http.StatusCreated {
		t.Fatalf("on the primary: %d", w.Code) // creates the table, which the standby then has too
	}
	if err := primary.WaitReplayed(1, time.Minute); err != nil {
		t.Fatal(err) // the standby has the table: its store's ping reads it
	}
	closed := onPostgres(t, &Handler{OnStorageError: "fail_closed"}, standby.DSN, table, "")
	open := onPostgres(t, &Handler{OnStorageError: "fail_open"}, standby.DSN, table, `"timeout":"3s"`)

	var a adminAPI
	w := httptest.NewRecorder()
	if err := a.handleStores(w, httptest.NewRequest(http.MethodGet, "/idempotency/stores", nil)); err != nil {
		t.Fatal(err)
	}
	var list []struct {
		ID         string `json:"id"`
		Durability *struct {
			Server            string `json:"server"`
			InRecovery        bool   `json:"in_recovery"`
			SynchronousCommit string `json:"synchronous_commit"`
			Standbys          []struct {
				SyncState string `json:"sync_state"`
			} `json:"standbys"`
		} `json:"durability"`
		DurabilityError string `json:"durability_error"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &list); err != nil {
		t.Fatal(err)
	}
	byID := map[string]int{}
	for i, s := range list {
		byID[s.ID] = i
	}
	p, s := list[byID[storeID(t, onPrimary)]], list[byID[storeID(t, closed)]]
	if d := p.Durability; d == nil || d.InRecovery || d.Server != primary.Addr || d.SynchronousCommit != "on" || len(d.Standbys) != 1 || p.DurabilityError != "" {
		t.Errorf("the primary's store: %s", w.Body)
	}
	if d := s.Durability; d == nil || !d.InRecovery || d.Server != standby.Addr || !strings.Contains(s.DurabilityError, "target_session_attrs=read-write") {
		t.Errorf("the standby's store: %s", w.Body)
	}

	core, logs := observer.New(zapcore.InfoLevel)
	closed.logger = zap.New(core)
	if w := serve(closed, up, request("k2", "{}")); w.Code != http.StatusServiceUnavailable {
		t.Errorf("fail_closed on the standby: %d, want 503", w.Code)
	}
	if n := up.Calls.Load(); n != 1 {
		t.Errorf("fail_closed on the standby: the upstream ran (%d calls)", n)
	}
	if w := serve(open, up, request("k3", "{}")); w.Code != http.StatusCreated || up.Calls.Load() != 2 {
		t.Errorf("fail_open on the standby: %d, upstream calls %d; want the request passed on", w.Code, up.Calls.Load())
	}
	lines := logs.All()
	if len(lines) != 1 || !strings.Contains(fmt.Sprint(lines[0].ContextMap()["error"]), "connected to a read-only server: the records cannot be written there; a standby (in recovery") {
		t.Errorf("log lines of fail_closed on the standby: %+v; want one that says the server is read-only", lines)
	}
}
