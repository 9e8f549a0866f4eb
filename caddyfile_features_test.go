package idempotency_test

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

func TestFeatureOptionsParse(t *testing.T) {
	h, err := parse(block("mode observe", "key_json /data/object/id", "wait_timeout 5s", "fingerprint {", "\tignore /sent_at /a~1b", "}"))
	if err != nil {
		t.Fatal(err)
	}
	if h.Mode != "observe" || h.KeyJSON != "/data/object/id" || h.WaitTimeout != caddy.Duration(5*time.Second) ||
		h.Fingerprint == nil || strings.Join(h.Fingerprint.Ignore, " ") != "/sent_at /a~1b" {
		t.Fatalf("parsed %+v %+v", h, h.Fingerprint)
	}
}

func TestFeatureOptionErrors(t *testing.T) {
	tests := []struct {
		name string
		body []string
		line int
		want []string
	}{
		{"bad mode", []string{"mode strict"}, 3, []string{"mode", "enforce", "observe", "'strict'"}},
		{"key_json without a slash", []string{"key_json id"}, 3, []string{"key_json", "must start with '/'"}},
		{"key_json bad escape", []string{"key_json /a~2"}, 3, []string{"key_json", "'~'"}},
		{"ignore without canonical JSON", []string{"fingerprint {", "\tcanonical_json false", "\tignore /sent_at", "}"}, 6, []string{"ignore needs canonical_json"}},
		{"ignore bad pointer", []string{"fingerprint {", "\tignore sent_at", "}"}, 5, []string{"fingerprint ignore", "must start with '/'"}},
		{"wait_timeout twice", []string{"in_flight wait 3s", "wait_timeout 5s"}, 4, []string{"wait_timeout", "already given"}},
		{"wait timeout twice the other way", []string{"wait_timeout 5s", "in_flight wait 3s"}, 4, []string{"already given by wait_timeout"}},
		{"wait_timeout zero", []string{"wait_timeout 0s"}, 3, []string{"wait_timeout", "positive"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse(block(tt.body...))
			wantParseError(t, err, tt.line, tt.want...)
		})
	}
}
