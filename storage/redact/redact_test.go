package redact

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
)

// The DSNs operators write, typos included, each holding the password
// s3cr3t-pw (or its encoded form): the redacted DSN and Secrets must hide
// it whatever the driver would make of the string.
var typos = []struct {
	name, dsn string
}{
	{"postgres url", "postgres://app:s3cr3t-pw@127.0.0.1:5432/db?sslmode=disable"},
	{"postgres scheme typo", "postgress://app:s3cr3t-pw@127.0.0.1/db"},
	{"postgres scheme typo with query", "postgress://app:s3cr3t-pw@127.0.0.1/db?sslmode=disable"},
	{"postgres missing colon", "postgres//app:s3cr3t-pw@127.0.0.1/db"},
	{"postgres one slash", "postgresql:/app:s3cr3t-pw@127.0.0.1/db"},
	{"postgres no slashes", "postgres:app:s3cr3t-pw@127.0.0.1/db"},
	{"postgres password query", "postgres://app@127.0.0.1/db?sslmode=disable&password=s3cr3t-pw"},
	{"postgres keyword", "host=127.0.0.1 port=5432 user=app password=s3cr3t-pw dbname=db"},
	{"postgres keyword spaces", "host=127.0.0.1 user=app password = s3cr3t-pw dbname=db"},
	{"postgres keyword quoted", "host=127.0.0.1 user=app password='s3cr3t-pw' dbname=db"},
	{"postgres keyword quoted escapes", `host=127.0.0.1 user=app password='s3cr3t-pw\'s' dbname=db`},
	{"postgres keyword first", "password=s3cr3t-pw host=127.0.0.1"},
	{"postgres keyword typo", "host=127.0.0.1 user=app pasword=s3cr3t-pw dbname=db"},
	{"redis url", "redis://:s3cr3t-pw@127.0.0.1:6379/0"},
	{"redis user", "redis://default:s3cr3t-pw@127.0.0.1:6379"},
	{"redis missing colon", "redis//:s3cr3t-pw@127.0.0.1:6379"},
	{"rediss one slash", "rediss:/:s3cr3t-pw@127.0.0.1:6379"},
	{"redis encoded", "redis://:s3cr3t%2Dpw@127.0.0.1:6379"},
	{"sentinel address", "redis://:s3cr3t-pw@127.0.0.1:26379"},
	{"sentinel addresses", "127.0.0.1:26379, redis://:s3cr3t-pw@127.0.0.1:26380"},
	{"sentinel password option", "sentinel_password=s3cr3t-pw"},
}

func TestDSNHidesThePassword(t *testing.T) {
	for _, tc := range typos {
		t.Run(tc.name, func(t *testing.T) {
			got := DSN(tc.dsn)
			for _, leak := range []string{"s3cr3t-pw", "s3cr3t%2Dpw"} {
				if strings.Contains(got, leak) {
					t.Errorf("DSN(%q) = %q, still holds %q", tc.dsn, got, leak)
				}
			}
			if !strings.Contains(got, Mask) {
				t.Errorf("DSN(%q) = %q, masks nothing", tc.dsn, got)
			}
		})
	}
}

func TestDSNKeepsWhatIsNoSecret(t *testing.T) {
	for dsn, want := range map[string]string{
		"postgres://app:pw1@db.internal:5432/idem":           "postgres://app:xxxxx@db.internal:5432/idem",
		"postgress://app:pw1@127.0.0.1/db":                   "postgress://app:xxxxx@127.0.0.1/db",
		"host=127.0.0.1 user=app password='p w' dbname=idem": "host=127.0.0.1 user=app password='xxxxx' dbname=idem",
		"redis://127.0.0.1:6379/2":                           "redis://127.0.0.1:6379/2",
		"postgres://app@127.0.0.1/db":                        "postgres://app@127.0.0.1/db",
		"host=/run/postgresql dbname=idem":                   "host=/run/postgresql dbname=idem",
	} {
		if got := DSN(dsn); got != want {
			t.Errorf("DSN(%q) = %q, want %q", dsn, got, want)
		}
	}
}

// A driver's message may quote the secret decoded, or a part of the DSN
// it misread: every form Secrets finds is scrubbed.
func TestErrorScrubsEveryFormAndUnwraps(t *testing.T) {
	for _, tc := range typos {
		t.Run(tc.name, func(t *testing.T) {
			driver := fmt.Errorf("server error: FATAL: unrecognized configuration parameter \"%s\" (SQLSTATE 42704): %w", tc.dsn, io.ErrUnexpectedEOF)
			err := fmt.Errorf("postgres ping: %w", Wrap(driver, Secrets(tc.dsn)))
			msg := err.Error()
			for _, leak := range []string{"s3cr3t-pw", "s3cr3t%2Dpw"} {
				if strings.Contains(msg, leak) {
					t.Errorf("%q still holds %q", msg, leak)
				}
			}
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("the scrubbed error no longer wraps the driver's: %v", err)
			}
		})
	}
}

// A URL parser cuts a password at a '/', '?' or '#' that is not
// percent-encoded and quotes a part as the port or the path: each part is
// a secret.
func TestSecretsHoldThePartsOfAPasswordAURLParserCuts(t *testing.T) {
	for dsn, want := range map[string][]string{
		"redis://:Zq7/leak-pw@127.0.0.1:6379":   {"Zq7/leak-pw", "Zq7", "leak-pw"},
		"postgres://app:a?b#c@127.0.0.1/db":     {"a?b#c", "a", "b", "c"},
		"rediss://app:1234/x/@127.0.0.1:6379/0": {"1234/x/", "1234", "x"},
	} {
		got := Secrets(dsn)
		for _, w := range want {
			if !slices.Contains(got, w) {
				t.Errorf("Secrets(%q) = %q, lacks %q", dsn, got, w)
			}
		}
	}
}

// An '@' in a well-formed URL's query is no end of its userinfo: the
// password is the one the URL holds, and no part of the host or the
// query (a "0") becomes a secret that would mask every error's digits.
func TestSecretsOfAURLWithAnAtInItsQuery(t *testing.T) {
	got := Secrets("redis://:pw@127.0.0.1:6379/0?client_name=app@prod")
	if !slices.Contains(got, "pw") {
		t.Errorf("Secrets = %q, lacks the password", got)
	}
	for _, part := range []string{"0", "client_name=app", "127.0.0.1:6379"} {
		if slices.Contains(got, part) {
			t.Errorf("Secrets = %q, holds %q", got, part)
		}
	}
}

func TestScrubLongestFirst(t *testing.T) {
	got := Scrub("a=abcdef b=abc", []string{"abc", "abcdef"})
	if got != "a=xxxxx b=xxxxx" {
		t.Errorf("Scrub = %q", got)
	}
}

func TestWrapNothingToScrub(t *testing.T) {
	if Wrap(nil, []string{"x"}) != nil {
		t.Error("Wrap(nil) is not nil")
	}
	if err := io.EOF; Wrap(err, nil) != err {
		t.Error("Wrap without secrets changed the error")
	}
	w := Wrap(io.EOF, []string{"x"})
	if Wrap(w, []string{"x"}) != w {
		t.Error("Wrap wrapped its own error twice")
	}
}
