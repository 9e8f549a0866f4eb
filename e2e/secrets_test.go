package e2e

import (
	"bytes"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// leakPW is the password of the misspelt connection strings below: it
// must appear in no log line, no admin answer, no command's output.
const leakPW = "Zq7leak-pw"

// secretCase is a storage block that holds leakPW, written or through
// {env.*} placeholders (env), and whether Caddy starts with it (a url
// that cannot parse is refused at load).
type secretCase struct {
	name    string
	storage string
	env     map[string]string
	starts  bool
	// refused: the store answers and refuses, which fails caddy validate
	// (caddy run starts all the same, and says why in its warning).
	refused bool
	says    string // in caddy validate's output and, when it starts, in GET /idempotency/stores: the path was taken
}

// secretCases are the typos of issue 28, on both stores. PGHOST, PGPORT
// and PGUSER lead pgx to the test server when it reads a misspelt URL as
// one keyword/value pair: the server then refuses that pair as an
// unknown setting and its error quotes it, password included.
func secretCases(t *testing.T) (cases []secretCase, env map[string]string) {
	dsn := pgtest.Require(t)
	pg, err := url.Parse(dsn)
	if err != nil || pg.Port() == "" {
		testutil.Unavailable(t, "these tests need %s as a URL with host and port", pgtest.EnvDSN)
	}
	redis := sharedRedisAddr(t)
	dead := deadPort(t)
	env = map[string]string{"PGHOST": pg.Hostname(), "PGPORT": pg.Port(), "PGUSER": pg.User.Username()}
	typo := "postgress://" + pg.User.Username() + ":" + leakPW + "@" + pg.Host + "/test?sslmode=disable"
	pgBlock := func(dsn string) string { return "storage postgres {\n\tdsn \"" + dsn + "\"\n}" }
	return []secretCase{
		{name: "postgres scheme typo", storage: pgBlock(typo), starts: false, says: "must be postgres:// or postgresql://"},
		{name: "postgres scheme typo from env", storage: pgBlock("{env.IDEM_E2E_DSN}"), env: map[string]string{"IDEM_E2E_DSN": typo}, starts: false, says: "must be postgres:// or postgresql://"},
		{name: "postgres keyword typo", storage: pgBlock("host=" + pg.Hostname() + " port=" + pg.Port() + " user=" + pg.User.Username() + " pasword=" + leakPW + " dbname=test sslmode=disable"), starts: true, refused: true, says: `unrecognized configuration parameter \"pasword\"`},
		{name: "postgres keyword quoted, wrong database", storage: pgBlock("host=" + pg.Hostname() + " port=" + pg.Port() + " user=" + pg.User.Username() + " password='" + leakPW + "' dbname=nosuchdb sslmode=disable"), starts: true, refused: true, says: `database \"nosuchdb\" does not exist`},
		{name: "postgres password from env, dead port", storage: pgBlock("postgres://app:{env.IDEM_E2E_PW}@" + dead + "/test?sslmode=disable"), env: map[string]string{"IDEM_E2E_PW": leakPW}, starts: true, says: "connection refused"},
		{name: "postgres missing colon", storage: pgBlock("postgres//app:" + leakPW + "@" + pg.Host + "/test"), starts: false, says: "not a valid connection string"},
		{name: "redis missing colon", storage: "storage redis {\n\turl redis//:" + leakPW + "@" + redis + "\n}", starts: false, says: "url must start with a scheme"},
		{name: "rediss one slash", storage: "storage redis {\n\turl rediss:/:" + leakPW + "@" + redis + "\n}", starts: false, says: "url must start with a scheme"},
		{name: "redis password in the path", storage: "storage redis {\n\turl redis://:" + leakPW + "@" + redis + "/" + leakPW + "\n}", starts: false, says: "invalid database number"},
		// A password with an unencoded '/' (base64): net/url reads its
		// first part as the host's port, the rest as the path.
		{name: "redis password with a slash", storage: "storage redis {\n\turl redis://:1234/" + leakPW + "@" + redis + "\n}", starts: false, says: "invalid url"},
		{name: "redis wrong password", storage: "storage redis {\n\turl redis://nosuchuser:" + leakPW + "@" + redis + "/0\n}", starts: true, refused: true, says: "WRONGPASS"},
		{name: "redis password from env", storage: "storage redis {\n\turl redis://" + redis + "/0\n\tusername nosuchuser\n\tpassword {env.IDEM_E2E_PW}\n}", env: map[string]string{"IDEM_E2E_PW": leakPW}, starts: true, refused: true, says: "WRONGPASS"},
		{name: "redis sentinel passwords", storage: "storage redis {\n\taddresses " + dead + "\n\tmaster_name m\n\tpassword " + leakPW + "\n\tsentinel_password {env.IDEM_E2E_PW}\n}", env: map[string]string{"IDEM_E2E_PW": leakPW}, starts: true, says: "sentinels"},
		{name: "redis sentinel address with a password", storage: "storage redis {\n\taddresses redis://:" + leakPW + "@" + dead + "\n\tmaster_name m\n}", starts: false, says: "without credentials"},
	}, env
}

// No password of a misspelt DSN or URL reaches a log line, an admin
// answer or a command's output (issue 28): through caddy run, keyed
// requests, the admin API and caddy idempotency list, caddy validate and
// caddy adapt.
func TestNoPasswordInAnyLogOrAnswer(t *testing.T) {
	cases, env := secretCases(t)
	for k, v := range env {
		t.Setenv(k, v)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			noLeak := func(what, s string) {
				t.Helper()
				if strings.Contains(s, leakPW) {
					t.Errorf("%s holds the password:\n%s", what, s)
				}
			}
			up := newUpstream(t)
			s := site{routes: route(up, tc.storage)}

			config := caddyproc.Config{Sites: s.config(8080).Sites}
			ok, out := caddyValidate(t, "{\n\tadmin off\n\tpersist_config off\n}\n\n"+config.Sites, "caddyfile")
			if want := tc.starts && !tc.refused; ok != want {
				t.Errorf("caddy validate accepted it: %v, want %v:\n%s", ok, want, tail(out, 20))
			}
			noLeak("caddy validate's output", out)
			if !strings.Contains(out, tc.says) {
				// Refused, or warned of with its real cause: validate waits
				// for the store's first ping.
				t.Errorf("caddy validate's output does not say %s:\n%s", tc.says, tail(out, 20))
			}
			stdout, stderr := caddyAdapt(t, "{\n\tadmin off\n}\n\n"+config.Sites)
			noLeak("caddy adapt's log", stderr)
			if !strings.Contains(tc.storage, leakPW) {
				// A password written in the Caddyfile is in the config
				// it adapts to, as in the Caddyfile itself.
				noLeak("caddy adapt's config (the password comes from the environment)", stdout)
			}

			port, err := caddyproc.FreePort()
			if err != nil {
				t.Fatal(err)
			}
			inst, err := caddyproc.Start(caddyBin, t.TempDir(), "caddy", port, s.config(port))
			if !tc.starts {
				if err == nil {
					inst.Stop()
					t.Fatal("caddy run started")
				}
				noLeak("caddy run's refusal", err.Error())
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer inst.Stop()
			testutil.Eventually(t, 20*time.Second, "the start-up warning about the store", func() bool {
				return strings.Contains(inst.Log(), `"msg":"idempotency store not`) || strings.Contains(inst.Log(), `"msg":"idempotency store unreachable`)
			})
			// Keyed requests meet the store's error and are logged; one
			// more goes each time the line is not there yet (a request
			// can fail on its way on a loaded machine).
			var last reply
			deadline := time.Now().Add(20 * time.Second)
			for i := 0; !strings.Contains(inst.Log(), `"msg":"idempotency store unavailable`); i++ {
				if i >= 3 && time.Now().After(deadline) {
					t.Fatalf("no log line of the store errors within 20s; the last answer: %s\n%s", last.String(), tail(inst.Log(), 20))
				}
				last = post(inst.URL(), "/orders", "leak-key-"+strconv.Itoa(i), `{"n":1}`)
				noLeak("an answer", last.String())
				if i >= 3 {
					time.Sleep(100 * time.Millisecond)
				}
			}
			for _, path := range []string{"/idempotency/stores", "/idempotency/keys?key_hash=0123456789abcdef", "/idempotency/in_flight"} {
				_, body := adminGet(t, inst, path)
				noLeak("GET "+path, string(body))
				if path == "/idempotency/stores" && !strings.Contains(string(body), tc.says) {
					t.Errorf("GET %s does not say %s: %s", path, tc.says, body)
				}
			}
			for _, args := range [][]string{{"list"}, {"get", "--key-hash", "0123456789abcdef"}} {
				cmd := exec.Command(caddyBin, append(append([]string{"idempotency"}, args...), "--address", inst.AdminAddr)...)
				b, _ := cmd.CombinedOutput()
				noLeak("caddy idempotency "+args[0], string(b))
			}
			inst.Stop()
			noLeak("the log of caddy run", inst.Log())
		})
	}
}

// caddyAdapt runs `caddy adapt` on a Caddyfile and returns its output (the
// JSON config) and its log.
func caddyAdapt(t *testing.T, caddyfile string) (stdout, stderr string) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(caddyfile), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(caddyBin, "adapt", "--config", path, "--adapter", "caddyfile")
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	if err := cmd.Run(); err != nil {
		if _, exited := err.(*exec.ExitError); !exited {
			t.Fatalf("running caddy adapt: %v", err)
		}
	}
	return o.String(), e.String()
}
