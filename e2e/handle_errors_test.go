package e2e

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// With `errors handle_errors`, rejections reach the site's handle_errors
// routes, as Caddy users render errors site-wide.
func TestRejectionsCanBeRenderedByHandleErrors(t *testing.T) {
	up := newUpstream(t)
	inst := startCaddy(t, "caddy", site{routes: route(up, "errors handle_errors\nrequired\nin_flight reject") +
		"\thandle_errors {\n\t\trespond \"custom {http.error.status_code} {http.idempotency.problem}: {http.error.message}\"\n\t}\n"})
	want := func(what string, r reply, status int, problem string) {
		t.Helper()
		prefix := "custom " + strconv.Itoa(status) + " urn:caddy-idempotency:" + problem + ": "
		if r.status != status || !strings.HasPrefix(string(r.body), prefix) || len(r.body) == len(prefix) {
			t.Fatalf("%s: %s, want %d rendered by handle_errors as %q followed by the detail", what, describe(r), status, prefix)
		}
	}
	want("no key", post(inst.URL(), "/orders", "", `{}`), 400, "key-missing")
	want("malformed key", post(inst.URL(), "/orders", "a b", `{}`), 400, "key-invalid")
	if r := post(inst.URL(), "/orders", "he", `{"amount":1}`); !r.isNew() {
		t.Fatalf("first: %s", describe(r))
	}
	r := post(inst.URL(), "/orders", "he", `{"amount":2}`)
	want("reuse for another request", r, 422, "key-reused")
	if !strings.Contains(string(r.body), "/amount") {
		t.Errorf("the 422's message %q does not name what differs", r.body)
	}
	running(t, up, inst, "busy", `{}`, time.Second)
	r = post(inst.URL(), "/orders", "busy", `{}`)
	want("while the first runs", r, 409, "request-outstanding")
	if r.header.Get("Retry-After") != "1" {
		t.Errorf("409 through handle_errors: Retry-After %q, want 1", r.header.Get("Retry-After"))
	}
}

// TestProblemsCanTakeAClientsErrorShape: the recipe of docs/clients.md
// renders a rejection in Stripe's shape ({"error": {...}}), which its
// library throws on instead of taking it for a successful object.
func TestProblemsCanTakeAClientsErrorShape(t *testing.T) {
	up := newUpstream(t)
	inst := startCaddy(t, "caddy", site{routes: route(up, "errors handle_errors") +
		"\thandle_errors {\n\t\theader Content-Type application/json\n" +
		"\t\trespond `{\"error\":{\"type\":\"idempotency_error\",\"code\":\"{http.idempotency.problem}\",\"message\":\"{http.error.message}\"}}` {http.error.status_code}\n\t}\n"})
	if r := post(inst.URL(), "/orders", "shape", `{"amount":1}`); !r.isNew() {
		t.Fatalf("first: %s", describe(r))
	}
	r := post(inst.URL(), "/orders", "shape", `{"amount":2}`)
	var body struct {
		Error struct{ Type, Code, Message string } `json:"error"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil || r.status != 422 || r.header.Get("Content-Type") != "application/json" ||
		body.Error.Code != "urn:caddy-idempotency:key-reused" || !strings.Contains(body.Error.Message, "/amount") {
		t.Fatalf("a key reused for another request: %s (%v), want a 422 in the error shape naming /amount", describe(r), err)
	}
	// docs/clients.md shows this answer: it must be what the module sends.
	doc, err := os.ReadFile("../docs/clients.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, _ := strings.Cut(string(doc), "A key reused for another request then gets:")
	_, block, _ := strings.Cut(after, "```http\n")
	block, _, _ = strings.Cut(block, "```")
	_, documented, _ := strings.Cut(block, "\n\n")
	if strings.TrimSpace(documented) != strings.TrimSpace(string(r.body)) {
		t.Fatalf("docs/clients.md shows the 422 as\n%s\nthe module sends\n%s", strings.TrimSpace(documented), r.body)
	}
}
