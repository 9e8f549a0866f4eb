package opterr

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

func TestAnErrorNamesItsOptionsAndKeepsItsMessage(t *testing.T) {
	if New(nil, "ttl") != nil {
		t.Fatal("New(nil) is not nil")
	}
	cause := errors.New("redis storage: url and addresses are mutually exclusive")
	err := fmt.Errorf("loading: %w", New(cause, "url", "addresses"))
	if got := Options(err); !slices.Equal(got, []string{"url", "addresses"}) {
		t.Errorf("Options = %q, want url and addresses (through wrapping)", got)
	}
	if !errors.Is(err, cause) || err.Error() != "loading: "+cause.Error() {
		t.Errorf("error %q does not wrap %q unchanged", err, cause)
	}
	if got := Options(Errorf("ttl", "ttl must be at least %s", "1s")); !slices.Equal(got, []string{"ttl"}) {
		t.Errorf("Errorf: Options = %q", got)
	}
	if got := Options(cause); got != nil {
		t.Errorf("a plain error names %q", got)
	}
	if IsMissing(err) || !IsMissing(fmt.Errorf("x: %w", Missing("dsn", cause))) {
		t.Error("IsMissing tells a required option left out from other errors wrongly")
	}
}
