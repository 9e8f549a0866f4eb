package inprocess_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// TestARoutesTTLChangesThroughTheAdminAPI changes one handler's ttl in
// the running config with PATCH /id/<@id>/ttl, as docs/operations.md
// shows: records made after it expire a new ttl after their completion.
func TestARoutesTTLChangesThroughTheAdminAPI(t *testing.T) {
	admin, site := freeAddr(t), freeAddr(t)
	cfg := fmt.Sprintf(`{
		"admin": {"listen": %q},
		"apps": {"http": {"servers": {"srv0": {"listen": [%q], "routes": [{"handle": [
			{"handler": "idempotency", "@id": "orders-idempotency", "ttl": "1h", "storage": {"backend": "memory", "max_keys": 123458}},
			{"handler": "static_response", "status_code": 201, "body": "made"}
		]}]}}}}
	}`, admin, site)
	if err := caddy.Load([]byte(cfg), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })

	req, _ := http.NewRequest(http.MethodPatch, "http://"+admin+"/id/orders-idempotency/ttl", strings.NewReader(`"72h"`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PATCH ttl: %d %s", resp.StatusCode, body)
	}

	post, _ := http.NewRequest(http.MethodPost, "http://"+site+"/orders", strings.NewReader("{}"))
	post.Header.Set("Idempotency-Key", "patched-ttl")
	post.Header.Set("Content-Type", "application/json")
	resp, err = http.DefaultClient.Do(post)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	host := strings.Split(site, ":")[0]
	q := url.Values{"key": {"patched-ttl"}, "scope": {host, ""}}
	resp, err = http.Get("http://" + admin + "/idempotency/keys?" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got struct {
		Records []struct {
			CreatedAt time.Time `json:"created_at"`
			ExpiresAt time.Time `json:"expires_at"`
		} `json:"records"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || len(got.Records) != 1 {
		t.Fatalf("admin GET: %v %+v", err, got)
	}
	if ttl := got.Records[0].ExpiresAt.Sub(got.Records[0].CreatedAt); ttl < 71*time.Hour || ttl > 73*time.Hour {
		t.Fatalf("the record expires %s after it was made, want the patched 72h", ttl)
	}
}

// TestAPatchedTTLFromACaddyfileAndItsReload follows docs/operations.md
// (Changing TTLs) for a Caddyfile, which cannot carry an @id: adapt it,
// give the handler an @id in the JSON, load that, PATCH the ttl; then a
// reload of the Caddyfile (what caddy reload posts to /load) brings its
// own ttl back, and the @id is gone.
func TestAPatchedTTLFromACaddyfileAndItsReload(t *testing.T) {
	admin, site := freeAddr(t), freeAddr(t)
	caddyfile := fmt.Sprintf("{\n\tadmin %s\n\tauto_https off\n\tpersist_config off\n}\n\nhttp://%s {\n\tidempotency {\n\t\tttl 1h\n\t\tstorage memory {\n\t\t\tmax_keys 123459\n\t\t}\n\t}\n\trespond 201\n}\n", admin, site)
	adapted, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatal(err)
	}
	// The edit: "@id" on the idempotency handler.
	var cfg any
	if err := json.Unmarshal(adapted, &cfg); err != nil {
		t.Fatal(err)
	}
	var tagged int
	var tag func(v any)
	tag = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if v["handler"] == "idempotency" {
				v["@id"] = "payments-idempotency"
				tagged++
			}
			for _, e := range v {
				tag(e)
			}
		case []any:
			for _, e := range v {
				tag(e)
			}
		}
	}
	tag(cfg)
	edited, _ := json.Marshal(cfg)
	if tagged != 1 {
		t.Fatalf("tagged %d idempotency handlers in %s", tagged, adapted)
	}
	load := func(config []byte) {
		t.Helper()
		resp, err := http.Post("http://"+admin+"/load", "application/json", bytes.NewReader(config))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST /load: %d %s", resp.StatusCode, body)
		}
	}
	ttl := func() (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + admin + "/id/payments-idempotency/ttl")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(body))
	}

	if err := caddy.Load(edited, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	req, _ := http.NewRequest(http.MethodPatch, "http://"+admin+"/id/payments-idempotency/ttl", strings.NewReader(`"72h"`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if code, got := ttl(); resp.StatusCode != http.StatusOK || code != http.StatusOK || got != `"72h"` {
		t.Fatalf("PATCH: %d; then the ttl is %d %s, want 72h", resp.StatusCode, code, got)
	}

	load(adapted) // caddy reload --config Caddyfile
	if code, got := ttl(); code == http.StatusOK {
		t.Fatalf("after the Caddyfile's reload, /id/payments-idempotency/ttl is still %s", got)
	}
	resp, err = http.Get("http://" + admin + "/config/apps/http/servers")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `"ttl":3600000000000`) || strings.Contains(string(body), "72h") { // 1h, as caddy adapt writes it
		t.Fatalf("after the Caddyfile's reload the config holds %s, want its ttl 1h", body)
	}
}
