package inprocess_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
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
