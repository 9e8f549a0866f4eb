package main

import (
	"strings"
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// A run's failures are listed once each: a failed subtest (not its
// parent), a package that did not build, and a package whose binary died
// mid-test, whose running test's output is printed; a passing test's
// output is not.
func TestFailuresAreListedAndTheirOutputPrinted(t *testing.T) {
	events := strings.Join([]string{
		`{"Action":"output","Package":"m/a","Test":"TestOK","Output":"ok chatter\n"}`,
		`{"Action":"pass","Package":"m/a","Test":"TestOK"}`,
		`{"Action":"output","Package":"m/a","Test":"TestBad/sub","Output":"    bad_test.go:9: want 1, got 2\n"}`,
		`{"Action":"fail","Package":"m/a","Test":"TestBad/sub"}`,
		`{"Action":"fail","Package":"m/a","Test":"TestBad"}`,
		`{"Action":"output","Package":"m/a","Output":"FAIL\tm/a\t0.1s\n"}`,
		`{"Action":"fail","Package":"m/a"}`,
		`{"ImportPath":"m/b","Action":"build-output","Output":"b.go:3:1: syntax error\n"}`,
		`{"ImportPath":"m/b","Action":"build-fail"}`,
		`{"Action":"fail","Package":"m/b"}`,
		`{"Action":"output","Package":"m/c","Test":"TestHangs","Output":"panic: test timed out\n"}`,
		`{"Action":"fail","Package":"m/c"}`,
		`go: downloading example.com/x v1.0.0`,
	}, "\n")
	var out strings.Builder
	s := newSummary(&out)
	s.read(strings.NewReader(events))
	got := strings.Join(s.failed(), "\n")
	want := strings.Join([]string{
		"FAIL m/a TestBad/sub",
		"FAIL m/b (no test failed: the package did not build, timed out or crashed; its output is above)",
		"FAIL m/c (no test failed: the package did not build, timed out or crashed; its output is above)",
	}, "\n")
	if got != want {
		t.Errorf("failures:\n%s\nwant:\n%s", got, want)
	}
	for _, line := range []string{"want 1, got 2", "syntax error", "panic: test timed out", "go: downloading"} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("output lacks %q:\n%s", line, out.String())
		}
	}
	if strings.Contains(out.String(), "ok chatter") {
		t.Errorf("a passing test's output was printed:\n%s", out.String())
	}
}
