package inprocess_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
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
	// By the key hash of the logs alone.
	out, err = runIdempotency(t, "get", "--key-hash", got.Records[0].KeyHash, "--address", admin)
	if err != nil || !strings.Contains(out, `"status":201`) {
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
