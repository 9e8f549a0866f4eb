// Package testutil holds what every test package of this module shares:
// waiting for a condition with a deadline, and the rule that CI never
// passes by skipping.
package testutil

import (
	"os"
	"testing"
	"time"
)

// pollEvery is how often Eventually looks again.
const pollEvery = 10 * time.Millisecond

// Eventually polls cond until it holds and fails the test, naming what it
// waited for, when it still does not after within. Call it from the test
// goroutine (it calls t.Fatalf).
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(pollEvery)
	}
}

// inCI reports whether this is a CI run (CI=true), where nothing a test
// needs may be missing.
func inCI() bool { return os.Getenv("CI") == "true" }

// Unavailable skips a test that cannot run or conclude here: a server that
// does not answer, a binary that is not installed, a machine too stalled
// for a timing check to mean anything. Under CI=true it fails the test
// instead: CI must never pass by skipping.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if inCI() {
		t.Fatalf(format+" (CI=true: failing instead of skipping)", args...)
	}
	t.Skipf(format, args...)
}
