package e2e

import (
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

// A PostgreSQL store that cannot serve says why, at once, in caddy
// validate's output, in caddy run's start-up log and in GET
// /idempotency/stores (issue 28): a missing table or column (create_table
// off), a wrong password, a closed port, a wrong database, a parameter
// the server does not know, a read-only database. Never the "operation
// was canceled" or "closed pool" of a pool closed under its ping. Validate
// refuses a store that answered and refused, and accepts one it could not
// reach with a warning (CI may validate without the store); run starts
// with a warning either way: the store may be fixed or come up later.
func TestAStoreThatCannotServeSaysWhy(t *testing.T) {
	dsn := pgtest.Require(t)
	u, err := url.Parse(dsn)
	if err != nil || u.Port() == "" {
		testutil.Unavailable(t, "these tests need %s as a URL with host and port", pgtest.EnvDSN)
	}
	at := func(edit func(u *url.URL)) string {
		c := *u
		edit(&c)
		return c.String()
	}
	noDetail := pgtest.Table(t, dsn)
	ddl, err := postgres.Schema(noDetail)
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, dsn, ddl[0])
	pgtest.Exec(t, dsn, "ALTER TABLE "+pgx.Identifier{noDetail}.Sanitize()+" DROP COLUMN detail")
	role, password := pgtest.Name("idem_pw_"), "right-pw"
	requirePassword(t, dsn, role, password)
	missing := pgtest.Table(t, dsn)
	readOnly, readOnlyName := pgtest.Database(t, dsn)
	pgtest.Exec(t, dsn, `ALTER DATABASE `+pgx.Identifier{readOnlyName}.Sanitize()+` SET default_transaction_read_only = on`)

	for _, tc := range []struct {
		name, dsn, options string
		want               []string // in the warning, and in the admin API's error
		unreachable        bool     // validate warns instead of failing
	}{
		{"missing table", dsn, "table " + missing + "\n\t\tcreate_table false",
			[]string{`table \"` + missing + `\" does not exist`, "caddy idempotency schema", "create_table"}, false},
		{"missing column", dsn, "table " + noDetail + "\n\t\tcreate_table false",
			[]string{`table \"` + noDetail + `\" lacks a column`, "column detail", "caddy idempotency schema", "create_table"}, false},
		{"wrong password", at(func(u *url.URL) { u.User = url.UserPassword(role, "wrong-pw") }), "",
			[]string{"password authentication failed for user", "28P01"}, false},
		{"closed port", at(func(u *url.URL) { u.Host = deadPort(t) }), "",
			[]string{"connection refused"}, true},
		{"wrong database", at(func(u *url.URL) { u.Path = "/nosuchdb" }), "",
			[]string{`database \"nosuchdb\" does not exist`}, false},
		{"misspelt parameter", at(func(u *url.URL) { u.RawQuery = "sslmod=disable" }), "",
			[]string{`unrecognized configuration parameter \"sslmod\"`}, false},
		{"read-only database", readOnly, "",
			[]string{"read-only server", "default_transaction_read_only"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storage := "storage postgres {\n\t\tdsn \"" + tc.dsn + "\"\n\t\t" + tc.options + "\n\t}"
			up := newUpstream(t)
			s := site{routes: route(up, storage)}
			wrong := func(what, out string) {
				t.Helper()
				for _, w := range tc.want {
					if !strings.Contains(out, w) {
						t.Errorf("%s does not say %s:\n%s", what, w, tail(out, 20))
					}
				}
				for _, bad := range []string{"operation was canceled", "closed pool", "context canceled"} {
					if strings.Contains(out, bad) {
						t.Errorf("%s says %q instead of the cause:\n%s", what, bad, tail(out, 20))
					}
				}
			}

			ok, out := caddyValidate(t, "{\n\tadmin off\n\tpersist_config off\n}\n\n"+s.config(8080).Sites, "caddyfile")
			switch {
			case tc.unreachable && (!ok || !strings.Contains(out, "Valid configuration")):
				t.Errorf("caddy validate refused a store it could not reach (a warning, as at start-up):\n%s", tail(out, 20))
			case tc.unreachable && !strings.Contains(out, `"msg":"idempotency store unreachable while validating`):
				t.Errorf("caddy validate did not warn of the store:\n%s", tail(out, 20))
			case !tc.unreachable && ok:
				t.Errorf("caddy validate accepted a store that answered and refused:\n%s", tail(out, 20))
			case !tc.unreachable && !strings.Contains(out, "idempotency store not usable: it answered with an error"):
				t.Errorf("caddy validate did not say the store refused:\n%s", tail(out, 20))
			}
			wrong("caddy validate", out)

			inst := startCaddy(t, "caddy", s)
			testutil.Eventually(t, 20*time.Second, "the start-up warning", func() bool {
				return strings.Contains(inst.Log(), `"msg":"idempotency store not usable`) || strings.Contains(inst.Log(), `"msg":"idempotency store unreachable`)
			})
			wrong("the start-up warning", inst.Log())
			if n := strings.Count(inst.Log(), `"msg":"idempotency store not usable`) + strings.Count(inst.Log(), `"msg":"idempotency store unreachable`); n != 1 {
				t.Errorf("%d start-up warnings, want 1", n)
			}
			_, body := adminGet(t, inst, "/idempotency/stores")
			var stores []struct {
				Ping struct {
					OK    bool   `json:"ok"`
					Error string `json:"error"`
				} `json:"ping"`
			}
			if err := json.Unmarshal(body, &stores); err != nil || len(stores) != 1 {
				t.Fatalf("GET /idempotency/stores: %v: %s", err, body)
			}
			if stores[0].Ping.OK {
				t.Errorf("GET /idempotency/stores says ok: %s", body)
			}
			b, _ := json.Marshal(stores[0].Ping.Error) // the log's JSON escaping, for the same wants
			wrong("GET /idempotency/stores", string(b))
		})
	}
}

// requirePassword creates role with password and has the server ask it
// for its password (scram-sha-256), whatever the rest of pg_hba.conf says;
// both are undone when the test ends. pg_hba.conf is rewritten by the
// server (COPY ... TO, as a superuser), since the server runs as another
// user; only a throwaway server's, never a system's.
func requirePassword(t *testing.T, dsn, role, password string) {
	t.Helper()
	// Only a throwaway server of the test run's own (make test's
	// testservers, in the temporary directory) has its pg_hba.conf
	// changed: a system's configuration is never touched.
	var hbaFile string
	pgQuery(t, "SELECT current_setting('hba_file')", func(r pgx.Rows) error { return r.Scan(&hbaFile) })
	if rel, err := filepath.Rel(os.TempDir(), hbaFile); err != nil || strings.HasPrefix(rel, "..") {
		testutil.Unavailable(t, "the PostgreSQL server's pg_hba.conf (%s) is not a throwaway server's (under %s): run with make test's private servers", hbaFile, os.TempDir())
	}
	var orig string
	pgQuery(t, "SELECT pg_read_file(current_setting('hba_file'))", func(r pgx.Rows) error { return r.Scan(&orig) })
	if strings.Contains(orig, `\`) {
		testutil.Unavailable(t, "pg_hba.conf holds a backslash, which COPY would escape")
	}
	write := func(content string) {
		lines := strings.Split(strings.ReplaceAll(strings.TrimRight(content, "\n"), "\t", " "), "\n")
		array, err := json.Marshal(lines)
		if err != nil {
			t.Fatal(err)
		}
		pgtest.Exec(t, dsn, "DO $do$ BEGIN EXECUTE format('COPY (SELECT unnest(ARRAY(SELECT json_array_elements_text(%L::json)))) TO %L', "+
			pgQuote(string(array))+", current_setting('hba_file')); END $do$")
		pgtest.Exec(t, dsn, "SELECT pg_reload_conf()")
	}
	pgtest.Exec(t, dsn, "CREATE ROLE "+role+" LOGIN PASSWORD "+pgQuote(password))
	t.Cleanup(func() {
		write(orig)
		pgtest.Exec(t, dsn, "DROP ROLE IF EXISTS "+role)
	})
	write("host all " + role + " all scram-sha-256\n" + orig)
	// The reload is asynchronous: wait until the role is asked for its
	// password.
	testutil.Eventually(t, 10*time.Second, "pg_hba.conf to ask "+role+" for a password", func() bool {
		c := strings.Replace(dsn, "postgres://postgres@", "postgres://"+role+":wrong@", 1)
		conn, err := pgx.Connect(t.Context(), c)
		if err == nil {
			conn.Close(t.Context())
			return false
		}
		return strings.Contains(err.Error(), "password authentication failed")
	})
}

// pgQuote quotes s as an SQL string literal.
func pgQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// caddy validate writes nothing: a PostgreSQL store that would create
// its table on first use (create_table, the default) leaves the database
// as it was, and the configuration is valid; caddy run creates the table
// (its first ping).
func TestValidateWritesNothing(t *testing.T) {
	dsn := pgtest.Require(t)
	table := pgtest.Table(t, dsn)
	up := newUpstream(t)
	s := site{routes: route(up, "storage postgres {\n\t\tdsn \""+dsn+"\"\n\t\ttable "+table+"\n\t}")}
	exists := func() bool {
		var name *string
		pgQuery(t, "SELECT to_regclass('"+table+"')::text", func(r pgx.Rows) error { return r.Scan(&name) })
		return name != nil
	}
	ok, out := caddyValidate(t, "{\n\tadmin off\n\tpersist_config off\n}\n\n"+s.config(8080).Sites, "caddyfile")
	if !ok || !strings.Contains(out, "Valid configuration") {
		t.Fatalf("caddy validate refused a store that answers:\n%s", tail(out, 20))
	}
	if exists() {
		t.Fatalf("caddy validate created the table %s", table)
	}
	startCaddy(t, "caddy", s)
	testutil.Eventually(t, 20*time.Second, "caddy run to create the table", exists)
}
