package inprocess_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
)

// runIdempotency runs `caddy idempotency <sub> <args>` as the caddy
// binary registers it, and returns what it printed.
func runIdempotency(t *testing.T, sub string, args ...string) (string, error) {
	t.Helper()
	reg, ok := caddycmd.Commands()["idempotency"]
	if !ok {
		t.Fatal("the module registers no idempotency command")
	}
	cmd := &cobra.Command{Use: reg.Name}
	reg.CobraFunc(cmd)
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append([]string{sub}, args...))
	err := cmd.Execute()
	return out.String(), err
}

// TestGetAndDeleteCommandsTalkToTheAdminAPI runs Caddy in this process
// with its admin API on a free port, records a key, and shows and deletes
// it with `caddy idempotency get` and `delete`.
func TestGetAndDeleteCommandsTalkToTheAdminAPI(t *testing.T) {
	admin, site := freeAddr(t), freeAddr(t)
	cfg := fmt.Sprintf(`{
		"admin": {"listen": %q},
		"apps": {"http": {"servers": {"srv0": {"listen": [%q], "routes": [{"handle": [
			{"handler": "idempotency", "storage": {"backend": "memory", "max_keys": 123457}},
			{"handler": "static_response", "status_code": 201, "body": "made"}
		]}]}}}}
	}`, admin, site)
	if err := caddy.Load([]byte(cfg), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })

	req, _ := http.NewRequest(http.MethodPost, "http://"+site+"/orders", strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", "cmd-1")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	host, _, _ := net.SplitHostPort(site)
	scope := []string{"--key", "cmd-1", "--scope", host, "--scope", ""}

	out, err := runIdempotency(t, "get", append(scope, "--address", admin, "--body")...)
	var got struct {
		Records []struct {
			Status  int    `json:"status"`
			Body    string `json:"body"`
			KeyHash string `json:"key_hash"`
		} `json:"records"`
	}
	if err != nil || json.Unmarshal([]byte(out), &got) != nil || len(got.Records) != 1 || got.Records[0].Status != 201 || got.Records[0].Body == "" {
		t.Fatalf("get: %v %q, want the record of cmd-1 with its body", err, out)
	}
	// Readable: indented, one member a line, ending with a newline.
	if !strings.HasPrefix(out, "{\n  \"records\": [\n") || !strings.Contains(out, "\n      \"status\": 201,\n") || !strings.HasSuffix(out, "}\n") {
		t.Fatalf("get printed %q, want indented JSON", out)
	}
	// By the key hash of the logs alone.
	out, err = runIdempotency(t, "get", "--key-hash", got.Records[0].KeyHash, "--address", admin)
	if err != nil || !strings.Contains(out, `"status": 201`) {
		t.Fatalf("get --key-hash: %v %q", err, out)
	}
	// list: the record is completed, so no store lists it in flight.
	out, err = runIdempotency(t, "list", "--address", admin, "--limit", "10")
	var listed struct {
		Stores []struct {
			Records []any `json:"records"`
		} `json:"stores"`
	}
	if err != nil || json.Unmarshal([]byte(out), &listed) != nil || len(listed.Stores) == 0 || len(listed.Stores[0].Records) != 0 {
		t.Fatalf("list: %v %q, want the stores, nothing in flight", err, out)
	}
	if _, err := runIdempotency(t, "delete", append(scope, "--address", admin)...); err != nil {
		t.Fatal(err)
	}
	out, err = runIdempotency(t, "get", append(scope, "--address", admin)...)
	if err == nil || !strings.Contains(err.Error(), "no live record") {
		t.Fatalf("get after delete: %v %q, want the admin API's 404", err, out)
	}
}

// TestRecordCommandsFindTheAdminAddressInTheConfig: with --config, get
// and list talk to the admin address the config file gives, a Caddyfile
// (adapted) or JSON, as caddy reload does; --address wins over it.
func TestRecordCommandsFindTheAdminAddressInTheConfig(t *testing.T) {
	admin, site := freeAddr(t), freeAddr(t)
	dir := t.TempDir()
	caddyfile := filepath.Join(dir, "Caddyfile")
	text := fmt.Sprintf("{\n\tadmin %s\n\tauto_https off\n\tpersist_config off\n}\n\nhttp://%s {\n\tidempotency\n\trespond 201\n}\n", admin, site)
	if err := os.WriteFile(caddyfile, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(text), map[string]any{"filename": caddyfile})
	if err != nil {
		t.Fatal(err)
	}
	jsonFile := filepath.Join(dir, "caddy.json")
	if err := os.WriteFile(jsonFile, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })

	req, _ := http.NewRequest(http.MethodPost, "http://"+site+"/orders", strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", "by-config")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	host, _, _ := net.SplitHostPort(site)
	key := []string{"--key", "by-config", "--scope", host, "--scope", ""}
	for _, args := range [][]string{
		{"--config", caddyfile},
		{"-c", caddyfile, "-a", "caddyfile"},
		{"--config", jsonFile},
		{"--config", filepath.Join(dir, "missing.json"), "--address", admin}, // --address first, the file never read
	} {
		out, err := runIdempotency(t, "get", append(key, args...)...)
		if err != nil || !strings.Contains(out, `"status": 201`) {
			t.Fatalf("get %q: %v %q, want the record", args, err, out)
		}
		if out, err := runIdempotency(t, "list", args...); err != nil || !strings.Contains(out, `"stores"`) {
			t.Fatalf("list %q: %v %q", args, err, out)
		}
	}
	// A --config that cannot be read is an error, as for caddy reload.
	if out, err := runIdempotency(t, "get", append(key, "--config", filepath.Join(dir, "missing.json"))...); err == nil {
		t.Fatalf("get with a config file that does not exist: %q, want an error", out)
	}
}

// freeAddr is a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
