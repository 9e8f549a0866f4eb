package cfargs

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/storage/opterr"
)

// readBlock parses input, a directive and its block, with EachOption:
// every option takes any arguments, or a block of its own; check sees the
// options read.
func readBlock(t *testing.T, input string, check func(opts map[string][]string) error) error {
	t.Helper()
	d := caddyfile.NewTestDispenser(input)
	d.Next()
	given := make(Given)
	if d.NextArg() {
		given.Add(d, "url")
	}
	opts := make(map[string][]string)
	checks := 0
	err := EachOption(d, "test ", given, func(opt string) error {
		opts[opt] = d.RemainingArgs()
		return EachOption(d, "", nil, func(string) error { return nil }, nil)
	}, func() error {
		checks++
		return check(opts)
	})
	if checks > 1 {
		t.Errorf("check ran %d times, want once per block", checks)
	}
	return err
}

func wantLine(t *testing.T, err error, line int, msg string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %q at Testfile:%d", msg, line)
	}
	if !regexp.MustCompile(fmt.Sprintf(`, at Testfile:%d$`, line)).MatchString(err.Error()) {
		t.Errorf("error %q is not at Testfile:%d", err, line)
	}
	if !strings.HasPrefix(err.Error(), msg) {
		t.Errorf("error %q does not start with %q", err, msg)
	}
}

func TestACheckErrorIsReportedAtTheLineOfItsOption(t *testing.T) {
	const block = "test {\n\tttl 1ns\n\tmethods POST\n\tlock 1s\n}"
	err := readBlock(t, block, func(opts map[string][]string) error {
		if opts["ttl"][0] == "1ns" {
			return opterr.Errorf("ttl", "ttl must be at least 1s, got 1ns")
		}
		return nil
	})
	wantLine(t, err, 2, "ttl must be at least 1s")
	var oe *opterr.Error
	if !errors.As(err, &oe) {
		t.Errorf("error %q no longer wraps the compile error", err)
	}
}

func TestARuleBetweenOptionsIsReportedAtTheLastOfThemGiven(t *testing.T) {
	both := func(map[string][]string) error {
		return opterr.New(errors.New("url and addresses are mutually exclusive"), "url", "addresses")
	}
	wantLine(t, readBlock(t, "test {\n\turl a\n\tttl 1s\n\taddresses b\n\tlock 1s\n}", both), 4, "url and addresses")
	wantLine(t, readBlock(t, "test {\n\taddresses b\n\tttl 1s\n\turl a\n\tlock 1s\n}", both), 4, "url and addresses")
	// An option given on the block's first line counts from there.
	wantLine(t, readBlock(t, "test a {\n\tttl 1s\n}", both), 1, "url and addresses")
	wantLine(t, readBlock(t, "test a {\n\taddresses b\n}", both), 2, "url and addresses")
	// One of them left out: the line of the other.
	needs := func(map[string][]string) error {
		return opterr.New(errors.New("master_name needs addresses"), "master_name", "addresses")
	}
	wantLine(t, readBlock(t, "test {\n\tmaster_name m\n\tttl 1s\n}", needs), 2, "master_name needs addresses")
}

func TestAnOptionWithABlockIsReportedWhereItsBlockEnds(t *testing.T) {
	err := readBlock(t, "test {\n\tfingerprint {\n\t\tignore x\n\t}\n\tttl 1s\n}", func(map[string][]string) error {
		return opterr.Errorf("fingerprint", "fingerprint ignore: must start with '/'")
	})
	wantLine(t, err, 4, "fingerprint ignore")
}

func TestARequiredOptionLeftOutIsLeftToProvision(t *testing.T) {
	err := readBlock(t, "test {\n\ttable t\n}", func(map[string][]string) error {
		return opterr.Missing("dsn", errors.New("postgres storage: dsn is required"))
	})
	if err != nil {
		t.Errorf("error %v about a required option the block leaves out", err)
	}
}

// TestAnErrorAboutAnOptionNotGivenIsStillReported: an option name that
// the parser never records (a compile naming a field the Caddyfile sets
// under another name) is reported at the end of the block, never dropped.
func TestAnErrorAboutAnOptionNotGivenIsStillReported(t *testing.T) {
	err := readBlock(t, "test {\n\tttl 1s\n}", func(map[string][]string) error {
		return opterr.Errorf("wait_timeout", "wait_timeout must be at least 10ms, got 1ms")
	})
	wantLine(t, err, 3, "wait_timeout must be at least 10ms")
}

// TestAnOptionThatSetsAnotherIsWhereErrorsAboutThatOneGo: in_flight wait
// <timeout> sets wait_timeout; an error about wait_timeout goes to its
// line, and wait_timeout on a line of its own is the parser's to judge.
func TestAnOptionThatSetsAnotherIsWhereErrorsAboutThatOneGo(t *testing.T) {
	read := func(input string, parse func(d *caddyfile.Dispenser, given Given, opt string) error) error {
		d := caddyfile.NewTestDispenser(input)
		d.Next()
		given := make(Given)
		return EachOption(d, "", given, func(opt string) error { return parse(d, given, opt) }, func() error {
			return opterr.Errorf("wait_timeout", "wait_timeout must be at least 10ms, got 1ms")
		})
	}
	inFlight := func(d *caddyfile.Dispenser, given Given, opt string) error {
		if opt == "in_flight" {
			d.NextArg()
			if d.NextArg() {
				given.Sets(d, "wait_timeout")
			}
		}
		d.RemainingArgs()
		return nil
	}
	wantLine(t, read("test {\n\tttl 1h\n\tin_flight wait 1ms\n\tmethods POST\n}", inFlight), 3, "wait_timeout must be at least")
	err := read("test {\n\tin_flight wait 1ms\n\twait_timeout 5s\n}", func(d *caddyfile.Dispenser, given Given, opt string) error {
		if opt == "wait_timeout" {
			return d.Err("wait_timeout is already given by in_flight wait <timeout>")
		}
		return inFlight(d, given, opt)
	})
	wantLine(t, err, 3, "wait_timeout is already given")
}

func TestAnErrorThatNamesNoOptionIsReportedAtTheEndOfTheBlock(t *testing.T) {
	err := readBlock(t, "test {\n\tttl 1s\n}", func(map[string][]string) error { return errors.New("broken") })
	wantLine(t, err, 3, "broken")
}

func TestTheFirstLineOptionIsADuplicateInTheBlock(t *testing.T) {
	err := readBlock(t, "test a {\n\turl b\n}", func(map[string][]string) error { return nil })
	wantLine(t, err, 2, "test url already specified")
}

func TestAnErrorInAnImportedSnippetKeepsItsImportChain(t *testing.T) {
	blocks, err := caddyfile.Parse("Testfile", []byte("(opts) {\n\tttl 1ns\n}\n:80 {\n\ttest {\n\t\timport opts\n\t}\n}\n"))
	if err != nil {
		t.Fatal(err)
	}
	d := caddyfile.NewDispenser(blocks[0].Segments[0])
	d.Next()
	err = EachOption(d, "test ", nil, func(string) error { d.RemainingArgs(); return nil }, func() error {
		return opterr.Errorf("ttl", "ttl must be at least 1s, got 1ns")
	})
	if err == nil || !strings.Contains(err.Error(), "import chain") || !strings.Contains(err.Error(), "Testfile:2") {
		t.Errorf("error %v: want it at Testfile:2 with its import chain", err)
	}
}

func TestSuggest(t *testing.T) {
	known := []string{"ttl", "lock_timeout", "methods", "header", "required", "in_flight", "wait_timeout", "max_key_length", "max_body_size"}
	for word, want := range map[string]string{
		"tll":            "ttl",          // a substitution
		"tl":             "ttl",          // a deletion
		"TTL":            "ttl",          // case
		"lock_timout":    "lock_timeout", // a letter missing
		"requierd":       "required",     // two letters swapped
		"in-flight":      "in_flight",
		"headers":        "header",
		"max_key_lenght": "max_key_length",
		"method":         "methods",
		"colour":         "", // far from any
		"x":              "", // too short to guess
		"timeout":        "", // as near to nothing known
		"max_size":       "", // two edits from none, more from both
	} {
		if got := Suggest(word, known); got != want {
			t.Errorf("Suggest(%q) = %q, want %q", word, got, want)
		}
	}
	// Two equally near: no guess.
	if got := Suggest("ab", []string{"ac", "ad"}); got != "" {
		t.Errorf("Suggest with a tie = %q, want none", got)
	}
}

func TestParseDurationShowsAnExample(t *testing.T) {
	for s, want := range map[string]string{
		"30":   "ttl: invalid duration '30': a duration needs a unit, such as 30s",
		"1.5":  "such as 1.5s",
		"soon": "ttl: invalid duration 'soon': ",
	} {
		if _, err := ParseDuration("ttl", s); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseDuration(%q): %v, want %q", s, err, want)
		}
	}
	if d, err := ParseDuration("ttl", "1d"); err != nil || d != 24*time.Hour {
		t.Errorf("ParseDuration(1d) = %v, %v", d, err)
	}
}
