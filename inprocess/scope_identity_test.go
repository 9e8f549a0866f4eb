package inprocess_test

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"
)

// TestAnIdentityScopeBeforeItsAuthenticationIsRefused is the review's
// finding: scope {http.request.host} {http.auth.user.id}, with basic_auth
// written after idempotency in a route, reads the identity before anyone
// set it: every client of the host shared one scope, and bob's request
// with alice's key was answered alice's response (a replay across
// clients). An empty authentication placeholder now makes the scope
// blank: 400 scope-empty, naming the order to fix, and nothing runs. With
// basic_auth first, the two are two clients.
func TestAnIdentityScopeBeforeItsAuthenticationIsRefused(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte("secret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	auth := func(user string) []string {
		return []string{"Authorization", "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":secret"))}
	}
	up := modelUpstream(t)
	site := func(first, second string) string {
		return `
	route {
		` + first + `
		` + second + `
		reverse_proxy ` + up.Addr + `
	}`
	}
	idem := `idempotency {
			scope {http.request.host} {http.auth.user.id}
			storage memory {
				max_keys ` + fmt.Sprint(uniqueMaxKeys()) + `
			}
		}`
	basic := `basic_auth {
			alice ` + string(hash) + `
			bob ` + string(hash) + `
		}`

	base := loadCaddyfile(t, freePort(t), site(idem, basic))
	for _, user := range []string{"alice", "bob"} {
		resp, _, body := attempt{key: "shared-key", body: `{"amount":10}`, ctype: "application/json", do: "s=201", header: auth(user)}.send(t, base)
		if statusOf(resp) != http.StatusBadRequest || !strings.Contains(body, "scope-empty") || !strings.Contains(body, "authentication") {
			t.Fatalf("%s, with basic_auth after idempotency: %d %s; want 400 scope-empty naming the authentication order", user, statusOf(resp), body)
		}
	}

	base = loadCaddyfile(t, freePort(t), site(basic, idem))
	for _, user := range []string{"alice", "bob"} {
		resp, _, body := attempt{key: "shared-key", body: `{"amount":10}`, ctype: "application/json", do: "s=201", header: auth(user)}.send(t, base)
		if statusOf(resp) != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("%s, with basic_auth first: %d %s; want its own execution", user, statusOf(resp), body)
		}
	}
	if n := len(up.Executions()); n != 2 {
		t.Fatalf("the upstream ran %d times, want 2 (alice's and bob's, with basic_auth first)", n)
	}
}
